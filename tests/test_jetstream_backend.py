"""JetStream-only facts: the stream topology, consumer settings, listing, broadcast, reconnection.

The behaviour the contract promises is certified for every backend by the
conformance suite (crewlet/queue/queuetest); this file pins what only the
JetStream backend has: what the broker is actually told, and how nats-py's
failures come out as the queue's own errors. Every test runs a real embedded
nats-server; nothing about the broker is mocked.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import nats
import pytest

from crewlet.events import Event
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.contract import MAX_DELIVERIES, MAX_PAYLOAD_BYTES, Outcome, SubscriptionRef, Timings
from crewlet.queue.errors import Gone, InvalidArgument, QueueError, TooLarge, Unavailable
from crewlet.queue.jetstream.pull import JetStreamPuller
from crewlet.queue.jetstream import (
    BROADCAST_PREFIX,
    META_GROUP,
    META_TOPIC,
    JetStreamQueue,
    JetStreamTransport,
    durable_name,
    is_subset,
)
from crewlet.queue.natsclient import LOG_READ_LOOP_ENDED, LatePongClient
from crewlet.queue.transport import H_DLQ_DELIVERIES, H_DLQ_GROUP, H_DLQ_TOPIC
from tests.process_support import is_stopped
from waiting_support import eventually


TIMINGS = Timings(backoff_base_s=0.001, backoff_cap_s=0.005, ack_wait_s=30.0)
NS = 1_000_000_000


def always_ready() -> bool:
    return True


@pytest.fixture
async def broker() -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker(store_dir=None) as b:
        yield b


@pytest.fixture
async def transport(broker: EmbeddedBroker) -> AsyncIterator[JetStreamTransport]:
    async with connected(broker, node="n1", timings=TIMINGS, event_retention_hours=2.0) as t:
        yield t


@pytest.fixture
async def raw(broker: EmbeddedBroker) -> AsyncIterator[nats.NATS]:
    nc = await nats.connect(broker.url)
    yield nc
    await nc.close()


async def api(nc: nats.NATS, suffix: str, body: Optional[dict] = None) -> dict:
    msg = await nc.request(f"$JS.API.{suffix}", json.dumps(body).encode() if body is not None else b"", timeout=5)
    return json.loads(msg.data)


async def stream_info(nc: nats.NATS, name: str) -> dict:
    resp = await api(nc, f"STREAM.INFO.{name}")
    assert "error" not in resp, resp
    return resp


async def consumers_of(nc: nats.NATS, stream: str) -> list[dict]:
    resp = await api(nc, f"CONSUMER.LIST.{stream}", {"offset": 0})
    return resp.get("consumers") or []


def event(kind: str = "test_event", **payload: object) -> bytes:
    return Event(type=kind, payload=dict(payload)).to_json()


@asynccontextmanager
async def connected(broker: EmbeddedBroker, **options: Any) -> AsyncIterator[JetStreamTransport]:
    """A transport on ``broker``, storing as the broker does, closed afterwards."""
    transport = await JetStreamTransport.connect(broker.url, memory_storage=broker.memory_storage, **options)
    try:
        yield transport
    finally:
        await transport.close()


@asynccontextmanager
async def puller_on(transport: JetStreamTransport, topic: str, group: str) -> AsyncIterator[JetStreamPuller]:
    """A puller on the pair's durable, closed afterwards."""
    puller = await transport.open_puller(topic, group)
    try:
        yield puller
    finally:
        await puller.close()


@asynccontextmanager
async def pulling(
    transport: JetStreamTransport, handle: str, *waiting: bytes
) -> AsyncIterator[tuple[str, str, JetStreamPuller]]:
    """Seat ``handle``'s inbox with ``waiting`` already published to it, and one puller on its group, closed after.

    The inbox topic, its group, the puller.
    """
    topic, group = topics.agent_inbox(handle), f"agent-{handle}"
    await transport.ensure_consumer(topic, group)
    for data in waiting:
        await transport.publish(topic, data)
    async with puller_on(transport, topic, group) as puller:
        yield topic, group, puller


async def drained(transport: JetStreamTransport, topic: str, group: str) -> None:
    """Wait for the pair's backlog to empty: acks are fire-and-forget, the broker applies them a moment later."""

    async def settled() -> bool:
        return await transport.backlog(topic, group) == 0

    await eventually(settled)


# ---------------------------------------------------------------------------
# Stream topology


