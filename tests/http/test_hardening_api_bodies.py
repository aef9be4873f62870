"""JSON request bodies: only a storable, depth-limited JSON object reaches a view; every 400 has one shape."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
from rest_framework.test import APIClient

from a2a.models import Channel
from crewlet.http.bodies import MAX_DEPTH, BodyRefused, parse_object
from crewlet.base.jsontext import nesting_depth
from seats.delivery_models import SeatPause
from crewlet.base.tokens import OperatorToken
from tests.engine.test_request_bridge import Up
from tests.up_support import serve

#: Every route that takes a JSON body, with a body it would accept.
JSON_ROUTES = [
    ("/api/seats/ada/pause", {"reason": "x"}),
    ("/api/seats/ada/resume", {}),
    ("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "hi"}),
    ("/operator/act", {"tool": "dead_letter_replay", "args": {"ref": "1"}}),
]
DEEP = b'{"a":' * 5000 + b"1" + b"}" * 5000
#: (what it is, the raw body, a phrase the reason says)
BAD_BODIES = [
    ("a JSON array", b"[]", "must be a JSON object"),
    ("a JSON string", b'"pause"', "must be a JSON object"),
    ("null", b"null", "must be a JSON object"),
    ("not JSON", b"{reason: x}", "not valid JSON"),
    ("not UTF-8", b'{"reason": "\xff\xfe"}', "not UTF-8"),
    ("a lone surrogate", b'{"request_id": "\\ud800", "reason": "\\ud800"}', "lone surrogate"),
    ("a NUL", b'{"reason": "a\\u0000b", "request_id": "a\\u0000b"}', "NUL"),
    ("NaN", b'{"reason": NaN}', "not a JSON number"),
    ("a 5,000-level nest", DEEP, "nests deeper"),
]


def _one_shape(body: Any) -> None:
    assert isinstance(body, dict) and set(body) == {"error", "param", "reason"}, body
    assert all(isinstance(v, str) and v for v in body.values()), body


@pytest.fixture
def client(db: Any) -> APIClient:
    _, token = OperatorToken.mint("bodies")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


# -- the parser -----------------------------------------------------------------------------


def test_the_nesting_scan_counts_brackets_but_not_brackets_inside_strings() -> None:
    assert nesting_depth(b'{"a": [1, {"b": "[[[{{{"}], "c": "\\"]]]"}') == 3
    assert nesting_depth(DEEP) == 5000
    assert nesting_depth(DEEP, stop_above=MAX_DEPTH) == MAX_DEPTH + 1


def test_a_body_at_the_depth_limit_is_read_and_one_past_it_is_refused() -> None:
    at = b'{"a":' * MAX_DEPTH + b"1" + b"}" * MAX_DEPTH
    assert parse_object(at)["a"]
    with pytest.raises(BodyRefused, match="nests deeper"):
        parse_object(b"[" + at + b"]")


def test_a_refused_string_is_named_by_its_path_in_the_body() -> None:
    with pytest.raises(BodyRefused) as refused:
        parse_object(b'{"args": {"refs": ["ok", "\\udfff"]}}')
    assert refused.value.param == "args.refs[1]"


def test_a_pair_of_surrogates_that_is_one_character_is_accepted() -> None:
    assert parse_object(b'{"brief": "\\ud83d\\ude00"}') == {"brief": "\U0001f600"}


# -- every JSON route, in process ------------------------------------------------------------


@pytest.mark.django_db(databases=["default", "events"])
@pytest.mark.parametrize("route", [r for r, _ in JSON_ROUTES])
@pytest.mark.parametrize("what,raw,says", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_a_body_that_is_not_a_storable_json_object_is_400_with_the_reason_on_every_json_route(
    client: APIClient, route: str, what: str, raw: bytes, says: str
) -> None:
    response = client.generic("POST", route, raw, content_type="application/json")
    assert response.status_code == 400, (what, response.content)
    _one_shape(response.json())
    assert says in response.json()["reason"], response.json()
    assert not SeatPause.objects.exists() and not Channel.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
@pytest.mark.parametrize(
    "route,body,param",
    [
        ("/api/seats/ada/pause", {"stop_running": "true"}, "stop_running"),
        ("/api/seats/ada/pause", {"stop_running": 1}, "stop_running"),
        ("/api/seats/ada/pause", {"reason": 5}, "reason"),
        ("/api/seats/ada/pause", {"reason": "x" * 2001}, "reason"),
        ("/api/a2a/ask", {"from": "Ada", "to": "linus", "brief": "hi"}, "from"),
        ("/api/a2a/ask", {"from": "ada", "to": "linus\n", "brief": "hi"}, "to"),
        ("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "   "}, "brief"),
        ("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": 7}, "brief"),
        ("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "hi", "request_id": "has space"}, "request_id"),
        ("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "hi", "request_id": "r" * 201}, "request_id"),
        ("/api/a2a/ask", {"to": "linus", "brief": "hi"}, "from"),
        ("/operator/act", {"tool": "dead_letter_replay", "args": {"ref": "1"}, "request_id": 5}, "request_id"),
        ("/operator/act", {"tool": "dead_letter_replay", "args": {"ref": "1"}, "request_id": "r" * 201}, "request_id"),
        ("/operator/act", {"tool": "dead_letter_replay", "args": {"ref": "  "}}, "args.ref"),
        ("/operator/act", {"tool": "drop_tables", "args": {"ref": "1"}}, "tool"),
    ],
)
def test_a_field_the_schema_refuses_is_400_naming_that_field_in_the_one_shape(
    client: APIClient, route: str, body: dict[str, Any], param: str
) -> None:
    response = client.post(route, body, format="json")
    assert response.status_code == 400, response.content
    _one_shape(response.json())
    assert response.json()["param"] == param
    assert not SeatPause.objects.exists() and not Channel.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
def test_the_schema_states_the_body_constraints_the_server_enforces(client: APIClient) -> None:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    parts = schema["components"]["schemas"]
    pause, ask, act, args = parts["PauseRequest"], parts["Ask"], parts["ActRequest"], parts["ReplayArgs"]
    assert pause["properties"]["stop_running"]["type"] == "boolean"
    text, blank = pause["properties"]["reason"]["oneOf"]  # allow_blank: the text's bounds, or ""
    assert text["maxLength"] == 2000 and re.fullmatch(text["pattern"], "a\x00b") is None and blank["maxLength"] == 0
    for name in ("from", "to"):
        assert ask["properties"][name]["pattern"] == "^(?:[a-z0-9][a-z0-9_-]{0,62})$"
        assert ask["properties"][name]["minLength"] == 1
    assert ask["properties"]["brief"]["minLength"] == 1 and "pattern" in ask["properties"]["brief"]
    assert ask["properties"]["request_id"]["maxLength"] == 200
    assert sorted(ask["required"]) == ["brief", "from", "to"]
    assert act["properties"]["request_id"]["oneOf"][0]["maxLength"] == 200
    assert args["properties"]["ref"]["minLength"] == 1
    assert args["properties"]["ref"]["pattern"] == "^(?:\\s*[0-9]+\\s*)$"
    assert all(body["additionalProperties"] is False for body in (pause, ask, act, args)), "unknown fields are refused"
    bad = parts["Error"]
    assert sorted(bad["required"]) == ["error", "param", "reason"]
    for path, method in (("/api/seats/{handle}/pause", "post"), ("/api/a2a/ask", "post"), ("/operator/act", "post")):
        assert schema["paths"][path][method]["responses"]["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }


# -- through manage.py up ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from serve(Up(tmp_path_factory.mktemp("bodies")))


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_inside_up_a_json_array_does_not_pause_a_seat_and_deep_or_surrogate_bodies_are_400_not_500(up: Up) -> None:
    status, body = up.request("POST", "/api/seats/ada/pause", b"[]")
    assert status == 400 and body["param"] == "body" and "JSON object" in body["reason"], body
    status, seats = up.request("GET", "/api/seats/")
    assert status == 200 and {s["handle"]: s["paused"] for s in seats["seats"]}["ada"] is False

    for route, _ in JSON_ROUTES:
        status, body = up.request("POST", route, DEEP)
        assert status == 400, (route, body)
        _one_shape(body)
    status, body = up.request(
        "POST", "/operator/act", b'{"tool": "dead_letter_replay", "args": {"ref": "1"}, "request_id": "\\ud800"}'
    )
    assert status == 400 and body["param"] == "request_id" and "surrogate" in body["reason"], body
    status, body = up.request("POST", "/api/a2a/ask", b'{"from": "ada", "to": "linus", "brief": "\\ud800"}')
    assert status == 400 and body["param"] == "brief", body
    status, channels = up.request("GET", "/api/a2a/channels")
    assert status == 200 and channels["channels"] == []
