"""The API's documentation pages, its one error shape, and schemathesis against the schema it serves.

Everything here runs against one real ``manage.py up`` (SQLite, the embedded
broker) with an operator token: Swagger UI and Redoc are served with their
files from the node itself, every ``/api/`` error — a refused parameter, a
serializer's field, an unknown path, a method the route has not, missing
credentials — is ``{"error", "param", "reason"}`` and the schema declares it
for every operation, and schemathesis, walking the served schema with a
bounded number of examples per operation, finds no failure of any check.
"""
from __future__ import annotations

import json
import os
import re
import string
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import schemathesis
from openapi_spec_validator import OpenAPIV30SpecValidator
from schemathesis import GenerationMode
from django.contrib.auth import get_user_model
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from eventstore import api
from eventstore import questions as qs
from tests.up_support import UpProcess, http_call, serve, up_env

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "api-docs-test-operator-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: The browser app's origin the module's ``up`` allows (CREWLET_CORS_ALLOWED_ORIGINS).
APP_ORIGIN = "http://app.example:3000"
#: The keys of every error answer.
ERROR_KEYS = {"error", "param", "reason"}
#: Examples per operation and phase: enough to cross every declared bound, few enough for a bounded run.
EXAMPLES_PER_OPERATION = 6
#: A cursor's instant: 1970 to 2100, inside every calendar the server converts it with.
CURSOR_US = st.integers(min_value=0, max_value=4_102_444_800_000_000)
CURSOR_KEY = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=40)

# The schema states each read's cursor as a format of its own (another read's cursor is refused): the
# generator makes cursors of that format, as a client holding a previous page's next_cursor has.
for _tag in (qs.EVENTS_CURSOR, qs.TURNS_CURSOR):
    schemathesis.openapi.format(qs.cursor_format(_tag), st.builds(qs.encode_cursor, st.just(_tag), CURSOR_US, CURSOR_KEY))


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp: Path = tmp_path_factory.mktemp("api-docs")
    env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_VAR_DIR=str(tmp / "var"), CREWLET_CORS_ALLOWED_ORIGINS=APP_ORIGIN)
    yield from serve(UpProcess(tmp, node="docs1", env=env))


