"""The read API's query parameters at their edges, and the OpenAPI document stating exactly those edges.

Every read route takes text, timestamps, durations, numbers and booleans from
the query (and ids from the path). Whatever arrives there is either answered
or refused with 400 ``{"error": "bad_parameter", "param", "reason"}`` — never
a 500 from the clock arithmetic, the database driver or a response header.
The OpenAPI document states the same bounds the server enforces: a walk over
its parameters sends a value just inside and just outside each bound, and a
bounded hypothesis run sends what the schema allows (answered) and what it
does not (refused, never a 500). These run on SQLite and, through bin/test,
on PostgreSQL, where a NUL in text is refused by the database itself.
"""
from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Optional
from urllib.parse import quote, urlencode

import pytest
from django.contrib.auth import get_user_model
from django.http import QueryDict
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from eventstore import api
from eventstore import questions as qs
from eventstore.questions import NodeScope
from eventstore_support import AT, ids, make_event, store
from tests.up_support import UpProcess, http_call, up_env

pytestmark = [pytest.mark.django_db(databases=["default", "events"])]

#: Valid local times whose UTC instant is past the end of Python's calendar: the year 9999
#: behind UTC, the year 1 ahead of it.
PAST_THE_END = "9999-12-31T23:59:59-23:59"
BEFORE_THE_START = "0001-01-01T00:00:00+14:00"
LIST_ROUTES = ["/api/events", "/api/turns", "/api/events/series"]
#: The eventstore's read operations, by the schema's operation id.
READ_OPERATIONS = {"events_list", "events_series", "turns_list", "events_get", "traces_get", "turns_get", "deliveries_get"}
TEXT_PARAMS = {
    "/api/events": ["type", "seat", "trace_id", "conversation_key", "partition_key", "node", "cursor", "category"],
    "/api/turns": ["seat", "trace_id", "conversation", "node", "cursor"],
    "/api/events/series": ["type", "seat", "trace_id", "conversation_key", "partition_key", "node", "window", "bucket"],
}


def get(api_client: Any, path: str, **params: Any) -> Any:
    query = urlencode(params, doseq=True, quote_via=quote)
    return api_client.get(f"{path}?{query}" if query else path)


def assert_refused(response: Any, param: str) -> dict[str, Any]:
    """A 400 in the one shape every read refusal has, naming ``param``."""
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "param", "reason"} and body["error"] == "bad_parameter", body
    assert body["param"] == param and body["reason"], body
    return body


def some_rows() -> None:
    t = AT - timedelta(hours=1)
    store(
        make_event("org_started", t, event_id="e1"),
        make_event("agent_turn_started", t + timedelta(minutes=1), event_id="e2", seat="ada", turn_id="t1"),
    )


# -- timestamps past the ends of the calendar ------------------------------------------------------


@pytest.mark.parametrize("route", LIST_ROUTES)
@pytest.mark.parametrize("param, value", [("since", PAST_THE_END), ("until", BEFORE_THE_START), ("since", BEFORE_THE_START), ("until", PAST_THE_END)])
def test_a_timestamp_whose_utc_instant_is_past_the_calendar_is_answered_not_a_500(
    api_client: Any, scope: NodeScope, route: str, param: str, value: str
) -> None:
    response = get(api_client, route, **{param: value})
    assert response.status_code == 200, response.content[:300]


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"since": PAST_THE_END}, []),
        ({"until": BEFORE_THE_START}, []),
        ({"since": BEFORE_THE_START}, ["e2", "e1"]),
        ({"until": PAST_THE_END}, ["e2", "e1"]),
        ({"since": BEFORE_THE_START, "until": PAST_THE_END}, ["e2", "e1"]),
    ],
)
def test_a_timestamp_past_either_end_of_the_calendar_stands_for_that_end(
    api_client: Any, scope: NodeScope, params: dict[str, str], expected: list[str]
) -> None:
    some_rows()
    response = get(api_client, "/api/events", **params)
    assert response.status_code == 200, response.content[:300]
    assert ids(response.json()["events"]) == expected
    turns = get(api_client, "/api/turns", **params).json()["turns"]
    assert [t["turn_id"] for t in turns] == (["t1"] if expected else [])


