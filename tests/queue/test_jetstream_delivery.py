"""JetStream-only facts about moving mail: pulling and settling, sizes, broadcast, and ask/serve on core NATS.

What the puller asks the broker for (a batch, a wait, nothing behind a closed
gate) and how a hand-back and a Nak are placed; where the size limit falls;
that a broadcast consumer is ephemeral, narrowed on the broker and never
takes from a durable; and that core NATS scatter/gather answers concurrently.
The fixtures and helpers are tests/queue/test_jetstream_backend.py's. Every test
runs a real embedded nats-server; nothing about the broker is mocked.
"""
from __future__ import annotations

import asyncio

import nats
import pytest

from crewlet.events import Event
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.contract import MAX_PAYLOAD_BYTES
from crewlet.queue.errors import Gone, TooLarge
from crewlet.queue.jetstream import BROADCAST_PREFIX, JetStreamTransport, is_subset
from tests.queue.test_jetstream_backend import (  # noqa: F401 - fixtures are used by name
    NS,
    always_ready,
    broker,
    consumers_of,
    drained,
    event,
    pulling,
    raw,
    stream_info,
    transport,
)
from waiting_support import eventually

pytestmark = pytest.mark.integration  # every test here runs a real nats-server


# ---------------------------------------------------------------------------
# Pulling and settling


async def test_a_batch_fetch_returns_what_is_available_without_waiting_for_a_full_batch(
    transport: JetStreamTransport,
) -> None:
    async with pulling(transport, "batch", *(event(n=i) for i in range(3))) as (topic, group, puller):
        # A one-minute fetch of up to 20 that returns within the test's deadline: it did not wait for 20.
        msgs = await asyncio.wait_for(puller.fetch(20, 60.0, always_ready), timeout=10)
        assert [Event.from_json(m.data).payload["n"] for m in msgs] == [0, 1, 2]
        assert [m.delivered for m in msgs] == [1, 1, 1]
        for m in msgs:
            await m.ack()
        await drained(transport, topic, group)
        # Empty: [] at the timeout, never an error.
        assert await puller.fetch(5, 0.2, always_ready) == []
        assert await puller.fetch(5, 0.0, always_ready) == []


async def test_a_waiting_fetch_takes_the_first_message_that_arrives(transport: JetStreamTransport) -> None:
    async with pulling(transport, "late") as (topic, _, puller):
        task = asyncio.create_task(puller.fetch(10, 60.0, always_ready))
        await eventually(lambda: puller._active is not None)
        await transport.publish(topic, event(n=1))
        msgs = await asyncio.wait_for(task, timeout=10)
        assert len(msgs) == 1
        await msgs[0].ack()


async def test_an_interrupted_fetch_leaves_no_request_behind_to_swallow_mail(transport: JetStreamTransport) -> None:
    topic = topics.agent_inbox("quiet")
    await transport.ensure_consumer(topic, "agent-quiet")
    first = await transport.open_puller(topic, "agent-quiet")
    second = await transport.open_puller(topic, "agent-quiet")
    try:
        task = asyncio.create_task(first.fetch(1, 60.0, always_ready))
        await eventually(lambda: first._active is not None)
        first.interrupt()
        # Published at once, before the interrupted fetch has even returned: the
        # abandoned request is off the broker first, so it cannot take this message.
        await transport.publish(topic, event(n=7))
        assert await asyncio.wait_for(task, timeout=10) == []
        msgs = await second.fetch(1, 5.0, always_ready)
        assert len(msgs) == 1 and msgs[0].delivered == 1  # never taken by the abandoned request
        await msgs[0].ack()
    finally:
        await first.close()
        await second.close()


async def test_a_fetch_with_a_closed_gate_asks_the_broker_for_nothing(transport: JetStreamTransport) -> None:
    async with pulling(transport, "gated", event()) as (topic, group, puller):
        assert await puller.fetch(1, 5.0, lambda: False) == []
        info = await transport.consumer_info(topic, group)
        assert info is not None and info["num_ack_pending"] == 0 and info["num_pending"] == 1