def _get(up: UpProcess, path: str, headers: dict[str, str] = AUTH, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    return http_call(method, up.url + path, headers=headers)


def _error(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert headers["Content-Type"].startswith("application/json"), (status, headers, body[:200])
    answer = json.loads(body)
    assert ERROR_KEYS <= set(answer) and all(isinstance(answer[k], str) for k in ERROR_KEYS), answer
    assert answer["error"] and answer["reason"], answer
    return answer


# -- the documentation pages --------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_are_served_with_their_files_from_the_node_itself(up: UpProcess, page: str) -> None:
    status, headers, body = _get(up, page)
    assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, body[:300])
    html = body.decode()
    assert "/api/schema/" in html, "the page reads this node's schema"
    assets = re.findall(r'(?:src|href)="(/static/drf_spectacular_sidecar/[^"]+)"', html)
    assert any(a.endswith(".js") for a in assets), html[:2000]
    assert not re.search(r'(?:src|href)="https?://', html), "nothing is fetched from a CDN"
    for asset in assets:
        asset_status, _, content = _get(up, asset, headers={})
        assert asset_status == 200 and content, asset


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_take_the_schemas_credentials_and_refuse_none_with_a_json_401(up: UpProcess, page: str) -> None:
    status, headers, body = _get(up, page, headers={})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert _error(status, headers, body)["error"] == "not_authenticated"


@pytest.mark.django_db(databases=["default", "events"])
def test_the_dashboard_links_the_api_docs_which_a_staff_session_opens() -> None:
    staff = get_user_model().objects.create_user("docs-staff", password="pw-docs-staff-1", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert 'href="/api/docs/"' in client.get("/events/").content.decode()
    assert client.get("/api/docs/").status_code == 200


# -- one error shape ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path, headers, status, error, param",
    [
        ("GET", "/api/no-such-route", AUTH, 404, "not_found", "path"),
        ("GET", "/api/events/", AUTH, 404, "not_found", "path"),
        ("GET", "/api/events/no-such-event", AUTH, 404, "not_found", "event_id"),
        ("DELETE", "/api/events", AUTH, 405, "method_not_allowed", "method"),
        ("GET", "/api/events", {}, 401, "not_authenticated", ""),
        ("GET", "/api/events", {"Authorization": "Bearer not-a-known-token-at-all"}, 401, "authentication_failed", ""),
        ("GET", "/api/events?limit=0", AUTH, 400, "bad_parameter", "limit"),
        ("GET", "/api/events", {**AUTH, "Accept": "text/csv"}, 406, "not_acceptable", "Accept"),
        ("GET", "/api/dead-letters?limit=1001", AUTH, 400, "bad_parameter", "limit"),
    ],
)
def test_every_api_error_is_json_in_the_one_shape(
    up: UpProcess, method: str, path: str, headers: dict[str, str], status: int, error: str, param: str
) -> None:
    got, answer_headers, body = _get(up, path, headers=headers, method=method)
    assert got == status, (got, body[:300])
    answer = _error(got, answer_headers, body)
    assert (answer["error"], answer["param"]) == (error, param), answer


def test_a_serializers_field_errors_are_the_one_shape_naming_the_field(up: UpProcess) -> None:
    """DRF's own ``{"field": ["..."]}`` never reaches the wire: the first refused field, dotted, and why."""
    status, headers, body = http_call(
        "POST", up.url + "/api/seats/ada/pause", json.dumps({"stop_running": "sometimes"}).encode(),
        {**AUTH, "Content-Type": "application/json"},
    )
    assert status == 400
    assert _error(status, headers, body) == {"error": "bad_parameter", "param": "stop_running", "reason": "Must be a valid boolean."}
    status, headers, body = http_call(
        "POST", up.url + "/api/a2a/ask", b"{}", {**AUTH, "Content-Type": "application/json"}
    )
    assert status == 400 and _error(status, headers, body)["param"] in {"from", "to", "brief"}


def test_every_operation_declares_its_error_answers_in_the_one_shape(up: UpProcess) -> None:
    status, _, body = _get(up, "/api/schema/?format=json")
    assert status == 200
    schema = json.loads(body)
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == ERROR_KEYS
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            codes = {code for code in operation["responses"] if code.startswith(("4", "5"))}
            assert {"400", "401", "406"} <= codes, (method, path, codes)
            for code in codes:
                ref = operation["responses"][code]["content"]["application/json"]["schema"]["$ref"]
                declared = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
                assert ERROR_KEYS <= set(declared["properties"]), (method, path, code, ref)


def test_the_served_schema_is_a_valid_openapi_document(up: UpProcess) -> None:
    """openapi-spec-validator's verdict: a default must satisfy its own schema (``''`` broke its pattern)."""
    schema = json.loads(_get(up, "/api/schema/?format=json")[2])
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in OpenAPIV30SpecValidator(schema).iter_errors()]
    assert schema["openapi"].startswith("3.0.") and not errors, errors


def test_the_schema_states_the_bounds_the_server_enforces_on_dead_letters_and_request_bodies(up: UpProcess) -> None:
    schema = json.loads(_get(up, "/api/schema/?format=json")[2])
    (limit,) = [p for p in schema["paths"]["/api/dead-letters"]["get"]["parameters"] if p["name"] == "limit"]
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 1000)
    components = schema["components"]["schemas"]
    for body in ("PauseRequest", "Ask", "ActRequest", "ReplayArgs"):
        assert components[body]["additionalProperties"] is False, body


# -- CORS ------------------------------------------------------------------------------------------------------