def test_since_past_the_end_and_until_before_the_start_is_since_after_until(api_client: Any, scope: NodeScope) -> None:
    assert_refused(get(api_client, "/api/events", since=PAST_THE_END, until=BEFORE_THE_START), "since")


@pytest.mark.parametrize("value", ["0000-01-01T00:00:00Z", "2025-02-30T00:00:00Z", "2025-01-01T24:00:00Z", "2025-01-01T00:00:00+24:00"])
def test_a_timestamp_no_calendar_holds_is_400_naming_it(api_client: Any, scope: NodeScope, value: str) -> None:
    assert_refused(get(api_client, "/api/events", since=value), "since")


# -- text the stores cannot compare ----------------------------------------------------------------


@pytest.mark.parametrize("route, param", [(r, p) for r, params in TEXT_PARAMS.items() for p in params])
@pytest.mark.parametrize("bad", ["D0\x00X", "\x00", "x" * (api.MAX_VALUE_LENGTH + 1)])
def test_a_nul_or_an_absurd_length_in_any_text_parameter_is_400_naming_it(
    api_client: Any, scope: NodeScope, route: str, param: str, bad: str
) -> None:
    """On PostgreSQL a NUL reached the driver (a 500); on SQLite it matched nothing (a 200)."""
    assert_refused(get(api_client, route, **{param: bad}), param)


@pytest.mark.parametrize("route, tag", [("/api/events", "e"), ("/api/turns", "t")])
def test_a_cursor_whose_key_holds_a_nul_is_400(api_client: Any, scope: NodeScope, route: str, tag: str) -> None:
    cursor = qs.encode_cursor(tag, AT, "turn\x00-1")
    assert_refused(get(api_client, route, cursor=cursor), "cursor")


@pytest.mark.parametrize("route, tag", [("/api/events", "e"), ("/api/turns", "t")])
@pytest.mark.parametrize("tamper", ["!", " ", "+", "="])
def test_a_cursor_with_characters_its_encoder_never_writes_is_400(
    api_client: Any, scope: NodeScope, route: str, tag: str, tamper: str
) -> None:
    """base64's decoder skips stray characters; a cursor is only what the read handed out."""
    good = qs.encode_cursor(tag, AT, "k1")
    assert get(api_client, route, cursor=good).status_code == 200
    assert_refused(get(api_client, route, cursor=good[:4] + tamper + good[4:]), "cursor")


def test_a_cursor_whose_instant_is_spelled_the_way_int_alone_would_take_is_400(api_client: Any, scope: NodeScope) -> None:
    import base64

    cursor = base64.urlsafe_b64encode(b"e|+1_741_600_000_000_000|k1").rstrip(b"=").decode()
    assert_refused(get(api_client, "/api/events", cursor=cursor), "cursor")


@pytest.mark.parametrize("route, param", [("/api/events/{}", "event_id"), ("/api/traces/{}", "trace_id"), ("/api/turns/{}", "turn_id")])
@pytest.mark.parametrize("bad", ["%00", "a%00b", "x" * (api.MAX_VALUE_LENGTH + 1)])
def test_a_nul_or_an_absurd_length_in_a_path_id_is_400_naming_it(
    api_client: Any, scope: NodeScope, route: str, param: str, bad: str
) -> None:
    assert_refused(api_client.get(route.format(bad)), param)


@pytest.mark.parametrize("param", ["seat", "node", "cursor", "since", "limit", "category"])
def test_a_lone_surrogate_in_any_parameter_is_refused_before_it_reaches_sql(scope: NodeScope, param: str) -> None:
    """A URL cannot carry one (Django decodes invalid UTF-8 to U+FFFD), but the pages call these functions too."""
    query = QueryDict(mutable=True)
    query[param] = "ada\ud800"
    with pytest.raises(api.BadParameter) as refused:
        api.events_page(query)
    assert refused.value.param == param and "surrogate" in refused.value.reason


def test_a_refusal_names_an_unknown_parameter_in_the_one_shape(api_client: Any, scope: NodeScope) -> None:
    assert_refused(get(api_client, "/api/turns", type="x"), "type")


# -- /api/schema/?version= -------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["\r\nSet-Cookie: a=b", "x\";filename=evil.html", "2", "", "1 "])
def test_a_schema_version_the_api_does_not_have_is_400_and_never_reaches_a_header(api_client: Any, version: str) -> None:
    response = api_client.get(f"/api/schema/?version={quote(version)}")
    body = assert_refused(response, "version")
    assert "1" in body["reason"]
    assert "Content-Disposition" not in response