async def test_a_hand_back_is_served_at_the_head_and_a_nak_behind_waiting_mail(transport: JetStreamTransport) -> None:
    async with pulling(transport, "order", event(n=1), event(n=2)) as (topic, group, puller):
        (m1,) = await puller.fetch(1, 5.0, always_ready)
        assert Event.from_json(m1.data).payload["n"] == 1
        await m1.nak_head()
        (again,) = await puller.fetch(1, 5.0, always_ready)
        assert Event.from_json(again.data).payload["n"] == 1 and again.delivered == 2
        await again.nak(0.3)
        (m2,) = await puller.fetch(1, 5.0, always_ready)
        assert Event.from_json(m2.data).payload["n"] == 2 and m2.delivered == 1
        await m2.ack()
        (last,) = await puller.fetch(1, 10.0, always_ready)
        assert Event.from_json(last.data).payload["n"] == 1 and last.delivered == 3
        await last.term()
        await drained(transport, topic, group)
        assert await puller.fetch(1, 0.3, always_ready) == []


async def test_a_fetch_on_a_deleted_durable_raises_gone(transport: JetStreamTransport) -> None:
    async with pulling(transport, "doomed") as (topic, group, puller):
        waiting = asyncio.create_task(puller.fetch(1, 60.0, always_ready))
        await eventually(lambda: puller._active is not None)
        await transport.delete_consumer(topic, group)
        with pytest.raises(Gone):
            await asyncio.wait_for(waiting, timeout=10)
        with pytest.raises(Gone):
            await puller.fetch(1, 5.0, always_ready)


# ---------------------------------------------------------------------------
# Sizes