def test_a_browser_app_on_an_allowed_origin_passes_the_preflight_and_reads_the_api_with_its_token(up: UpProcess) -> None:
    preflight = {"Origin": APP_ORIGIN, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"}
    status, headers, _ = _get(up, "/api/events", headers=preflight, method="OPTIONS")
    assert status == 200 and headers["Access-Control-Allow-Origin"] == APP_ORIGIN, (status, headers)
    assert "authorization" in headers["Access-Control-Allow-Headers"] and "GET" in headers["Access-Control-Allow-Methods"]
    assert "Access-Control-Allow-Credentials" not in headers  # the token is the credential, never the session cookie
    status, headers, _ = _get(up, "/api/events?limit=1", headers={**AUTH, "Origin": APP_ORIGIN})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == APP_ORIGIN
    status, headers, _ = _get(up, "/api/events?limit=1", headers={**AUTH, "Origin": "http://elsewhere.example"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = _get(up, "/api/events", headers={**preflight, "Origin": "http://elsewhere.example"}, method="OPTIONS")
    assert "Access-Control-Allow-Origin" not in headers


def test_an_allowed_origin_that_is_no_origin_stops_start_up_in_one_line_naming_the_variable() -> None:
    env = {**os.environ, "CREWLET_CORS_ALLOWED_ORIGINS": "https://app.example.com/dashboard"}
    done = subprocess.run([sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "CREWLET_CORS_ALLOWED_ORIGINS='https://app.example.com/dashboard': must be origins like https://app.example.com, separated by commas"
    )


# -- schemathesis --------------------------------------------------------------------------------------------


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("z", "Z")).astimezone(timezone.utc)


def within_the_cross_parameter_rules(case: Any) -> bool:
    """Whether a schema-valid case also keeps the rules between two parameters (each stated in its description).

    A per-parameter schema cannot state them — ``since`` not after ``until``,
    a ``bucket`` not longer than the ``window`` —
    so a positive case breaking one is not sent: the server's 400 for it is
    its documented answer (tests/http/test_hardening_api_params.py holds the same
    set). Worked out here from the values, not by asking the server.
    """
    query = case.query or {}
    if "since" in query and "until" in query and _instant(query["since"]) > _instant(query["until"]):
        return False
    ages = query if "older_than" in query else ((case.body or {}).get("filter") if isinstance(case.body, dict) else None) or {}
    if isinstance(ages, dict) and "older_than" in ages and "newer_than" in ages:
        if qs.parse_duration(ages["older_than"]) > qs.parse_duration(ages["newer_than"]):
            return False  # a dead-letter filter's older_than longer than its newer_than matches nothing: refused
    if case.operation.path == "/api/events/series":
        window = qs.parse_duration(query.get("window", api.DEFAULT_WINDOW))
        return qs.parse_duration(query.get("bucket", api.DEFAULT_BUCKET)) <= window
    return True


def _run(operation: Any, mode: GenerationMode) -> list[str]:
    """Up to EXAMPLES_PER_OPERATION cases of ``operation`` in ``mode``, each sent and checked; what failed, unshrunk."""
    failures: list[str] = []
    cases = operation.as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE:
        cases = cases.filter(within_the_cross_parameter_rules)

    @given(case=cases)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        case.call_and_validate(headers=AUTH)

    try:
        check()
    except BaseException as exc:  # a check's failure group, raised by call_and_validate with the request to reproduce it
        failures.append(f"{operation.label} ({mode.value}): {exc}")
    return failures


@pytest.mark.timeout(300)
def test_schemathesis_finds_no_failure_of_any_check_against_the_served_schema(up: UpProcess) -> None:
    """Every operation of the served schema, schema-valid and schema-invalid cases, every built-in check.

    The cases are derandomized, so a failure reproduces; no case is shrunk, so
    a failing run stays as short as a passing one.
    """
    schema = schemathesis.openapi.from_url(f"{up.url}/api/schema/?format=json", headers=AUTH, timeout=60)
    # POST /backup writes a copy of the node wherever its body says: a fuzzer must not choose where on this
    # machine's disk (its refusals and its copy are tests/eventstore/test_backup_up.py's).
    operations = [op for op in (result.ok() for result in schema.get_all_operations()) if op.label != "POST /backup"]
    assert len(operations) >= 14, [op.label for op in operations]
    failures = [f for op in operations for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) for f in _run(op, mode)]
    assert not failures, "\n\n".join(failures)
