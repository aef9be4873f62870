"""Telemetry publishing (crewlet.queue.emit): a broker that is away for seconds costs no event.

On the in-memory twin (its broker made unreachable and brought back) and on a
real nats-server killed and restarted by its supervisor on the same file
store, with short injected retry durations; every wait is for a condition.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from crewlet.events import Event, Trace
from crewlet.queue.emit import LOG_DROPPED, LOG_EXPIRED, Emitter
from crewlet.events.types import SeatPaused
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue, Outcome
from crewlet.queue.memory import MemoryBroker
from waiting_support import eventually

TOPIC = topics.event(SeatPaused.event_type)
GROUP = "emit-audit"


async def _read_all(queue: Any, held: int) -> list[Event]:
    """Every event the audit subscription holds, in stream order."""
    got: list[Event] = []

    async def take(delivery: Any) -> Outcome:
        got.append(delivery.event)
        return Outcome.ACK

    sub = await queue.subscribe(TOPIC, GROUP, take)
    try:
        await eventually(lambda: len(got) >= held, what=f"{held} events read back")
    finally:
        await sub.detach()
    return got


@contextlib.asynccontextmanager
async def emitter_on_the_twin(
    *, audited: bool = True, **options: Any
) -> AsyncIterator[tuple[MemoryBroker, EventQueue, Emitter]]:
    """An :class:`Emitter` with ``options`` on a twin client (holding the audit subscription when ``audited``).

    When the block ends the broker is reachable again, and the emitter and its client are closed.
    """
    broker = MemoryBroker()
    queue = broker.client("n1")
    if audited:
        await queue.ensure_subscription(TOPIC, GROUP)
    emitter = Emitter(queue, **options)
    try:
        yield broker, queue, emitter
    finally:
        broker.come_back()
        await emitter.close()
        await queue.close()


async def test_a_telemetry_event_published_while_the_memory_broker_is_away_arrives_once_it_is_back() -> None:
    async with emitter_on_the_twin(retry_window_s=30.0, retry_first_s=0.01, retry_max_s=0.05) as (broker, queue, emitter):
        broker.go_away()
        event = await emitter.emit(SeatPaused(seat="ada"), Trace.root(), log_event="test_publish_failed")
        assert emitter.pending == 1, "the failed publish is held, not dropped"
        broker.come_back()
        await eventually(lambda: emitter.pending == 0 and emitter.retried == 1, what="the held event published")
        assert [e.id for e in await _read_all(queue, 1)] == [event.id]


async def test_past_max_pending_the_oldest_held_event_is_dropped_with_a_counted_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with emitter_on_the_twin(
        max_pending=2, retry_window_s=30.0, retry_first_s=0.01, retry_max_s=0.05
    ) as (broker, queue, emitter):
        broker.go_away()
        with caplog.at_level(logging.WARNING, logger="crewlet.queue.emit"):
            sent = [
                await emitter.emit(SeatPaused(seat=f"s{i}"), Trace.root(), log_event="test_publish_failed")
                for i in range(3)
            ]
        assert emitter.pending == 2 and emitter.dropped == 1
        drops = [r for r in caplog.records if r.getMessage() == LOG_DROPPED]
        assert len(drops) == 1 and drops[0].event_id == sent[0].id and drops[0].dropped == 1
        broker.come_back()
        await eventually(lambda: emitter.pending == 0, what="the held events published")
        assert [e.id for e in await _read_all(queue, 2)] == [sent[1].id, sent[2].id]


async def test_an_event_held_past_its_window_is_given_up_with_a_counted_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with emitter_on_the_twin(
        audited=False, retry_window_s=0.05, retry_first_s=0.01, retry_max_s=0.02
    ) as (broker, queue, emitter):
        broker.go_away()
        with caplog.at_level(logging.WARNING, logger="crewlet.queue.emit"):
            event = await emitter.emit(SeatPaused(seat="ada"), Trace.root(), log_event="test_publish_failed")
            await eventually(lambda: emitter.expired == 1 and emitter.pending == 0, what="the event given up")
        expired = [r for r in caplog.records if r.getMessage() == LOG_EXPIRED]
        assert len(expired) == 1 and expired[0].event_id == event.id and expired[0].expired == 1


async def test_a_failure_no_retry_can_cure_is_logged_and_not_held(caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    queue = broker.client("n1")
    emitter = Emitter(queue, retry_first_s=0.01)
    await queue.close()  # a closed client refuses every verb for good
    with caplog.at_level(logging.WARNING):
        await emitter.emit(SeatPaused(seat="ada"), Trace.root(), log_event="test_publish_failed", seat="ada")
    assert emitter.pending == 0
    failed = [r for r in caplog.records if r.getMessage() == "test_publish_failed"]
    assert len(failed) == 1 and failed[0].seat == "ada" and failed[0].retrying is False
    await emitter.close()


@pytest.mark.integration
async def test_across_a_real_nats_server_kill_and_restart_every_telemetry_event_arrives(tmp_path: Path) -> None:
    """Events emitted while the broker is down are held and published once the supervisor has restarted it."""
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue
    from seats_support import FAST

    async with EmbeddedBroker(store_dir=tmp_path / "jetstream") as broker:
        queue = await JetStreamQueue.connect(broker.url, node="n1", timings=FAST)
        await queue.ensure_subscription(TOPIC, GROUP)
        emitter = Emitter(queue, retry_window_s=60.0, retry_first_s=0.05, retry_max_s=0.5)
        try:
            before = await emitter.emit(SeatPaused(seat="before"), Trace.root(), log_event="test_publish_failed")
            restarts = broker.restarts
            await broker.kill()
            await eventually(lambda: not queue.connected, what="the client sees the broker gone")
            during = [
                await emitter.emit(SeatPaused(seat=f"during{i}"), Trace.root(), log_event="test_publish_failed")
                for i in range(5)
            ]
            assert emitter.pending == 5, "every publish while the broker is down is held"
            await eventually(lambda: broker.restarts > restarts, timeout_s=30.0, what="the supervisor restarted it")
            await eventually(lambda: emitter.pending == 0, timeout_s=30.0, what="the held events published")
            assert emitter.retried == 5 and emitter.dropped == 0 and emitter.expired == 0
            got = await _read_all(queue, 6)
            assert [e.id for e in got] == [before.id] + [e.id for e in during]
        finally:
            await emitter.close()
            await queue.close()