@pytest.mark.parametrize("query, suffix", [("", "yaml"), ("?version=1", "yaml"), ("?format=json", "json"), ("?version=1&format=json", "json")])
def test_the_schema_is_served_under_a_filename_built_from_nothing_the_caller_sent(api_client: Any, query: str, suffix: str) -> None:
    response = api_client.get(f"/api/schema/{query}")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'inline; filename="Crewlet API.{suffix}"'
    if suffix == "json":
        assert response.json()["info"]["version"] == "1"


def test_the_schema_route_refuses_a_parameter_it_does_not_take(api_client: Any) -> None:
    assert_refused(api_client.get("/api/schema/?lang=%00"), "lang")


@pytest.mark.parametrize("fmt", ["zz", "%00", "html"])
def test_a_schema_format_the_route_cannot_render_is_400_naming_it(api_client: Any, fmt: str) -> None:
    body = assert_refused(api_client.get(f"/api/schema/?format={fmt}"), "format")
    assert "json" in body["reason"] and "yaml" in body["reason"]


# -- the schema states what the server enforces ----------------------------------------------------


@pytest.fixture
def document(api_client: Any) -> dict[str, Any]:
    response = api_client.get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def read_operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        operation = item.get("get")
        if operation and operation.get("operationId") in READ_OPERATIONS:
            yield path, operation


def _outside(schema: dict[str, Any], name: str) -> list[str]:
    """Values just outside each documented bound of ``schema``."""
    if schema.get("type") == "array":
        return _outside(schema["items"], name)
    out: list[str] = []
    if schema.get("type") == "integer":
        out += [str(schema["minimum"] - 1), str(schema["maximum"] + 1), "1.5", "ten"]
    if schema.get("type") == "boolean":
        out += ["maybe", "yes"]
    if "minLength" in schema:
        out.append("x" * (schema["minLength"] - 1))
    if "maxLength" in schema:
        out.append("x" * (schema["maxLength"] + 1))
    if "pattern" in schema:
        out += [v for v in ["\x00", "a\x00", " 1h", "1h ", "0h", "1w", "1000000d", "!", "a b", "+1"] if not re.search(schema["pattern"], v)]
    if "enum" in schema:
        out += [v for v in ["nope", "System", ""] if v not in schema["enum"]]
    if schema.get("format") == "date-time":
        out += ["2025-01-01", "2025-01-01T00:00:00", "2025-13-01T00:00:00Z", "yesterday"]
    return out


def _inside(schema: dict[str, Any], name: str, route: str) -> list[str]:
    """Values just inside each documented bound of ``schema``."""
    if schema.get("type") == "array":
        return _inside(schema["items"], name, route)
    if name == "cursor":  # opaque: inside is what a read hands out
        return [qs.encode_cursor("t" if "turns" in route else "e", AT, "k" * 700)]
    if schema.get("type") == "integer":
        return [str(schema["minimum"]), str(schema["maximum"])]
    if schema.get("type") == "boolean":
        return ["true", "false"]
    if "enum" in schema:
        return list(schema["enum"])
    if schema.get("format") == "date-time":
        return ["2025-01-01T00:00:00Z", "2025-01-01T00:00:00.123456789+05:30", PAST_THE_END, BEFORE_THE_START]
    if name == "window":
        return ["1h", "7d", "999999d"]
    if name == "bucket":
        return ["1m", "1h"]
    return ["x" * schema["minLength"], "x" * schema["maxLength"], "D0 X é ☃"]


def test_every_parameter_the_server_takes_is_in_the_schema_and_nothing_else(document: dict[str, Any]) -> None:
    by_operation = {op["operationId"]: {p["name"] for p in op.get("parameters", []) if p["in"] == "query"} for _, op in read_operations(document)}
    assert by_operation["events_list"] == api.EVENTS_PARAMS
    assert by_operation["turns_list"] == api.TURNS_PARAMS
    assert by_operation["events_series"] == api.SERIES_PARAMS
    assert by_operation["events_get"] == by_operation["traces_get"] == by_operation["turns_get"] == by_operation["deliveries_get"] == set()


