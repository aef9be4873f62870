"""The webhook edge over HTTP: verification per vendor, refusals with reasons, the trace, and never half-accepting."""
from __future__ import annotations

import contextlib
import json
import time
from types import SimpleNamespace
from typing import Any, AsyncIterator, Iterator, Optional

import pytest
from django.test import AsyncClient

from crewlet.events import store_label
from crewlet.events.types import InboundDelivery, RawWebhook
from crewlet.engine import runtime
from crewlet.engine.interfaces import NOTIFY
from crewlet.company.org import Organization
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.memory import MemoryBroker
from crewlet.events.tracing import format_traceparent, parse_traceparent
from engine_support import engine_here
from notifications.edge import Edge, InboundRequest
from notifications_support import (
    SECRETS,
    company,
    fixture_bytes,
    holder,
    hub256_headers,
    hub_headers,
    set_secrets,
    slack_headers,
)
from seats_support import Recorder, memory_queues

JSON = "application/json"


@contextlib.contextmanager
def edge_here(q: EventQueue, org: Optional[Organization] = None) -> Iterator[Edge]:
    """An edge on ``q``, held by the notify service of the engine this process stands for (as ``up`` holds it)."""
    edge = Edge(q, holder(org or company()))
    with engine_here(q, services={NOTIFY: SimpleNamespace(edge=edge)}):
        yield edge


@contextlib.asynccontextmanager
async def edge_on(org: Optional[Organization] = None) -> AsyncIterator[tuple[MemoryBroker, EventQueue, Recorder]]:
    """An edge installed on a memory-twin client, with a recorder of everything it published."""
    async with memory_queues("n1") as (broker, (q,)):
        rec = Recorder().attach(q)
        with edge_here(q, org):
            yield broker, q, rec


async def post(path: str, body: bytes, *, content_type: str = JSON, headers: Optional[dict[str, str]] = None) -> Any:
    return await AsyncClient().post(path, data=body, content_type=content_type, headers=headers or {})


def published(rec: Recorder) -> list[tuple[str, str]]:
    return [(topic, ev.type) for topic, ev in rec.seen]


ACCEPTED = [(topics.NOTIFICATIONS_INBOUND, "raw_webhook"), (topics.event("inbound_delivery"), "inbound_delivery")]


# -- a delivery, accepted -------------------------------------------------------------


