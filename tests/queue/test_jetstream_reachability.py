"""JetStream-only facts about reachability: how nats-py's failures come out as the queue's own errors, and cancellation.

A broker that is not there, refuses the credential, stops or freezes makes
every verb ``Unavailable`` (never a nats-py type); a read loop that dies
reconnects at once; a file store keeps the mail across a broker restart; and
a task cancelled while it asks JetStream stops. The fixtures and helpers are
tests/queue/test_jetstream_backend.py's. Every test runs a real embedded
nats-server; nothing about the broker is mocked.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path

import nats
import pytest

from crewlet.events import Event
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.contract import SubscriptionRef, Timings
from crewlet.queue.errors import QueueError, Unavailable
from crewlet.queue.jetstream import JetStreamQueue, JetStreamTransport
from crewlet.queue.natsclient import LOG_READ_LOOP_ENDED, LatePongClient
from tests.process_support import is_stopped
from tests.queue.test_jetstream_backend import (  # noqa: F401 - fixtures are used by name
    TIMINGS,
    always_ready,
    broker,
    connected,
    event,
    puller_on,
    transport,
)
from waiting_support import eventually

pytestmark = pytest.mark.integration  # every test here runs a real nats-server


# ---------------------------------------------------------------------------
# Reachability


async def test_connecting_to_nothing_is_unavailable() -> None:
    async with EmbeddedBroker() as b:
        url = b.url
    with pytest.raises(Unavailable):
        await JetStreamTransport.connect(url, connect_timeout_s=1.0)


async def test_a_wrong_credential_is_unavailable_and_never_a_nats_error(broker: EmbeddedBroker) -> None:
    url = broker.url.replace(broker.password, "wrong")
    with pytest.raises(Unavailable) as caught:
        await JetStreamTransport.connect(url, connect_timeout_s=1.0)
    assert broker.password not in str(caught.value)


async def test_when_the_broker_stops_every_verb_is_unavailable_and_no_nats_type_escapes(
    broker: EmbeddedBroker, transport: JetStreamTransport
) -> None:
    topic = topics.agent_inbox("away")
    await transport.ensure_consumer(topic, "agent-away")
    puller = await transport.open_puller(topic, "agent-away")
    waiting = asyncio.create_task(puller.fetch(1, 60.0, always_ready))
    await eventually(lambda: puller._active is not None)
    await broker.stop()
    await eventually(lambda: not transport.is_connected)
    assert await asyncio.wait_for(waiting, timeout=10) == []  # the disconnect ended the wait
    calls = [
        lambda: transport.publish(topic, event()),
        lambda: transport.ensure_consumer(topic, "agent-away"),
        lambda: transport.delete_consumer(topic, "agent-away"),
        lambda: transport.list_consumers(">"),
        lambda: transport.backlog(topic, "agent-away"),
        lambda: transport.dead_letters(10),
        lambda: puller.fetch(1, 1.0, always_ready),
        lambda: transport.open_broadcast("crewlet.events.>", _ignore),
        lambda: transport.ask("crewlet.fleet.x", b"q", 1, 1.0),
        lambda: transport.serve("crewlet.fleet.x", _echo),
    ]
    for call in calls:
        with pytest.raises(QueueError) as caught:
            await asyncio.wait_for(call(), timeout=5)
        assert isinstance(caught.value, Unavailable)
        assert not type(caught.value).__module__.startswith("nats")
    await puller.close()


async def test_round_trips_that_timed_out_on_a_frozen_broker_leave_the_connection_answering_once_it_resumes(
    broker: EmbeddedBroker, transport: JetStreamTransport
) -> None:
    """The PONGs of the timed-out PINGs arrive after the resume, before any other answer.

    A connection that stopped reading at the first of them would time out every
    request until its stale-connection check reconnected it, tens of seconds
    later; the publish below waits only the API timeout.
    """
    topic = topics.agent_inbox("frozen")
    await transport.ensure_consumer(topic, "agent-frozen")
    await transport.round_trip(5.0)  # no PONG of an earlier PING is still on its way to answer one of the frozen ones
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        await eventually(lambda: is_stopped(broker.pid or 0), 10, "every thread of the broker stopped")
        for _ in range(3):
            with pytest.raises(Unavailable):
                await transport.round_trip(0.2)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    await transport.publish(topic, event())
    await transport.round_trip(5.0)
    assert transport.is_connected
    assert await transport.backlog(topic, "agent-frozen") == 1


class _PongHandlingFailsOnce(LatePongClient):
    """A client whose read loop meets an error nats-py does not handle: its first PONG's handling raises."""

    failed = False

    async def _process_pong(self) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("an error inside the read loop")
        await super()._process_pong()