def test_the_documented_limit_is_the_enforced_one(document: dict[str, Any]) -> None:
    (limit,) = [p for _, op in read_operations(document) if op["operationId"] == "events_list" for p in op["parameters"] if p["name"] == "limit"]
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": qs.MAX_LIMIT, "default": qs.DEFAULT_LIMIT}


def test_a_value_just_outside_each_documented_bound_is_400_and_one_just_inside_is_answered(
    api_client: Any, scope: NodeScope, document: dict[str, Any]
) -> None:
    checked = 0
    for path, operation in read_operations(document):
        for parameter in operation.get("parameters", []):
            name, schema = parameter["name"], parameter["schema"]
            outside, inside = _outside(schema, name), _inside(schema, name, path)
            assert outside and inside, f"{path} {name}: no documented bound to check ({schema})"
            for value in outside:
                if parameter["in"] == "path":
                    if value == "":  # an empty path segment is another route
                        continue
                    response = api_client.get(path.replace("{" + name + "}", quote(value, safe="")))
                else:
                    response = get(api_client, path, **{name: value})
                assert_refused(response, name)
                checked += 1
            for value in inside:
                if parameter["in"] == "path":
                    response = api_client.get(path.replace("{" + name + "}", quote(value, safe="")))
                    assert response.status_code == 404, (path, name, value, response.content[:300])
                else:
                    response = get(api_client, path, **{name: value})
                    assert response.status_code == 200, (path, name, value, response.content[:300])
                checked += 1
    assert checked > 100


# -- bounded property runs over the read API's parameters -----------------------------------------

#: Rules between two parameters that a per-parameter schema cannot state (each is in a description).
CROSS_PARAMETER = {("since", "must not be after until"), ("bucket", "must not be longer than the window")}
_FUZZ = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _query_strategy(document: dict[str, Any], operation_id: str, *, leave_out: frozenset[str] = frozenset()) -> tuple[str, Any]:
    """The route and a strategy of query dicts, each parameter optional and drawn from its own schema."""
    (path, operation), = [(p, op) for p, op in read_operations(document) if op["operationId"] == operation_id]
    optional = {
        p["name"]: from_schema(p["schema"]) for p in operation["parameters"] if p["in"] == "query" and p["name"] not in leave_out
    }
    return path, st.fixed_dictionaries({}, optional=optional)


@pytest.mark.parametrize("operation_id", ["events_list", "turns_list"])
def test_every_cursor_the_schemas_pattern_admits_is_answered_not_refused(
    api_client: Any, scope: NodeScope, document: dict[str, Any], operation_id: str
) -> None:
    """A client's generator knows no custom format: the pattern alone must tell a cursor (``0`` was refused)."""
    (path, operation), = [(p, op) for p, op in read_operations(document) if op["operationId"] == operation_id]
    (schema,) = [{k: v for k, v in p["schema"].items() if k != "format"} for p in operation["parameters"] if p["name"] == "cursor"]
    assert not re.fullmatch(schema["pattern"][1:-1], "0")

    @_FUZZ
    @given(from_schema(schema))
    def run(cursor: str) -> None:
        response = get(api_client, path, cursor=cursor)
        assert response.status_code == 200, (cursor, response.content[:300])

    run()


def _wire(params: dict[str, Any]) -> dict[str, Any]:
    return {k: ("true" if v is True else "false" if v is False else v) for k, v in params.items()}


@pytest.mark.parametrize("operation_id", ["events_list", "turns_list", "events_series"])
def test_whatever_the_schema_allows_is_answered(api_client: Any, scope: NodeScope, document: dict[str, Any], operation_id: str) -> None:
    """Positive examples drawn from the served schema itself; the opaque cursor is walked above instead."""
    path, queries = _query_strategy(document, operation_id, leave_out=frozenset({"cursor"}))

    sent: list[dict[str, Any]] = []

    @_FUZZ
    @given(queries)
    def run(params: dict[str, Any]) -> None:
        sent.append(params)
        response = get(api_client, path, **_wire(params))
        if response.status_code == 400:
            body = response.json()
            assert (body["param"], body["reason"]) in CROSS_PARAMETER, body
        else:
            assert response.status_code == 200, (params, response.content[:300])

    run()
    assert len(sent) >= 40 and any(len(p) >= 3 for p in sent)


