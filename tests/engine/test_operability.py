"""What an operator's own tools meet at a real ``manage.py up``: ``/metrics``, ``/livez``, ``/readyz`` and OTLP traces.

One ``up`` serves the whole module (its broker, its stores), exporting its
spans to an OTLP/HTTP receiver this module runs. Its batch processor is told
to wait ten minutes between exports, so the spans reach the receiver only
through the flush of a clean stop: the tracing test, last, stops ``up``. The
frozen-broker test thaws the broker before it ends.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.process_support import REPO_ROOT
from tests.up_support import UpProcess, http_call, serve, up_env
from waiting_support import wait_until

pytestmark = pytest.mark.integration

TOKEN = "operability-operator-token-0123456789abcdef"
SCRAPE_TOKEN = "operability-scrape-token-0123456789abcdef"
SERVICE_NAME = "crewlet-operability-test"
NODE = "ops1"
#: A condition the test waits for is expected well within this.
WAIT_S = 60.0


# -- an OTLP/HTTP receiver ---------------------------------------------------------------


class Receiver:
    """A collector's OTLP/HTTP traces endpoint: decodes each export with opentelemetry-proto and keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.keep(self.path, request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def keep(self, path: str, request: Any) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "path": path,
                            "resource": resource,
                            "name": span.name,
                            "kind": span.kind,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                        }
                    )
        with self._lock:
            self.spans.extend(found)

    def of_service(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [span for span in self.spans if span["resource"].get("service.name") == name]

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [span for span in self.spans if span["trace_id"] == trace_id]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


def _observed_up(tmp: Path, receiver: Receiver) -> UpProcess:
    """``up`` exporting its spans to ``receiver`` (held until it stops), with a scrape token and a short broker probe."""
    env = up_env(
        CREWLET_VAR_DIR=str(tmp / "data"),
        CREWLET_OPERATOR_TOKEN=TOKEN,
        CREWLET_METRICS_TOKEN=SCRAPE_TOKEN,
        CREWLET_HEALTH_BROKER_TIMEOUT_S="0.5",
        OTEL_SERVICE_NAME=SERVICE_NAME,
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=operability-test",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_PYTHON_ASGI_EXCLUDED_URLS="livez",
        OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST="authorization,content-type",
        OTEL_BSP_SCHEDULE_DELAY="600000",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4096",
        OTEL_BSP_MAX_QUEUE_SIZE="16384",
    )
    return UpProcess(tmp, node=NODE, env=env)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[UpProcess]:
    yield from serve(_observed_up(tmp_path_factory.mktemp("operability"), receiver))


# -- helpers --------------------------------------------------------------------------------


def _slack_message(text: str) -> bytes:
    """A direct message to ada from grace (the example company's seats), a new one each time."""
    event_id = f"Ev{uuid.uuid4().hex[:12]}"
    return json.dumps(
        {
            "type": "event_callback",
            "event_id": event_id,
            "event": {
                "type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE",
                "text": f"<@U0ADA> {text}", "ts": f"1718000000.{uuid.uuid4().int % 10**6:06d}",
            },
            "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
        }
    ).encode()


def _post_webhook(up: UpProcess, text: str, headers: Optional[dict[str, str]] = None) -> dict[str, Any]:
    status, _, body = http_call(
        "POST", up.url + "/webhooks/slack", _slack_message(text), {"Content-Type": "application/json", **(headers or {})}
    )
    assert status == 202, body
    answer: dict[str, Any] = json.loads(body)
    return answer


def scrape(up: UpProcess, token: str = TOKEN) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /metrics``, parsed by prometheus_client's own parser: {(name, labels): value}."""
    status, headers, body = http_call("GET", up.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version="), headers
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# -- /metrics ---------------------------------------------------------------------------------


def test_metrics_refuses_a_scrape_without_a_token_or_with_an_unknown_one_with_401_and_a_reason(up: UpProcess) -> None:
    status, headers, body = http_call("GET", up.url + "/metrics")
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert "Bearer token is required" in json.loads(body)["detail"]
    status, _, body = http_call("GET", up.url + "/metrics", headers={"Authorization": "Bearer not-a-token-at-all-xyz"})
    assert (status, json.loads(body)) == (401, {"detail": "unknown token"})
    status, _, body = http_call("GET", up.url + "/metrics", headers={"Authorization": "Basic abc"})
    assert status == 401 and "Bearer <token>" in json.loads(body)["detail"]


def test_metrics_takes_the_scrape_token_and_it_opens_nothing_else(up: UpProcess) -> None:
    samples = scrape(up, SCRAPE_TOKEN)
    assert value(samples, "crewlet_engine_service_up", service="seat_runtime") == 1.0
    status, _, _ = http_call("GET", up.url + "/api/events", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    assert status == 401


def test_a_webhook_moves_the_webhook_publish_delivery_and_turn_metrics_and_every_name_follows_the_conventions(
    up: UpProcess,
) -> None:
    before = scrape(up)
    _post_webhook(up, "count me")

    def moved() -> Optional[dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        now = scrape(up)
        turns = value(now, "crewlet_turns_completed_total") > value(before, "crewlet_turns_completed_total")
        ack = ("crewlet_queue_deliveries_total", (("outcome", "ack"), ("stream", "CREWLET_AGENT")))
        acked = now.get(ack, 0.0) > before.get(ack, 0.0)  # the trigger is acked once the turn is recorded
        return now if turns and acked else None

    after = wait_until(moved, WAIT_S, "a turn counted, and its trigger acked, after the webhook")
    delta = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    assert delta("crewlet_webhook_deliveries_total", source="slack", status="202") == 1
    assert delta("crewlet_webhook_accept_seconds_count", source="slack") == 1
    assert delta("crewlet_webhook_accept_seconds_sum", source="slack") > 0
    assert delta("crewlet_queue_publishes_total", stream="CREWLET_NOTIFICATIONS", outcome="ok") >= 1
    assert delta("crewlet_queue_publishes_total", stream="CREWLET_EVENTS", outcome="ok") >= 1
    assert delta("crewlet_queue_deliveries_total", stream="CREWLET_AGENT", outcome="ack") >= 1
    assert delta("crewlet_turns_started_total") >= 1
    assert delta("crewlet_turn_seconds_count") >= 1
    assert delta("crewlet_turn_round_seconds_count") >= 1
    assert value(after, "crewlet_turns_failed_total") == 0
    for seat in ("ada", "linus"):
        assert ("crewlet_mailbox_depth", (("seat", seat),)) in after
        assert ("crewlet_mailbox_pending", (("seat", seat),)) in after
    assert ("crewlet_mailbox_depth", (("seat", "grace"),)) not in after  # a human seat has no mailbox
    assert value(after, "crewlet_eventstore_writer_backlog_rows") == 0
    assert value(after, "crewlet_eventstore_writer_lag_seconds") == 0
    assert value(after, "crewlet_ws_stream_clients") == 0
    # A node alone holds its presence, every agent seat's lease and the once-per-fleet duties.
    assert value(after, "crewlet_fleet_present") == 1
    assert value(after, "crewlet_seat_lease_held", seat="ada") == value(after, "crewlet_seat_lease_held", seat="linus") == 1
    duties = {dict(labels)["duty"] for name, labels in after if name == "crewlet_duty_lease_held"}
    assert duties, sorted(name for name, _ in after)
    for (name, labels) in after:
        assert name.startswith("crewlet_") or name.startswith(("python_", "process_")), name
        for key, label in labels:
            assert key not in ("trace_id", "span_id", "event_id"), (name, labels)
            assert len(label) <= 64, (name, labels)


def test_an_open_ws_stream_socket_is_counted_while_it_is_open(up: UpProcess) -> None:
    from websockets.sync.client import connect

    ws_url = up.url.replace("http://", "ws://") + "/ws/stream"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, open_timeout=30) as socket:
        assert json.loads(socket.recv(timeout=30))["kind"] == "snapshot"
        assert value(scrape(up), "crewlet_ws_stream_clients") == 1
    wait_until(lambda: value(scrape(up), "crewlet_ws_stream_clients") == 0, WAIT_S, "the closed socket uncounted")


def test_a_short_scrape_token_stops_start_up_naming_the_variable(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "check"],
        cwd=tmp_path, env=up_env(CREWLET_VAR_DIR=str(tmp_path), CREWLET_METRICS_TOKEN="short"),
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "CREWLET_METRICS_TOKEN must be at least 16 ASCII characters with no spaces" in result.stderr


# -- /livez and /readyz -----------------------------------------------------------------------------


def _json(up: UpProcess, path: str) -> tuple[int, dict[str, Any]]:
    status, _, body = http_call("GET", up.url + path, timeout_s=30)
    return status, json.loads(body)


def test_readyz_names_each_component_ready_and_livez_answers_beside_healthz(up: UpProcess) -> None:
    status, body = _json(up, "/readyz")
    assert status == 200, json.dumps(body)
    assert body["status"] == "ready" and body["node"] == NODE and body["down"] == []
    parts = body["components"]
    assert parts["broker"] == {"ok": True, "state": "connected"}
    assert parts["coordination_store"] == {"ok": True, "state": "reachable"}
    assert parts["event_store"] == {"ok": True, "state": "reachable"}
    assert parts["duties"]["ok"] is True and parts["duties"]["state"] == "alive"
    assert {"seat_runtime", "eventstore_writer", "notify", "web"} <= set(parts["duties"]["services"])
    assert all(parts["duties"]["services"].values())
    assert _json(up, "/livez") == (200, {"status": "alive", "node": NODE, "components": {"process": "alive", "engine": "running"}})
    assert _json(up, "/healthz")[0] == 200


@pytest.mark.timeout(180)
def test_a_frozen_broker_makes_readyz_503_naming_the_broker_while_livez_stays_200(up: UpProcess) -> None:
    broker = [pid for pid, name in up.children.items() if name == "nats-server"]
    assert len(broker) == 1, up.children
    os.kill(broker[0], signal.SIGSTOP)
    try:
        frozen = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(_json(up, "/readyz")), WAIT_S, "/readyz 503")
        assert frozen[1]["status"] == "not ready"
        assert frozen[1]["down"] == ["broker"]
        assert frozen[1]["components"]["broker"] == {"ok": False, "state": "unresponsive"}
        assert _json(up, "/livez")[0] == 200
    finally:
        os.kill(broker[0], signal.SIGCONT)
    wait_until(lambda: _json(up, "/readyz")[0] == 200, WAIT_S, "/readyz back to 200 after SIGCONT")


# -- OpenTelemetry, through the standard variables (its own `up`: the case stops it) ----------------


@pytest.fixture
def own_receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


@pytest.fixture
def stopping_up(tmp_path: Path, own_receiver: Receiver) -> Iterator[UpProcess]:
    yield from serve(_observed_up(tmp_path, own_receiver))


@pytest.mark.timeout(180)
def test_a_webhooks_spans_reach_the_collector_under_otel_service_name_with_its_trace_id_when_up_stops(
    stopping_up: UpProcess, own_receiver: Receiver
) -> None:
    up, receiver = stopping_up, own_receiver
    # What the instrumentation's own variables decide about: a probe it excludes, one it keeps, credentials it captures.
    assert _json(up, "/readyz")[0] == 200 and http_call("GET", up.url + "/livez")[0] == 200
    assert http_call("GET", up.url + "/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})[0] == 200
    assert http_call("GET", up.url + "/api/events", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    answer = _post_webhook(up, "trace me", {"traceparent": f"00-{trace_id}-{parent_id}-01"})
    assert answer["trace_id"] == trace_id
    # The turn's own log line, written inside its span, names the trace.
    up.wait_for(f"trace_id={trace_id}", timeout_s=WAIT_S)
    wait_until(
        lambda: any("event=agent_turn_finished" in line and f"trace_id={trace_id}" in line for line in up.output_so_far().splitlines()),
        WAIT_S,
        "the webhook's turn finished, logged under its trace",
    )
    assert receiver.of_trace(trace_id) == []  # batched, not yet exported: the stop's flush sends them
    assert up.terminate() == 0

    spans = receiver.of_trace(trace_id)
    by_name = {span["name"]: span for span in spans}
    # Messaging spans named by the conventions: "{operation} {destination}".
    sending, routing, turning = "publish crewlet.notifications.inbound", "process crewlet.notifications.inbound", "process crewlet.agent.ada.inbox"
    assert {"POST /webhooks/slack", sending, routing, turning} <= set(by_name), sorted(by_name)
    for span in spans:
        assert span["resource"]["service.name"] == SERVICE_NAME
        assert span["resource"]["deployment.environment"] == "operability-test"
        assert span["path"] == "/v1/traces"
    server = by_name["POST /webhooks/slack"]
    assert server["kind"] == 2  # SPAN_KIND_SERVER
    assert server["attributes"]["http.route"] == "/webhooks/slack"
    assert server["attributes"]["http.response.status_code"] == 202 and server["attributes"]["http.request.method"] == "POST"
    assert "http.status_code" not in server["attributes"] and "http.method" not in server["attributes"]  # the stable names only
    sent = by_name[sending]
    assert sent["kind"] == 4  # SPAN_KIND_PRODUCER
    assert sent["attributes"]["messaging.system"] == "nats"
    assert sent["attributes"]["messaging.destination.name"] == "crewlet.notifications.inbound"
    assert sent["attributes"]["messaging.operation.type"] == "send"
    turn = by_name[turning]
    assert turn["kind"] == 5  # SPAN_KIND_CONSUMER
    assert turn["attributes"]["messaging.destination.name"] == "crewlet.agent.ada.inbox"
    assert turn["attributes"]["messaging.operation.type"] == "process"
    assert turn["attributes"]["messaging.consumer.group.name"]

    # The instrumentation's own variables apply, and a captured credential header is never exported.
    everything = receiver.of_service(SERVICE_NAME)
    names = {span["name"] for span in everything}
    assert "GET /readyz" in names and "GET /livez" not in names, sorted(names)
    captured = [span["attributes"]["http.request.header.authorization"] for span in everything
                if "http.request.header.authorization" in span["attributes"]]
    assert captured, "no span captured the Authorization header"
    assert TOKEN not in repr(everything) and SCRAPE_TOKEN not in repr(everything)
    assert by_name["POST /webhooks/slack"]["attributes"]["http.request.header.content_type"] == ["application/json"]

    # The log lines written inside those spans name them.
    span_ids = {span["span_id"] for span in spans}
    inside = [line for line in up.output().splitlines() if f"trace_id={trace_id}" in line and " span_id=" in line]
    assert inside, "no log line carries the webhook's trace and span"
    assert {line.split(" span_id=", 1)[1].split()[0] for line in inside} <= span_ids | {parent_id}