async def test_a_read_loop_ended_by_an_unhandled_error_reconnects_at_once_instead_of_going_deaf(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """nats-py stops reading on such an error and tells nobody; its stale-connection check is minutes away here."""
    nc = _PongHandlingFailsOnce()
    await nc.connect(broker.url, ping_interval=600, reconnect_time_wait=0.1)
    try:
        with caplog.at_level(logging.WARNING, logger="crewlet.queue.natsclient"):
            with pytest.raises(nats.errors.TimeoutError):
                await nc.flush(timeout=1)
        assert [r.getMessage() for r in caplog.records if r.name == "crewlet.queue.natsclient"] == [LOG_READ_LOOP_ENDED]
        reply = await nc.request("$JS.API.INFO", b"", timeout=5)
        assert "error" not in json.loads(reply.data)
    finally:
        await nc.close()


async def _ignore(subject: str, data: bytes) -> None:
    return None


async def _echo(request: bytes) -> bytes:
    return request


async def test_the_client_reconnects_and_a_file_store_keeps_the_mail_across_a_restart(tmp_path: Path) -> None:
    store = tmp_path / "store"
    topic = topics.agent_inbox("durable")
    short_ack = Timings(backoff_base_s=0.001, backoff_cap_s=0.005, ack_wait_s=1.0)
    async with EmbeddedBroker(store_dir=store) as b, connected(b, timings=short_ack) as t:
        await t.ensure_consumer(topic, "agent-durable")
        await t.publish(topic, event(n=1))
        await b.stop()
        await eventually(lambda: not t.is_connected)
        await b.start()  # same port, same credential: the client finds it again
        await eventually(lambda: t.is_connected)
        for n in (2, 3):
            await t.publish(topic, event(n=n))  # streams are provisioned again on demand
        async with puller_on(t, topic, "agent-durable") as puller:
            m1, m2 = await puller.fetch(2, 10.0, always_ready)
            assert [Event.from_json(m.data).payload["n"] for m in (m1, m2)] == [1, 2]
            await m1.ack()
            await m2.nak_head()
    # A new broker process (a new credential) over the same store.
    async with EmbeddedBroker(store_dir=store) as b2, connected(b2, timings=short_ack) as t2:
        assert await t2.list_consumers("crewlet.agent.>") == [SubscriptionRef(topic, "agent-durable")]
        assert await t2.ensure_consumer(topic, "agent-durable") is False
        async with puller_on(t2, topic, "agent-durable") as puller:
            # The acked message never returns; the never-delivered one flows; and
            # (broker fact) one unsettled at the stop, even one handed back just before
            # it, is pending again after the restart: it returns once the ack window
            # has passed, with its delivery count intact.
            got: dict[int, int] = {}

            async def both() -> bool:
                for m in await puller.fetch(5, 1.0, always_ready):
                    got[Event.from_json(m.data).payload["n"]] = m.delivered
                    await m.ack()
                return len(got) >= 2

            await eventually(both, timeout_s=20)
            assert got == {3: 1, 2: 2}


# -- cancellation --------------------------------------------------------------------------


async def test_a_task_cancelled_while_it_asks_jetstream_stops_even_when_the_reply_lands_with_the_cancel(
    broker: EmbeddedBroker,
) -> None:
    """Python 3.11's wait_for (inside nats-py's request) can swallow a cancel (gh-86296); the backend delivers it."""
    queue = await JetStreamQueue.connect(broker.url, node="n1", timings=TIMINGS, memory_storage=broker.memory_storage)
    topic, group = topics.agent_inbox("zed"), topics.agent_inbox_group("zed")
    await queue.ensure_subscription(topic, group)
    tasks: list[asyncio.Task[None]] = []
    try:
        for attempt in range(60):  # unfixed, about half of these carried on
            asking = asyncio.Event()

            async def ask_forever() -> None:
                while True:
                    await queue.backlog(topic, group)
                    asking.set()

            task = asyncio.create_task(ask_forever())
            tasks.append(task)
            await asking.wait()
            await asyncio.sleep((attempt % 10) * 0.0003)  # land the cancel at different points of a request
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 5.0)  # a lost cancel: TimeoutError instead
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await queue.close()
