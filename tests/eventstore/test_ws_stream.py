"""``/ws/stream`` through Channels' WebsocketCommunicator on the real ASGI app, over a real queue."""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Optional

import nats
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from crewlet import events
from crewlet.engine import runtime
from crewlet.asgi import application
from crewlet.engine.core import Engine
from crewlet.engine.interfaces import LIVE_PROJECTION
from crewlet.events import Event
from crewlet.events.types import AgentSpawned, AgentTurnStarted, AuxiliarySpend
from crewlet.company.org import Organization
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.contract import EventQueue
from crewlet.queue.jetstream import BROADCAST_PREFIX, JetStreamQueue
from crewlet.queue.memory import MemoryBroker
from crewlet.events.tracing import Trace
from eventstore import projection, stream
from eventstore.projection import LiveProjection
from engine_support import engine_here
from seats_support import FAST, company, eventually

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "events"])]

NODE = "n1"
#: A frame the test expects arrives well within this (JetStream included).
FRAME_TIMEOUT_S = 10


class Backend:
    """A bound queue, and how to count the broadcast consumers open on it (the observable fact of a tab)."""

    def __init__(self, queue: EventQueue, open_broadcasts: Callable[[], Awaitable[int]]) -> None:
        self.queue = queue
        self.open_broadcasts = open_broadcasts


@contextlib.asynccontextmanager
async def memory_backend() -> AsyncIterator[Backend]:
    q = MemoryBroker(FAST).client(node=NODE)

    async def count() -> int:
        return len(q._closables)  # the client's open broadcasts (each subscribe_stream until closed)

    try:
        yield Backend(q, count)
    finally:
        await q.close()


@contextlib.asynccontextmanager
async def jetstream_backend() -> AsyncIterator[Backend]:
    async with EmbeddedBroker(store_dir=None) as broker:
        q = await JetStreamQueue.connect(
            broker.url, node=NODE, timings=FAST, event_retention_hours=2.0, memory_storage=broker.memory_storage
        )
        raw = await nats.connect(broker.url)

        async def count() -> int:
            msg = await raw.request("$JS.API.CONSUMER.LIST.CREWLET_EVENTS", b'{"offset": 0}', timeout=5)
            consumers = json.loads(msg.data).get("consumers") or []
            return len([c for c in consumers if c["name"].startswith(BROADCAST_PREFIX)])

        try:
            yield Backend(q, count)
        finally:
            await raw.close()
            await q.close()


@pytest.fixture(params=["memory", "jetstream"])
async def backend(request: Any, process_engine: Engine) -> AsyncIterator[Backend]:
    maker = memory_backend if request.param == "memory" else jetstream_backend
    async with maker() as b:
        process_engine.bind_queue(b.queue)
        try:
            yield b
        finally:
            process_engine.bind_queue(None)


@pytest.fixture
def org() -> Organization:
    return company()


@pytest.fixture(autouse=True)
def process_engine(org: Organization) -> Iterator[Engine]:
    """The engine this test process stands for; a test adds the queue (``backend``) and the projection (``live``)."""
    with engine_here(company=org) as engine:
        yield engine


@pytest.fixture
def live(org: Organization, process_engine: Engine) -> Any:
    installed = LiveProjection(company=lambda: org)
    process_engine.provide(LIVE_PROJECTION, projection.ProjectionService(process_engine, installed))
    yield installed


@pytest.fixture(autouse=True)
async def _close_connections() -> AsyncIterator[None]:
    yield
    from django.db import connections

    await sync_to_async(connections.close_all)()


@sync_to_async
def session_cookie(*, staff: bool = True, active: bool = True) -> bytes:
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_user(f"person-{User.objects.count()}", password="pw", is_staff=staff, is_active=active)
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


@sync_to_async
def operator_token() -> str:
    from crewlet.base.tokens import OperatorToken

    _, token = OperatorToken.mint(f"tab-{OperatorToken.objects.count()}")
    return token


def socket(*headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, stream.STREAM_PATH, headers=list(headers))


@contextlib.asynccontextmanager
async def tab(*headers: tuple[bytes, bytes]) -> AsyncIterator[tuple[WebsocketCommunicator, dict[str, Any]]]:
    """A connected tab and its first frame."""
    ws = socket(*headers)
    connected, code = await ws.connect(timeout=FRAME_TIMEOUT_S)
    assert connected, f"refused with {code}"
    first = await ws.receive_json_from(timeout=FRAME_TIMEOUT_S)
    try:
        yield ws, first
    finally:
        await ws.disconnect(timeout=FRAME_TIMEOUT_S)