async def test_an_event_at_the_limit_is_stored_and_one_over_is_too_large(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    topic = topics.agent_inbox("big")
    await transport.ensure_consumer(topic, "agent-big")
    with pytest.raises(TooLarge):
        await transport.publish(topic, b"x" * (MAX_PAYLOAD_BYTES + 1))
    assert (await stream_info(raw, "CREWLET_AGENT"))["state"]["messages"] == 0
    at_limit = b"y" * MAX_PAYLOAD_BYTES
    await transport.publish(topic, at_limit, {"Nats-Msg-Id": "big-1"})
    puller = await transport.open_puller(topic, "agent-big")
    try:
        (msg,) = await puller.fetch(1, 10.0, always_ready)
        assert msg.data == at_limit
        await msg.ack()
    finally:
        await puller.close()
    with pytest.raises(TooLarge):
        await transport.ask("crewlet.ask.big", b"z" * (MAX_PAYLOAD_BYTES + 1), 1, 0.1)


# ---------------------------------------------------------------------------
# Broadcast


async def test_a_broadcast_consumer_is_ephemeral_from_now_acking_nothing_and_reaped_after_a_minute(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    await transport.publish("crewlet.events.before", event())
    seen: list[tuple[str, bytes]] = []

    async def on_message(subject: str, data: bytes) -> None:
        seen.append((subject, data))

    bc = await transport.open_broadcast("crewlet.events.>", on_message)
    (consumer,) = [c for c in await consumers_of(raw, "CREWLET_EVENTS") if c["name"].startswith(BROADCAST_PREFIX)]
    cfg = consumer["config"]
    assert not cfg.get("durable_name")
    assert cfg["deliver_policy"] == "new"
    assert cfg["ack_policy"] == "none"
    assert cfg["inactive_threshold"] == 60 * NS
    assert cfg["filter_subject"] == "crewlet.events.>"
    assert await transport.list_consumers(">") == []  # a broadcast is never a subscription
    await transport.publish("crewlet.events.after", b"payload")
    await eventually(lambda: len(seen) == 1)
    assert seen == [("crewlet.events.after", b"payload")]  # history is not replayed
    await bc.close()
    await bc.close()
    assert [c for c in await consumers_of(raw, "CREWLET_EVENTS") if c["name"].startswith(BROADCAST_PREFIX)] == []
    assert bc not in transport._closables  # nothing kept per closed feed
    await transport.publish("crewlet.events.later", b"later")
    assert seen == [("crewlet.events.after", b"payload")]  # closed: no more dispatch


async def test_a_broadcast_narrows_on_the_broker_and_filters_a_wider_pattern_itself(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    assert is_subset("crewlet.events.turn.*", "crewlet.events.>")
    assert not is_subset("crewlet.>", "crewlet.events.>")
    seen: list[str] = []

    async def on_message(subject: str, data: bytes) -> None:
        seen.append(subject)

    bc = await transport.open_broadcast("crewlet.events.turn.*", on_message)
    try:
        (consumer,) = [c for c in await consumers_of(raw, "CREWLET_EVENTS") if c["name"].startswith(BROADCAST_PREFIX)]
        assert consumer["config"]["filter_subject"] == "crewlet.events.turn.*"
        for subject in ("crewlet.events.turn.started", "crewlet.events.turn", "crewlet.events.turn.a.b", "crewlet.events.turn.done"):
            await transport.publish(subject, event())
        await eventually(lambda: len(seen) == 2)
        assert seen == ["crewlet.events.turn.started", "crewlet.events.turn.done"]
    finally:
        await bc.close()


async def test_a_failing_broadcast_handler_does_not_break_its_stream(transport: JetStreamTransport) -> None:
    seen: list[bytes] = []

    async def on_message(subject: str, data: bytes) -> None:
        seen.append(data)
        if data == b"boom":
            raise RuntimeError("handler failure")

    bc = await transport.open_broadcast("crewlet.events.>", on_message)
    try:
        await transport.publish("crewlet.events.a", b"boom")
        await transport.publish("crewlet.events.b", b"fine")
        await eventually(lambda: seen == [b"boom", b"fine"])
    finally:
        await bc.close()


async def test_a_broadcast_on_a_mailbox_stream_never_takes_from_a_durable(transport: JetStreamTransport) -> None:
    topic = topics.agent_inbox("shared")
    await transport.ensure_consumer(topic, "agent-shared")
    seen: list[str] = []

    async def on_message(subject: str, data: bytes) -> None:
        seen.append(subject)

    bc = await transport.open_broadcast("crewlet.agent.>", on_message)
    try:
        await transport.publish(topic, event())
        await eventually(lambda: seen == [topic])

        async def one_pending() -> bool:  # a consumer counts a publish a moment after it is acked
            return await transport.backlog(topic, "agent-shared") == 1

        await eventually(one_pending)
    finally:
        await bc.close()


async def test_a_broadcast_finds_its_feed_again_after_the_broker_restarts(
    broker: EmbeddedBroker, transport: JetStreamTransport
) -> None:
    seen: list[bytes] = []

    async def on_message(subject: str, data: bytes) -> None:
        seen.append(data)

    bc = await transport.open_broadcast("crewlet.events.>", on_message)
    try:
        await broker.stop()  # memory storage: the streams and the ephemeral consumer are gone
        await eventually(lambda: not transport.is_connected)
        await broker.start()
        await eventually(lambda: transport.is_connected)

        async def arrives() -> bool:
            # Live from now: what was published before the consumer came back is not owed.
            await transport.publish("crewlet.events.again", b"again")
            return b"again" in seen

        await eventually(arrives, timeout_s=20)
    finally:
        await bc.close()


# ---------------------------------------------------------------------------
# Scatter / gather on core NATS


async def test_ask_returns_at_once_when_nobody_serves(transport: JetStreamTransport) -> None:
    # The broker answers "no responders"; a one-minute ask ends inside the test's deadline.
    assert await asyncio.wait_for(transport.ask("crewlet.fleet.nobody", b"q", 3, 60.0), timeout=10) == []


async def test_serve_answers_requests_concurrently_and_bytes_survive(transport: JetStreamTransport) -> None:
    release = asyncio.Event()

    async def answer(request: bytes) -> bytes:
        if request == b"slow":
            await release.wait()
        if request == b"fail":
            raise RuntimeError("no answer")
        return b"\x00" + request + b"\xff"

    server = await transport.serve("crewlet.fleet.read", answer)
    try:
        slow = asyncio.create_task(transport.ask("crewlet.fleet.read", b"slow", 1, 30.0))
        assert await transport.ask("crewlet.fleet.read", b"\x00\xfe", 1, 10.0) == [b"\x00\x00\xfe\xff"]
        assert await transport.ask("crewlet.fleet.read", b"fail", 1, 0.3) == []
        release.set()
        assert await slow == [b"\x00slow\xff"]
    finally:
        await server.close()
        await server.close()
