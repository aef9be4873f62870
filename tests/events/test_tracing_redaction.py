"""No credential in a request's query reaches an exported span: in process (an SDK exporter) and from ``manage.py up`` (OTLP).

The OpenTelemetry ASGI instrumentation copies the request's query into the
server span (``http.url``; ``url.query`` under the stable conventions), so a
Jira or Confluence webhook's ``?secret=`` or an API call's ``?token=`` would be
sent to the collector as it was sent to us. Here the spans are read where they
are exported — the SDK's in-memory exporter behind the process's own provider,
and an OTLP/HTTP receiver that ``up`` exports to — never off the live span.
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Any, Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.engine.test_operability import Receiver
from tests.up_support import UpProcess, http_call, serve, up_env
from waiting_support import wait_until

JIRA_SECRET = "jira-query-secret-7f3a9c"
#: A secret whose value holds an encoded '&': decoded, its tail would pass for a parameter of its own.
SPLIT_SECRET_HEAD, SPLIT_SECRET_TAIL = "conf-head-41bd", "conf-tail-93ce"
TOKEN_VALUES = {
    "token": "query-token-value-51d2e8",
    "Signature": "query-signature-value-c4",
    "api_key": "query-api-key-value-77",
    "access_token": "query-access-token-value-3a",
    "KEY": "query-key-value-0f",
    "sig": "query-sig-value-9e",
    "password": "query-password-value-12",
}
SECRETS = (JIRA_SECRET, SPLIT_SECRET_HEAD, SPLIT_SECRET_TAIL, *TOKEN_VALUES.values())
QUERY = "&".join(
    [f"secret={JIRA_SECRET}", "page=2", f"%73ecret={SPLIT_SECRET_HEAD}%26{SPLIT_SECRET_TAIL}", *(f"{k}={v}" for k, v in TOKEN_VALUES.items())]
)
OPERATOR_TOKEN = "tracing-redaction-operator-token-0123456789"
SERVICE_NAME = "crewlet-tracing-redaction-test"
WAIT_S = 60.0


def _no_secret_in(spans: Any) -> None:
    text = repr(spans)
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"{leaked} reached an exported span: {text}"


# -- in process: the ASGI application the web server runs, its spans from the SDK's exporter ------------------


@pytest.fixture(scope="module")
def exported() -> Iterator[InMemorySpanExporter]:
    """Every span the process's provider ends from here on, as its exporters get them (the batch one included)."""
    from crewlet.events.tracing import configure_tracing

    exporter = InMemorySpanExporter()
    configure_tracing().add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the processor stays on the provider; a shut exporter keeps nothing more


async def _asgi_get(app: Any, path: str, query: str) -> int:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"localhost")], "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
    }
    requested = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected until the answer is sent
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])


def test_a_webhooks_query_secret_and_tokens_never_reach_the_exported_server_span_of_the_asgi_app(
    exported: InMemorySpanExporter,
) -> None:
    from crewlet.asgi import application

    exported.clear()
    asyncio.run(_asgi_get(application, "/webhooks/jira", QUERY))
    (server,) = [span for span in exported.get_finished_spans() if span.name.startswith("GET")]
    attributes = dict(server.attributes or {})
    _no_secret_in(attributes)
    assert "http.url" not in attributes  # the stable conventions by default: the query is url.query
    query = attributes["url.query"]
    assert query.startswith("secret=[redacted]&page=2&%73ecret=[redacted]&token=[redacted]"), query
    for name in TOKEN_VALUES:
        assert f"{name}=[redacted]" in query


def test_the_hook_rewrites_the_stable_conventions_url_attributes_from_the_raw_query_too() -> None:
    from crewlet.asgi import redact_query_attributes

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    decoded = QUERY.replace("%73ecret", "secret").replace("%26", "&")  # what the instrumentation writes into URLs
    span = provider.get_tracer("test").start_span(
        "GET /webhooks/confluence",
        attributes={
            "url.full": f"https://crewlet.example.com/webhooks/confluence?{decoded}",
            "url.query": QUERY,
            "url.path": "/webhooks/confluence",
            "http.target": f"/webhooks/confluence?{decoded}",
        },
    )
    redact_query_attributes(span, {"query_string": QUERY.encode()})
    span.end()
    (ended,) = exporter.get_finished_spans()
    attributes = dict(ended.attributes or {})
    _no_secret_in(attributes)
    assert attributes["url.query"].startswith("secret=[redacted]&page=2&%73ecret=[redacted]&token=[redacted]")
    assert attributes["url.full"] == f"https://crewlet.example.com/webhooks/confluence?{attributes['url.query']}"
    assert attributes["http.target"] == f"/webhooks/confluence?{attributes['url.query']}"
    assert attributes["url.path"] == "/webhooks/confluence"
    provider.shutdown()


# -- manage.py up, exporting over OTLP/HTTP to a receiver this module runs -----------------------------------


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("tracing-redaction")
    env = up_env(
        CREWLET_VAR_DIR=str(tmp / "data"),
        CREWLET_OPERATOR_TOKEN=OPERATOR_TOKEN,
        OTEL_SERVICE_NAME=SERVICE_NAME,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        # Both the old and the stable HTTP conventions: http.url and url.query on one span.
        OTEL_SEMCONV_STABILITY_OPT_IN="http/dup",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    yield from serve(UpProcess(tmp, node="tr1", env=env))


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_webhooks_query_secret_and_an_api_calls_token_never_reach_the_otlp_collector_from_up(
    up: UpProcess, receiver: Receiver
) -> None:
    trace_ids = [uuid.uuid4().hex for _ in range(2)]
    status, _, _ = http_call(
        "POST", f"{up.url}/webhooks/jira?{QUERY}", b"{not json",
        {"Content-Type": "application/json", "traceparent": f"00-{trace_ids[0]}-{uuid.uuid4().hex[:16]}-01"},
    )
    assert status == 400
    status, _, body = http_call(
        "GET", f"{up.url}/api/events?{QUERY}",
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}", "traceparent": f"00-{trace_ids[1]}-{uuid.uuid4().hex[:16]}-01"},
    )
    assert status in (200, 400), body

    def servers() -> list[dict[str, Any]]:
        found = [span for trace_id in trace_ids for span in receiver.of_trace(trace_id) if span["kind"] == 2]
        return found if len(found) == 2 else []

    spans = wait_until(servers, WAIT_S, "both requests' server spans at the collector")
    _no_secret_in(receiver.of_service(SERVICE_NAME))
    for span in spans:
        attributes = span["attributes"]
        assert attributes["url.query"].startswith("secret=[redacted]&page=2&%73ecret=[redacted]&token=[redacted]"), attributes
        assert attributes["http.url"].endswith("?" + attributes["url.query"]), attributes
    assert {span["attributes"]["http.route"] for span in spans} == {"/webhooks/jira", "/api/events"}
