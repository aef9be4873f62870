"""JetStream-only facts about what the broker is told: the stream topology, durable consumers and their listing, dead letters.

The behaviour the contract promises is certified for every backend by the
conformance suite (crewlet/queue/queuetest); this file and its neighbours pin
what only the JetStream backend has: what the broker is actually told, and
how nats-py's failures come out as the queue's own errors. Here: the streams
and their retentions, the durables' settings and listing, the dead-letter
stream's headers, the public client over JetStream and the duplicate window.
Pulling, broadcast and ask/serve are tests/queue/test_jetstream_delivery.py's;
reachability and cancellation tests/queue/test_jetstream_reachability.py's. The
fixtures and helpers every one of them uses live here. Every test runs a
real embedded nats-server; nothing about the broker is mocked.
"""
from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import nats
import pytest

from crewlet.events import Event
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.contract import MAX_DELIVERIES, MAX_PAYLOAD_BYTES, Outcome, SubscriptionRef, Timings
from crewlet.queue.errors import InvalidArgument
from crewlet.queue.jetstream.pull import JetStreamPuller
from crewlet.queue.jetstream import META_GROUP, META_TOPIC, JetStreamQueue, JetStreamTransport, durable_name
from crewlet.queue.transport import H_DLQ_DELIVERIES, H_DLQ_GROUP, H_DLQ_TOPIC
from waiting_support import eventually

pytestmark = pytest.mark.integration  # every test here runs a real nats-server


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