_ANY_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from([PAST_THE_END, BEFORE_THE_START, "\x00", "%00", "\r\n", "-1", "0", "501", "99999999999999999999", "9999999d", "1e3", "x" * 1001]),
)


@pytest.mark.parametrize("path, names", [(r, [*api.EVENTS_PARAMS]) for r in ["/api/events"]] + [("/api/turns", [*api.TURNS_PARAMS]), ("/api/events/series", [*api.SERIES_PARAMS])])
def test_whatever_arrives_in_the_query_is_answered_or_refused_in_the_one_shape_never_a_500(
    api_client: Any, scope: NodeScope, path: str, names: list[str]
) -> None:
    sent: list[dict[str, str]] = []

    @_FUZZ
    @given(st.dictionaries(st.sampled_from([*names, "format", "limitt"]), _ANY_TEXT, max_size=4))
    def run(params: dict[str, str]) -> None:
        sent.append(params)
        response = get(api_client, path, **params)
        assert response.status_code in (200, 400), (params, response.status_code, response.content[:300])
        if response.status_code == 400:
            body = response.json()
            assert set(body) == {"error", "param", "reason"} and body["error"] == "bad_parameter", body

    run()
    assert len(sent) >= 40


# -- the dashboard's event log and trace page ------------------------------------------------------


@pytest.fixture
def staff() -> Client:
    c = Client()
    c.force_login(get_user_model().objects.create_user("grace-admin", password="pw", is_staff=True))
    return c


@pytest.mark.parametrize("query", ["seat=%00", "seat=ada%00", "seat=" + "x" * 1001])
def test_the_event_log_page_refuses_a_seat_no_store_can_compare_with_a_400_page(staff: Client, scope: NodeScope, query: str) -> None:
    response = staff.get(f"/events/?{query}")
    assert response.status_code == 400
    assert b"seat: " in response.content


@pytest.mark.parametrize("query", [f"since={quote(PAST_THE_END)}", f"until={quote(BEFORE_THE_START)}"])
def test_the_event_log_page_is_not_a_500_for_a_timestamp_past_the_calendar(staff: Client, scope: NodeScope, query: str) -> None:
    """The page takes no time filter: the parameter is not read, the page is the unfiltered log."""
    some_rows()
    response = staff.get(f"/events/?{query}")
    assert response.status_code == 200


def test_the_trace_page_refuses_a_trace_id_with_a_nul_with_a_400_page(staff: Client, scope: NodeScope) -> None:
    response = staff.get("/traces/ab%00cd/")
    assert response.status_code == 400
    assert b"trace_id: " in response.content


# -- through a real manage.py up --------------------------------------------------------------------

TOKEN = "params-test-operator-token-0123456789abcdef"


def _http(url: str) -> tuple[int, dict[str, str], bytes]:
    return http_call("GET", url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout_s=30)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_up_answers_timestamps_past_the_calendar_and_refuses_a_forged_schema_version(tmp_path: Path) -> None:
    with UpProcess(tmp_path, "--data-dir", str(tmp_path / "data"), node="p1", env=up_env(CREWLET_OPERATOR_TOKEN=TOKEN)) as up:
        url = up.url + "/"
        for route in LIST_ROUTES:
            for param, value in (("since", PAST_THE_END), ("until", BEFORE_THE_START)):
                status, _, body = _http(f"{url}{route.lstrip('/')}?{param}={quote(value)}")
                assert status == 200, (route, param, body[:300])

        status, _, body = _http(f"{url}api/events?seat=%00")
        assert status == 400 and json.loads(body) == {"error": "bad_parameter", "param": "seat", "reason": "must not contain a NUL character"}

        for version in ("%0d%0aSet-Cookie:%20a=b", "x%22;filename=evil.html"):
            status, headers, body = _http(f"{url}api/schema/?version={version}")
            assert status == 400, body[:300]
            assert json.loads(body)["param"] == "version"
            assert "Content-Disposition" not in headers and "Set-Cookie" not in headers

        status, headers, body = _http(f"{url}api/schema/?version=1")
        assert status == 200 and headers["Content-Disposition"] == 'inline; filename="Crewlet API.yaml"'

        text = up.output_so_far()
        assert "Internal Server Error" not in text and "Traceback" not in text, text
        assert up.terminate() == 0, up.stop()