async def test_a_signed_slack_delivery_is_published_then_recorded_with_its_exact_bytes_and_answered_202(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = fixture_bytes("slack", "event_callback-app_mention.json")
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post("/webhooks/slack", body, headers=slack_headers(body))
        assert resp.status_code == 202, resp.content
        assert published(rec) == ACCEPTED  # the work queue first, its record beside it
        raw, record = rec.seen[0][1], rec.seen[1][1]
        assert isinstance(raw.data, RawWebhook) and isinstance(record.data, InboundDelivery)
        assert raw.data.raw_bytes() == body and record.data.raw_bytes() == body
        assert raw.data.provider == "slack" and raw.data.delivery_id == "Ev111"
        assert store_label(record) == "webhook:app_mention"
        assert "x-slack-signature" not in raw.data.headers  # secrets never travel
        assert raw.trace_id == record.trace_id == resp.json()["trace_id"] == resp["X-Crewlet-Trace-Id"]
        assert resp.json()["delivery_id"] == "Ev111"


@pytest.mark.parametrize(
    "source, fixture, label",
    [
        ("github", "pull_request-opened.json", "forge:pull_request"),
        ("jira", "jira-issue_updated-status-change.json", "webhook:jira:issue_updated"),
        ("confluence", "page_updated.json", "webhook:page_updated"),
        ("mattermost", "posted-dm-root.json", "socket:posted"),
    ],
)
async def test_each_source_files_its_delivery_under_the_providers_own_label(source: str, fixture: str, label: str) -> None:
    body = fixture_bytes(source, fixture)
    headers = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"} if source == "github" else {}
    async with edge_on() as (_, _, rec):
        resp = await post(f"/webhooks/{source}", body, headers=headers)
        assert resp.status_code == 202, resp.content
        assert published(rec) == ACCEPTED
        assert store_label(rec.seen[1][1]) == label
        assert rec.seen[1][1].data.raw_bytes() == body


async def test_a_vendor_retry_is_one_inbound_delivery_row_but_a_new_work_item() -> None:
    body = fixture_bytes("github", "issues-opened.json")
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": "d-1"}
    async with edge_on() as (_, _, rec):
        assert (await post("/webhooks/github", body, headers=headers)).status_code == 202
        assert (await post("/webhooks/github", body, headers=headers)).status_code == 202
        raws = rec.of("raw_webhook")
        records = rec.of("inbound_delivery")
        assert len(raws) == 2 and raws[0].id != raws[1].id  # routing tells the retry apart and drops it
        assert records[0].id == records[1].id  # the store keeps one row


async def test_a_delivery_is_kept_for_the_router_even_before_the_router_has_started() -> None:
    async with edge_on() as (_, q, _):
        assert (await post("/webhooks/jira", fixture_bytes("jira", "comment_created.json"))).status_code == 202
        assert await q.backlog(topics.NOTIFICATIONS_INBOUND, "notify") == 1


# -- verification, per vendor -----------------------------------------------------------


def _mm_body_with_token(token: str) -> bytes:
    payload = json.loads(fixture_bytes("mattermost", "posted-dm-root.json"))
    payload["token"] = token
    return json.dumps(payload).encode()


def signed(source: str, variant: str, secret: str) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) for a delivery signed with ``secret`` the way ``variant`` says."""
    if source == "slack":
        body = fixture_bytes("slack", "event_callback-message-im-toplevel.json")
        return "/webhooks/slack", body, slack_headers(body, secret)
    if source == "github":
        body = fixture_bytes("github", "issue_comment-created.json")
        return "/webhooks/github", body, {**hub256_headers(body, secret), "X-GitHub-Event": "issue_comment"}
    if source in ("jira", "confluence"):
        body = fixture_bytes(source, "comment_created.json" if source == "jira" else "page_created.json")
        if variant == "query":
            return f"/webhooks/{source}?secret={secret}", body, {}
        return f"/webhooks/{source}", body, hub_headers(body, secret)
    body = fixture_bytes("mattermost", "posted-dm-root.json")
    if variant == "field":
        return "/webhooks/mattermost", _mm_body_with_token(secret), {}
    return "/webhooks/mattermost", body, {"Authorization": f"Token {secret}"}


VARIANTS = [
    ("slack", "v0"),
    ("github", "sha256"),
    ("jira", "header"),
    ("jira", "query"),
    ("confluence", "header"),
    ("confluence", "query"),
    ("mattermost", "header"),
    ("mattermost", "field"),
]


@pytest.mark.parametrize("source, variant", VARIANTS)
async def test_a_correctly_signed_delivery_is_accepted(source: str, variant: str, monkeypatch) -> None:
    set_secrets(monkeypatch)
    path, body, headers = signed(source, variant, SECRETS[source][1])
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post(path, body, headers=headers)
        assert resp.status_code == 202, resp.content
        assert published(rec) == ACCEPTED


@pytest.mark.parametrize("source, variant", VARIANTS)
async def test_a_delivery_signed_with_the_wrong_secret_is_refused_and_nothing_is_published(source: str, variant: str, monkeypatch) -> None:
    set_secrets(monkeypatch)
    path, body, headers = signed(source, variant, "not-the-secret")
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post(path, body, headers=headers)
        assert resp.status_code == 401
        assert "does not match" in resp.json()["error"]
        assert rec.seen == []


@pytest.mark.parametrize("source", ["slack", "github", "jira", "confluence", "mattermost"])
async def test_a_delivery_without_any_signature_is_refused_with_what_was_missing(source: str, monkeypatch) -> None:
    set_secrets(monkeypatch)
    path, body, _ = signed(source, "header", SECRETS[source][1])
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post(path.split("?")[0], body)
        assert resp.status_code == 401 and "missing" in resp.json()["error"]
        assert rec.seen == []


async def test_a_signed_body_that_was_tampered_with_is_refused(monkeypatch) -> None:
    set_secrets(monkeypatch)
    _, body, headers = signed("github", "sha256", SECRETS["github"][1])
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post("/webhooks/github", body.replace(b"totally right", b"totally wrong"), headers=headers)
        assert resp.status_code == 401 and rec.seen == []


async def test_a_stale_slack_signature_is_refused_even_when_it_is_correct(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = fixture_bytes("slack", "event_callback-app_mention.json")
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post("/webhooks/slack", body, headers=slack_headers(body, at=time.time() - 301))
        assert resp.status_code == 401 and "stale" in resp.json()["error"]
        future = await post("/webhooks/slack", body, headers=slack_headers(body, at=time.time() + 600))
        assert future.status_code == 401
        assert rec.seen == []


def test_slack_tolerance_is_five_minutes_either_side_on_an_injected_clock(monkeypatch) -> None:
    from notifications.sources.slack import verify as verify_slack

    body = b'{"type":"event_callback"}'
    secret = "s"
    hdrs = {k.lower(): v for k, v in slack_headers(body, secret, at=1_000_000).items()}
    req = InboundRequest(source="slack", body=body, headers=hdrs)
    assert verify_slack(secret, req, now=1_000_000 + 300) is None
    assert verify_slack(secret, req, now=1_000_000 - 300) is None
    assert "stale" in (verify_slack(secret, req, now=1_000_000 + 301) or "")


@pytest.mark.parametrize("source", ["slack", "github", "jira", "confluence", "mattermost"])
async def test_a_surface_whose_secret_is_unset_is_refused_as_not_configured(source: str, monkeypatch) -> None:
    for env, _ in SECRETS.values():
        monkeypatch.delenv(env, raising=False)
    path, body, headers = signed(source, "header", "whatever")
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post(path, body, headers=headers)
        assert resp.status_code == 401
        assert resp.json()["error"].startswith(f"the {source} surface is not configured: set {SECRETS[source][0]}")
        assert rec.seen == []


async def test_a_surface_the_company_marks_verify_false_accepts_unsigned_deliveries(monkeypatch) -> None:
    for env, _ in SECRETS.values():
        monkeypatch.delenv(env, raising=False)
    async with edge_on(company(verify=False)) as (_, _, rec):
        resp = await post("/webhooks/slack", fixture_bytes("slack", "event_callback-app_mention.json"))
        assert resp.status_code == 202 and published(rec) == ACCEPTED


# -- refusals with reasons ------------------------------------------------------------------


async def test_slack_url_verification_is_answered_with_its_challenge_and_routes_nothing(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = fixture_bytes("slack", "url_verification.json")
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post("/webhooks/slack", body, headers=slack_headers(body))
        assert resp.status_code == 200 and resp.json() == {"challenge": "valid_challenge_token"}
        assert rec.seen == []


async def test_malformed_json_is_400_with_a_reason() -> None:
    async with edge_on() as (_, _, rec):
        resp = await post("/webhooks/jira", b'{"webhookEvent": ')
        assert resp.status_code == 400 and resp.json()["error"].startswith("malformed JSON")
        array = await post("/webhooks/jira", b"[1, 2]")
        assert array.status_code == 400 and "JSON object" in array.json()["error"]
        assert rec.seen == []


async def test_a_wrong_content_type_is_415_with_a_reason_naming_what_the_source_accepts() -> None:
    async with edge_on() as (_, _, rec):
        resp = await post("/webhooks/jira", b"payload=%7B%7D", content_type="application/x-www-form-urlencoded")
        assert resp.status_code == 415
        assert resp.json()["error"] == "content type 'application/x-www-form-urlencoded' is not accepted: send application/json"
        resp = await post("/webhooks/github", b"{}", content_type="text/plain")
        assert resp.status_code == 415
        assert resp.json()["error"] == (
            "content type 'text/plain' is not accepted: send application/json or application/x-www-form-urlencoded"
        )
        assert rec.seen == []


async def test_a_body_over_the_limit_is_413_with_a_reason(settings) -> None:
    settings.CREWLET_WEBHOOK_MAX_BODY_BYTES = 64
    async with edge_on() as (_, _, rec):
        resp = await post("/webhooks/jira", fixture_bytes("jira", "comment_created.json"))
        assert resp.status_code == 413 and "over the 64-byte limit" in resp.json()["error"]
        assert rec.seen == []


async def test_the_default_body_limit_is_one_mebibyte() -> None:
    async with edge_on() as (_, _, rec):
        big = json.dumps({"webhookEvent": "x", "pad": "a" * (1024 * 1024)}).encode()
        resp = await post("/webhooks/jira", big)
        assert resp.status_code == 413 and "1048576-byte limit" in resp.json()["error"]
        assert rec.seen == []


async def test_a_body_the_edge_reads_without_a_declared_length_is_still_held_to_the_limit() -> None:
    async with memory_queues("n1") as (_, (q,)):
        edge = Edge(q, holder(), max_body=10)
        resp = await edge.receive(InboundRequest(source="jira", body=b'{"a": "0123456789"}', headers={"content-type": JSON}))
        assert resp.status == 413


async def test_a_get_is_405() -> None:
    async with edge_on():
        resp = await AsyncClient().get("/webhooks/slack")
        assert resp.status_code == 405 and resp["Allow"] == "POST"


# -- the broker, unreachable ----------------------------------------------------------------


async def test_an_unreachable_broker_is_503_and_nothing_is_half_accepted() -> None:
    async with edge_on() as (broker, _, rec):
        broker.go_away()
        resp = await post("/webhooks/slack", fixture_bytes("slack", "event_callback-app_mention.json"))
        assert resp.status_code == 503 and "broker is unavailable" in resp.json()["error"]
        assert resp["Retry-After"]
        assert rec.seen == []
        broker.come_back()
        again = await post("/webhooks/slack", fixture_bytes("slack", "event_callback-app_mention.json"))
        assert again.status_code == 202


async def test_a_process_without_an_edge_answers_503() -> None:
    assert runtime.find_service(NOTIFY) is None  # no engine runs in this test process
    resp = await post("/webhooks/slack", fixture_bytes("slack", "event_callback-app_mention.json"))
    assert resp.status_code == 503 and "no broker connection" in resp.json()["error"]


@pytest.mark.integration
async def test_a_stopped_real_broker_is_503_so_the_vendor_retries() -> None:
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue
    from seats_support import FAST

    async with EmbeddedBroker(store_dir=None) as broker:
        q = await JetStreamQueue.connect(broker.url, node="n1", timings=FAST, memory_storage=broker.memory_storage)
        rec = Recorder().attach(q)
        try:
            with edge_here(q):
                body = fixture_bytes("slack", "event_callback-app_mention.json")
                assert (await post("/webhooks/slack", body)).status_code == 202
                assert published(rec) == ACCEPTED
                await broker.stop()
                resp = await post("/webhooks/slack", body)
                assert resp.status_code == 503
                assert published(rec) == ACCEPTED  # nothing more
        finally:
            await q.close()


# -- the trace ---------------------------------------------------------------------------------


async def test_an_inbound_traceparent_is_honoured_so_the_delivery_joins_the_callers_trace() -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with edge_on() as (_, _, rec):
        resp = await post(
            "/webhooks/slack",
            fixture_bytes("slack", "event_callback-app_mention.json"),
            headers={"traceparent": format_traceparent(trace_id, parent)},
        )
        assert resp.status_code == 202
        raw = rec.seen[0][1]
        assert raw.trace_id == trace_id and raw.parent_span_id == parent and raw.span_id != parent
        assert parse_traceparent(raw.data.headers["traceparent"]).trace_id == trace_id


async def test_a_malformed_traceparent_starts_a_fresh_trace() -> None:
    async with edge_on() as (_, _, rec):
        bad = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        resp = await post("/webhooks/slack", fixture_bytes("slack", "event_callback-app_mention.json"), headers={"traceparent": bad})
        assert resp.status_code == 202
        raw = rec.seen[0][1]
        assert raw.trace_id and raw.trace_id != "0" * 32 and raw.parent_span_id == ""


async def test_a_request_served_on_another_event_loop_is_published_on_the_queues_own_loop() -> None:
    """A web server whose loop is not the engine's (Daphne in its own thread, a WSGI worker) still publishes safely."""
    import asyncio
    import threading

    engine_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=engine_loop.run_forever, daemon=True)
    thread.start()
    state: dict[str, Any] = {}

    async def boot() -> None:
        broker = MemoryBroker()
        state["queue"] = q = broker.client(node="n1")
        state["rec"] = Recorder().attach(q)
        state["edge"] = Edge(q, holder())
        state["loops"] = []

        async def where(topic: str, ev: Any) -> None:
            state["loops"].append(asyncio.get_running_loop())

        q.add_publish_listener(where)

    try:
        asyncio.run_coroutine_threadsafe(boot(), engine_loop).result(timeout=10)
        with engine_here(state["queue"], services={NOTIFY: SimpleNamespace(edge=state["edge"])}) as engine:
            engine.bind_queue(state["queue"], engine_loop)
            resp = await post("/webhooks/jira", fixture_bytes("jira", "comment_created.json"))
        assert resp.status_code == 202
        assert state["loops"] == [engine_loop, engine_loop]
        assert published(state["rec"]) == ACCEPTED
    finally:
        if "queue" in state:
            asyncio.run_coroutine_threadsafe(state["queue"].close(), engine_loop).result(timeout=10)
        engine_loop.call_soon_threadsafe(engine_loop.stop)
        thread.join(timeout=10)
        engine_loop.close()