async def test_the_engine_streams_are_provisioned_with_the_designed_retentions(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    expected = {
        "CREWLET_AGENT": ("crewlet.agent.>", "interest", 0, -1),
        "CREWLET_NOTIFICATIONS": ("crewlet.notifications.>", "interest", 0, -1),
        "CREWLET_EVENTS": ("crewlet.events.>", "limits", int(2.0 * 3600 * NS), -1),
        "CREWLET_CONFIG": ("crewlet.config.>", "limits", int(topics.CONFIG_MAX_AGE_S * NS), -1),
        "CREWLET_MEMORY": ("crewlet.memory.>", "limits", 0, 1),
        "CREWLET_DLQ": ("dlq.>", "limits", int(2.0 * 3600 * NS), -1),
    }
    assert {s.name for s in topics.ENGINE_STREAMS} == set(expected)
    for name, (subjects, retention, max_age, per_subject) in expected.items():
        cfg = (await stream_info(raw, name))["config"]
        assert cfg["subjects"] == [subjects], name
        assert cfg["retention"] == retention, name
        assert cfg["max_age"] == max_age, name
        assert cfg["max_msgs_per_subject"] == per_subject, name
        assert cfg["max_msg_size"] >= MAX_PAYLOAD_BYTES, name
        assert cfg["storage"] == "memory", name  # the broker has no store_dir


async def test_streams_are_file_backed_when_the_broker_has_a_store_dir(tmp_path: Path) -> None:
    async with EmbeddedBroker(store_dir=tmp_path / "store") as b:
        assert b.memory_storage is False
        async with connected(b):
            nc = await nats.connect(b.url)
            try:
                for spec in topics.ENGINE_STREAMS:
                    assert (await stream_info(nc, spec.name))["config"]["storage"] == "file"
            finally:
                await nc.close()


async def test_provisioning_twice_is_idempotent_and_realigns_a_drifted_stream(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    cfg = (await stream_info(raw, "CREWLET_CONFIG"))["config"]
    cfg["max_age"] = 5 * NS
    cfg["duplicate_window"] = 5 * NS
    assert "error" not in await api(raw, "STREAM.UPDATE.CREWLET_CONFIG", cfg)
    await transport._ensure_stream(topics.CONFIG_STREAM, force=True)
    assert (await stream_info(raw, "CREWLET_CONFIG"))["config"]["max_age"] == int(topics.CONFIG_MAX_AGE_S * NS)
    await transport.provision()


async def test_another_namespace_gets_its_own_interest_stream_on_first_publish(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    spec = topics.stream_for("acme.jobs")
    assert spec.name.startswith("CREWLET_NS_ACME_")
    assert "error" in await api(raw, f"STREAM.INFO.{spec.name}")
    await transport.publish("acme.jobs", event())
    cfg = (await stream_info(raw, spec.name))["config"]
    assert cfg["subjects"] == ["acme.>"]
    assert cfg["retention"] == "interest"
    assert cfg["max_msg_size"] >= MAX_PAYLOAD_BYTES


async def test_a_publish_nobody_covers_is_dropped_by_the_interest_stream(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    await transport.publish(topics.agent_inbox("nobody"), event())
    assert (await stream_info(raw, "CREWLET_AGENT"))["state"]["messages"] == 0
    assert await transport.ensure_consumer(topics.agent_inbox("ada"), "agent-ada")
    await transport.publish(topics.agent_inbox("ada"), event())
    await transport.publish(topics.agent_inbox("nobody"), event())
    assert (await stream_info(raw, "CREWLET_AGENT"))["state"]["messages"] == 1

    async def one_pending() -> bool:  # a consumer counts a publish a moment after it is acked
        return await transport.backlog(topics.agent_inbox("ada"), "agent-ada") == 1

    await eventually(one_pending)


async def test_a_publish_to_a_stream_deleted_behind_the_clients_back_recreates_it(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    assert (await api(raw, "STREAM.DELETE.CREWLET_EVENTS"))["success"]
    await transport.publish("crewlet.events.turn_started", event())
    assert (await stream_info(raw, "CREWLET_EVENTS"))["state"]["messages"] == 1


# ---------------------------------------------------------------------------
# Durable consumers


async def test_a_durable_consumer_has_the_contract_settings_and_the_pair_in_its_metadata(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    topic, group = "crewlet.agent.ada.inbox", "agent ada.main"
    assert await transport.ensure_consumer(topic, group) is True
    name = durable_name(topic, group)
    info = await api(raw, f"CONSUMER.INFO.CREWLET_AGENT.{name}")
    cfg = info["config"]
    assert info["name"] == name
    assert cfg["durable_name"] == name
    assert cfg["filter_subject"] == topic
    assert cfg["deliver_policy"] == "all"
    assert cfg["ack_policy"] == "explicit"
    assert cfg["ack_wait"] == int(TIMINGS.ack_wait_s * NS)
    assert cfg["max_deliver"] == MAX_DELIVERIES == 25
    assert not cfg.get("backoff")
    assert cfg["max_ack_pending"] >= 1000
    assert cfg["metadata"][META_TOPIC] == topic
    assert cfg["metadata"][META_GROUP] == group
    assert "deliver_subject" not in cfg  # pull, never push


async def test_ensure_consumer_gives_an_existing_durable_the_configured_ack_wait_and_keeps_its_mail(
    broker: EmbeddedBroker, raw: nats.NATS
) -> None:
    topic, group = topics.agent_inbox("elder"), topics.agent_inbox_group("elder")
    name = durable_name(topic, group)
    async with connected(broker, timings=Timings(ack_wait_s=1800.0)) as old:
        assert await old.ensure_consumer(topic, group) is True
        await old.publish(topic, event(n=1))
    before = (await api(raw, f"CONSUMER.INFO.CREWLET_AGENT.{name}"))["config"]
    assert before["ack_wait"] == 1800 * NS  # a mailbox made by a build with the half-hour clock

    async with connected(broker, timings=TIMINGS) as new:
        assert await new.ensure_consumer(topic, group) is False  # not created: aligned
        info = await api(raw, f"CONSUMER.INFO.CREWLET_AGENT.{name}")
        assert info["config"]["ack_wait"] == int(TIMINGS.ack_wait_s * NS)
        assert info["config"]["metadata"] == before["metadata"]
        assert info["config"]["description"] == before["description"]
        assert info["num_pending"] == 1  # the mail it held is still there, in place
        assert await new.list_consumers(topic) == [SubscriptionRef(topic, group)]


async def test_an_in_progress_signal_restarts_the_brokers_ack_clock(broker: EmbeddedBroker, raw: nats.NATS) -> None:
    short = Timings(backoff_base_s=0.001, backoff_cap_s=0.005, ack_wait_s=1.0)
    async with connected(broker, timings=short) as t, pulling(t, "busy", event(n=1)) as (topic, group, puller):
        name = durable_name(topic, group)
        (msg,) = await puller.fetch(1, 5.0, always_ready)
        loop = asyncio.get_running_loop()
        until = loop.time() + 3 * short.ack_wait_s
        while loop.time() < until:  # three ack windows, signalled well inside each
            await msg.in_progress()
            info = await api(raw, f"CONSUMER.INFO.CREWLET_AGENT.{name}")
            assert info["num_redelivered"] == 0 and info["num_ack_pending"] == 1, info
            await asyncio.sleep(short.ack_wait_s / 4)
        await msg.ack()
        await eventually(lambda: _acked(raw, name))


async def _acked(raw: nats.NATS, name: str) -> bool:
    info = await api(raw, f"CONSUMER.INFO.CREWLET_AGENT.{name}")
    return info["num_ack_pending"] == 0 and info["num_pending"] == 0 and info["num_redelivered"] == 0


async def test_ensure_consumer_says_whether_it_created_even_when_callers_race(transport: JetStreamTransport) -> None:
    topic = topics.agent_inbox("racer")
    results = await asyncio.gather(*(transport.ensure_consumer(topic, "agent-racer") for _ in range(6)))
    assert sorted(results) == [False] * 5 + [True]
    assert await transport.ensure_consumer(topic, "agent-racer") is False


async def test_durable_names_are_broker_safe_and_keep_lookalike_pairs_apart() -> None:
    names = {
        durable_name("a.b", "g"),
        durable_name("a_b", "g"),
        durable_name("a.b", "h.i"),
        durable_name("a.b", "h_i"),
        durable_name("a.b", "h i"),
    }
    assert len(names) == 5
    for name in names:
        assert all(c.isalnum() or c in "_-" for c in name), name
    long = durable_name("crewlet.agent." + "x" * 300 + ".inbox", "g" * 300)
    assert len(long) <= 100


async def test_delete_consumer_says_whether_it_deleted(transport: JetStreamTransport) -> None:
    topic = topics.agent_inbox("gone")
    assert await transport.delete_consumer(topic, "agent-gone") is False
    await transport.ensure_consumer(topic, "agent-gone")
    await transport.publish(topic, event())
    assert await transport.delete_consumer(topic, "agent-gone") is True
    assert await transport.delete_consumer(topic, "agent-gone") is False
    assert await transport.backlog(topic, "agent-gone") == 0
    assert await transport.delete_consumer("acme.never.published", "g") is False


async def test_listing_finds_durables_across_engine_and_namespace_streams(transport: JetStreamTransport) -> None:
    pairs = [
        (topics.agent_inbox("ada"), "agent-ada"),
        (topics.agent_control("ada"), "agent-ada-control"),
        (topics.NOTIFICATIONS_INBOUND, "notify"),
        ("acme.jobs", "workers"),
    ]
    for topic, group in pairs:
        await transport.ensure_consumer(topic, group)
    everything = await transport.list_consumers(">")
    assert everything == sorted(SubscriptionRef(t, g) for t, g in pairs)
    assert await transport.list_consumers("crewlet.agent.*.inbox") == [SubscriptionRef(topics.agent_inbox("ada"), "agent-ada")]
    assert await transport.list_consumers("acme.>") == [SubscriptionRef("acme.jobs", "workers")]
    assert await transport.list_consumers("crewlet.events.>") == []


async def test_listing_leaves_out_and_logs_a_durable_whose_metadata_names_another(
    transport: JetStreamTransport, raw: nats.NATS, caplog: pytest.LogCaptureFixture
) -> None:
    topic = topics.agent_inbox("ada")
    await transport.ensure_consumer(topic, "agent-ada")
    impostor = durable_name(topic, "agent-bob")
    cfg = {
        "name": impostor,
        "durable_name": impostor,
        "filter_subject": topic,
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "metadata": {META_TOPIC: topic, META_GROUP: "agent-ada"},  # names another consumer
    }
    assert "error" not in await api(raw, f"CONSUMER.CREATE.CREWLET_AGENT.{impostor}", {"stream_name": "CREWLET_AGENT", "config": cfg})
    bare = "hand_made"
    cfg = {"name": bare, "durable_name": bare, "filter_subject": topic, "ack_policy": "explicit"}
    assert "error" not in await api(raw, f"CONSUMER.CREATE.CREWLET_AGENT.{bare}", {"stream_name": "CREWLET_AGENT", "config": cfg})
    with caplog.at_level(logging.WARNING, logger="crewlet.queue.jetstream"):
        refs = await transport.list_consumers("crewlet.agent.>")
    assert refs == [SubscriptionRef(topic, "agent-ada")]
    unnamed = [r for r in caplog.records if r.getMessage() == "jetstream_subscription_unnamed"]
    assert {r.consumer for r in unnamed} == {impostor, bare}  # type: ignore[attr-defined]


async def test_listing_searches_only_crewlet_streams(transport: JetStreamTransport, raw: nats.NATS) -> None:
    foreign_cfg = {"name": "FOREIGN_APP", "subjects": ["foreign.>"], "retention": "limits", "storage": "memory"}
    assert "error" not in await api(raw, "STREAM.CREATE.FOREIGN_APP", foreign_cfg)
    name = durable_name("foreign.jobs", "g")  # even one that looks exactly like ours
    cfg = {
        "name": name,
        "durable_name": name,
        "filter_subject": "foreign.jobs",
        "ack_policy": "explicit",
        "metadata": {META_TOPIC: "foreign.jobs", META_GROUP: "g"},
    }
    assert "error" not in await api(raw, f"CONSUMER.CREATE.FOREIGN_APP.{name}", {"stream_name": "FOREIGN_APP", "config": cfg})
    await transport.ensure_consumer("acme.jobs", "g")
    assert await transport.list_consumers(">") == [SubscriptionRef("acme.jobs", "g")]
    assert await transport.list_consumers("foreign.>") == []


async def test_listing_refuses_an_empty_or_malformed_pattern(transport: JetStreamTransport) -> None:
    for bad in ("", "a.>.b", "a.b*"):
        with pytest.raises(InvalidArgument):
            await transport.list_consumers(bad)


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


# ---------------------------------------------------------------------------
# Dead letters


async def test_a_dead_letter_keeps_the_bytes_and_carries_the_dlq_headers(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    topic, group = topics.agent_inbox("poison"), "agent-poison"
    data = event(n=13)
    subject = topics.dlq(topic, group)
    await transport.publish(subject, data, {H_DLQ_TOPIC: topic, H_DLQ_GROUP: group, H_DLQ_DELIVERIES: "25"})
    info = await stream_info(raw, "CREWLET_DLQ")
    assert info["state"]["messages"] == 1
    js = raw.jetstream()
    stored = await js.get_msg("CREWLET_DLQ", seq=info["state"]["last_seq"])
    assert stored.subject == subject
    assert stored.data == data
    assert stored.headers is not None
    assert stored.headers[H_DLQ_TOPIC] == topic
    assert stored.headers[H_DLQ_GROUP] == group
    assert stored.headers[H_DLQ_DELIVERIES] == "25"
    (letter,) = await transport.dead_letters(10)
    assert (letter.topic, letter.group, letter.deliveries, letter.data) == (topic, group, 25, data)
    assert letter.ref == str(info["state"]["last_seq"])
    assert [c for c in await consumers_of(raw, "CREWLET_DLQ")] == []  # the reader cleaned up


# ---------------------------------------------------------------------------
# Through the public client


@pytest.fixture
async def queue(broker: EmbeddedBroker) -> AsyncIterator[object]:
    q = await JetStreamQueue.connect(
        broker.url, node="n1", timings=TIMINGS, event_retention_hours=1.0, memory_storage=broker.memory_storage
    )
    yield q
    await q.close()


async def test_the_public_queue_is_the_shared_client_over_jetstream(queue: object) -> None:
    assert queue.name == "jetstream"  # type: ignore[attr-defined]
    assert queue.node == "n1"  # type: ignore[attr-defined]
    got: list[Event] = []

    async def handler(delivery: object) -> None:
        got.append(delivery.event)  # type: ignore[attr-defined]

    topic = topics.agent_inbox("pub")
    sub = await queue.subscribe(topic, "agent-pub", handler)  # type: ignore[attr-defined]
    await queue.publish(topic, Event(type="task_assigned", payload={"k": 1}))  # type: ignore[attr-defined]
    await eventually(lambda: len(got) == 1)
    assert got[0].payload == {"k": 1} and got[0].node == "n1"
    await sub.detach()
    assert await queue.list_subscriptions("crewlet.agent.>") == [SubscriptionRef(topic, "agent-pub")]  # type: ignore[attr-defined]


async def test_a_message_that_keeps_failing_is_dead_lettered_with_its_headers(
    queue: object, raw: nats.NATS
) -> None:
    topic, group = topics.agent_inbox("failing"), "agent-failing"
    calls: list[int] = []

    async def handler(delivery: object) -> Outcome:
        calls.append(delivery.remaining)  # type: ignore[attr-defined]
        return Outcome.NAK

    sub = await queue.subscribe(topic, group, handler)  # type: ignore[attr-defined]
    await queue.publish(topic, Event(type="poison", payload={"n": 1}))  # type: ignore[attr-defined]
    await eventually(lambda: len(calls) == MAX_DELIVERIES, timeout_s=30)

    async def buried() -> bool:
        return (await stream_info(raw, "CREWLET_DLQ"))["state"]["messages"] == 1

    await eventually(buried)
    assert calls == list(range(MAX_DELIVERIES - 1, -1, -1))
    letters = await queue.dead_letters(10)  # type: ignore[attr-defined]
    assert [(d.topic, d.group, d.deliveries) for d in letters] == [(topic, group, MAX_DELIVERIES)]
    assert letters[0].event.payload == {"n": 1}

    async def empty() -> bool:
        return await queue.backlog(topic, group) == 0  # type: ignore[attr-defined]

    await eventually(empty)
    await sub.detach()


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


# -- the duplicate window, the twin against the real thing ---------------------------------


async def test_a_second_publish_under_one_msg_id_is_stored_once_by_jetstream_and_by_the_twin(
    transport: JetStreamTransport, raw: nats.NATS
) -> None:
    """The replay of a dead letter leans on this (transport.replay_msg_id): both backends must drop the twin."""
    from crewlet.queue.memory import MemoryBroker
    from crewlet.queue.transport import H_MSG_ID, replay_msg_id

    subject = topics.event("test_event")
    twin = MemoryBroker(TIMINGS)
    for data in (event(n=1), event(n=2)):
        await transport.publish(subject, data, {H_MSG_ID: replay_msg_id("7")})
        twin.publish(subject, data, {H_MSG_ID: replay_msg_id("7")})
    await transport.publish(subject, event(n=3), {H_MSG_ID: replay_msg_id("8")})
    twin.publish(subject, event(n=3), {H_MSG_ID: replay_msg_id("8")})

    stored = (await stream_info(raw, topics.EVENTS_STREAM.name))["state"]["messages"]
    assert stored == 2, "JetStream kept the first of the two under one id, and the other id"
    assert len(twin._stream(topics.EVENTS_STREAM).messages) == stored