async def staff_headers() -> tuple[bytes, bytes]:
    return (b"cookie", await session_cookie())


def made(body: Any) -> Event:
    return events.new(body, Trace.root())


async def publish(q: EventQueue, body: Any) -> Event:
    event = made(body)
    await q.publish(topics.event(event.type), event)
    return event


async def frame_for(ws: WebsocketCommunicator, event_id: Optional[str] = None, **match: Any) -> dict[str, Any]:
    """The next event frame whose row is ``event_id`` (or whose seat row matches ``match``)."""
    while True:
        frame = await ws.receive_json_from(timeout=FRAME_TIMEOUT_S)
        assert frame["kind"] == "event"
        if event_id is not None and (frame["event"] or {}).get("id") == event_id:
            return frame
        if match and frame["seat"] and all(frame["seat"].get(k) == v for k, v in match.items()):
            return frame


# -- who may connect --------------------------------------------------------------------------------


async def test_an_anonymous_socket_a_non_staff_session_and_an_unknown_token_are_refused_before_the_accept(
    backend: Backend, live: LiveProjection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.eventstore.stream")
    refused = [
        socket(),
        socket((b"cookie", await session_cookie(staff=False))),
        socket((b"cookie", await session_cookie(staff=True, active=False))),
        socket((b"authorization", b"Bearer not-a-token-anyone-minted")),
        socket((b"authorization", b"Basic b3A6cHc=")),
    ]
    for ws in refused:
        connected, _code = await ws.connect(timeout=FRAME_TIMEOUT_S)
        assert connected is False
        await ws.disconnect(code=1006, timeout=FRAME_TIMEOUT_S)  # what the server reports once it answered 403
    reasons = [r.reason for r in caplog.records if r.getMessage() == "ws_stream_refused"]
    assert reasons == [
        stream.REFUSED_NO_CREDENTIAL,
        stream.REFUSED_NOT_STAFF,
        stream.REFUSED_NO_CREDENTIAL,  # an inactive user's session does not even sign in
        stream.REFUSED_BAD_TOKEN,
        stream.REFUSED_NO_CREDENTIAL,
    ]
    assert await backend.open_broadcasts() == 0


async def test_a_staff_session_from_another_site_is_refused_but_a_token_is_not_an_ambient_credential(
    backend: Backend, live: LiveProjection
) -> None:
    cookie = (b"cookie", await session_cookie())
    ws = socket(cookie, (b"origin", b"https://evil.example"))
    connected, _ = await ws.connect(timeout=FRAME_TIMEOUT_S)
    assert connected is False
    await ws.disconnect(code=1006, timeout=FRAME_TIMEOUT_S)
    async with tab(cookie, (b"origin", b"http://localhost:8000"), (b"host", b"localhost:8000")) as (_, first):
        assert first["kind"] == "snapshot"
    token = await operator_token()
    async with tab((b"authorization", f"Bearer {token}".encode()), (b"origin", b"https://evil.example")) as (_, first):
        assert first["kind"] == "snapshot"


async def test_a_staff_session_and_an_operator_token_are_accepted_and_the_first_frame_is_the_snapshot(
    backend: Backend, live: LiveProjection, org: Organization
) -> None:
    live.apply(topics.event("agent_spawned"), made(AgentSpawned(seat="ada")))
    token = await operator_token()
    for headers in (await staff_headers(), (b"authorization", f"Bearer {token}".encode())):
        async with tab(headers) as (_, first):
            assert first["kind"] == stream.KIND_SNAPSHOT
            assert set(first) >= {"kind", "seats", "feed", "counters"}
            assert [s["handle"] for s in first["seats"]] == [s.handle for s in org.seats]
            ada = first["seats"][0]
            assert set(ada) >= {"handle", "kind", "display_name", "role", "state", "reason", "turn_id", "queued", "last_turn"}
            assert ada["state"] == "idle"
            assert first["counters"]["events"] == 1


# -- what a tab receives ---------------------------------------------------------------------------------


async def test_an_event_published_after_connect_arrives_as_a_frame_with_the_seats_new_state(
    backend: Backend, live: LiveProjection
) -> None:
    async with tab(await staff_headers()) as (ws, first):
        assert first["seats"][0]["state"] == "absent"
        await publish(backend.queue, AgentSpawned(seat="ada", reason="claimed"))
        spawned = await frame_for(ws, handle="ada", state="idle")
        assert spawned["event"] is None and spawned["fed"] is False  # live-only: never a feed row
        started = await publish(backend.queue, AgentTurnStarted(seat="ada", role="engineer", turn_id="t1"))
        frame = await frame_for(ws, started.id)
        assert frame["fed"] is True
        assert frame["seat"]["state"] == "running" and frame["seat"]["turn_id"] == "t1"
        assert frame["event"]["type"] == "agent_turn_started" and frame["event"]["seat"] == "ada"
        assert frame["counters"]["events"] == 2
        spend = await publish(backend.queue, AuxiliarySpend(stage="turn", seat="ada", input_tokens=4, output_tokens=1))
        frame = await ws.receive_json_from(timeout=FRAME_TIMEOUT_S)
        assert (frame["event"], frame["fed"], frame["seat"]) == (None, False, None)  # not fed, moves no seat
        assert frame["counters"]["tokens"] == 5
        assert spend.id not in {row["id"] for row in live.snapshot()["feed"]}
    assert live.seat("ada")["state"] == "running"  # type: ignore[index]  # the tab's stream fed the projection


async def test_two_tabs_each_get_every_event(backend: Backend, live: LiveProjection) -> None:
    headers = await staff_headers()
    async with tab(headers) as (one, _), tab(headers) as (two, _):
        assert await backend.open_broadcasts() == 2
        published = [await publish(backend.queue, AgentTurnStarted(seat="linus", turn_id=f"t{i}")) for i in range(3)]
        for ws in (one, two):
            got = [(await ws.receive_json_from(timeout=FRAME_TIMEOUT_S))["event"]["id"] for _ in published]
            assert got == [e.id for e in published]
    assert live.counters()["events"] == 3  # two tabs applied each event: counted once


async def test_on_disconnect_the_tabs_broadcast_consumer_is_closed(backend: Backend, live: LiveProjection) -> None:
    assert await backend.open_broadcasts() == 0
    async with tab(await staff_headers()):
        assert await backend.open_broadcasts() == 1
    await eventually(lambda: _is(backend.open_broadcasts(), 0), what="the tab's consumer closed")


async def _is(count: Awaitable[int], expected: int) -> bool:
    return await count == expected


async def _accepted_then_told_to_try_again_later(caplog: pytest.LogCaptureFixture) -> list[str]:
    """A staff tab's socket: accepted, then closed "try again later" with no frame first; the reasons logged."""
    caplog.set_level(logging.INFO, logger="crewlet.eventstore.stream")
    ws = socket(await staff_headers())
    connected, _ = await ws.connect(timeout=FRAME_TIMEOUT_S)
    assert connected is True
    closed = await ws.receive_output(timeout=FRAME_TIMEOUT_S)
    assert closed["type"] == "websocket.close" and closed["code"] == stream.CLOSE_TRY_AGAIN_LATER  # no snapshot frame first
    await ws.disconnect(code=stream.CLOSE_TRY_AGAIN_LATER, timeout=FRAME_TIMEOUT_S)
    reasons = [r.reason for r in caplog.records if r.getMessage() == "ws_stream_unavailable"]
    assert [closed["reason"]] == reasons  # the close frame says why, as the log does
    return reasons


async def test_with_no_queue_in_the_process_the_socket_is_accepted_then_closed_try_again_later(
    live: LiveProjection, caplog: pytest.LogCaptureFixture
) -> None:
    assert runtime.current_queue() is None
    assert await _accepted_then_told_to_try_again_later(caplog) == ["no queue"]


async def test_with_a_queue_but_no_engines_projection_the_socket_says_no_engine_runs_here_instead_of_showing_another_company(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    assert projection.current() is None
    assert await _accepted_then_told_to_try_again_later(caplog) == [runtime.NO_ENGINE]
    assert projection.current() is None  # none was made up for the tab
    assert await backend.open_broadcasts() == 0


async def test_plain_http_is_still_djangos(backend: Backend) -> None:
    from channels.testing import HttpCommunicator

    response = await HttpCommunicator(application, "GET", "/healthz", headers=[(b"host", b"localhost")]).get_response(timeout=FRAME_TIMEOUT_S)
    assert response["status"] in (200, 503)
    assert set(json.loads(response["body"])) >= {"status", "broker", "loops", "node"}
