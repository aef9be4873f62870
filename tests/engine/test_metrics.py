"""The queue client tells the engine's metrics of every settlement it decides: ack, nak, defer and dead letter.

On the certified in-memory twin (the same client code as JetStream), with
the delivery budget's backoff shrunk through the injected Timings, so a whole
budget of naks is spent in milliseconds. A second registry in the same
process counts nothing of the first's: there is no global one.
"""
from __future__ import annotations

import pytest

from crewlet import events
from crewlet.events import Trace
from crewlet.events.types import DEAD_LETTER_MAX_DELIVERIES, AgentTurnCompleted, TaskAssigned
from crewlet.engine.metrics import EngineMetrics
from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, Delivery, Outcome
from crewlet.queue.errors import Unavailable
from seats_support import memory_queues
from waiting_support import eventually

SEAT = "ada"
TOPIC, GROUP = topics.agent_inbox(SEAT), topics.agent_inbox_group(SEAT)


def sample(metrics: EngineMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_each_settlement_is_counted_once_under_its_stream_and_outcome_and_a_burial_as_a_dead_letter() -> None:
    metrics, other = EngineMetrics(), EngineMetrics()
    async with memory_queues("n1") as (_broker, [queue]):
        queue.add_observer(metrics)
        await queue.ensure_subscription(TOPIC, GROUP)
        decisions = {"ack": Outcome.ACK, "nak": Outcome.NAK, "defer": Outcome.DEFER}

        async def handler(delivery: Delivery) -> Outcome:
            return decisions[delivery.event.data.title]

        for title in ("ack", "nak"):
            await queue.publish(TOPIC, events.new(TaskAssigned(seat=SEAT, title=title), Trace.root()))
        await queue.subscribe(TOPIC, GROUP, handler)
        stream = "CREWLET_AGENT"
        await eventually(
            lambda: sample(metrics, "crewlet_queue_dead_letters_total", stream=stream, reason=DEAD_LETTER_MAX_DELIVERIES) == 1,
            what="the nakked message buried",
        )
        assert sample(metrics, "crewlet_queue_deliveries_total", stream=stream, outcome="ack") == 1
        assert sample(metrics, "crewlet_queue_deliveries_total", stream=stream, outcome="nak") == MAX_DELIVERIES - 1
        assert sample(metrics, "crewlet_queue_deliveries_total", stream=stream, outcome="dead_letter") == 1

        await queue.publish(TOPIC, events.new(TaskAssigned(seat=SEAT, title="defer"), Trace.root()))
        await eventually(
            lambda: sample(metrics, "crewlet_queue_deliveries_total", stream=stream, outcome="defer") == 1,
            what="the deferral counted",
        )
        assert sample(metrics, "crewlet_queue_publishes_total", stream=stream, outcome="ok") == 3
        # The queue's records went to the events stream: a retry per failure with deliveries left, and the burial.
        assert sample(metrics, "crewlet_queue_publishes_total", stream="CREWLET_EVENTS", outcome="ok") == MAX_DELIVERIES
    assert sample(other, "crewlet_queue_publishes_total", stream=stream, outcome="ok") == 0


async def test_a_turn_event_moves_the_turn_metrics_and_a_failed_publish_is_counted_as_failed_and_no_turn() -> None:
    metrics = EngineMetrics()
    async with memory_queues("n1") as (broker, [queue]):
        queue.add_observer(metrics)
        done = AgentTurnCompleted(seat=SEAT, input_tokens=7, output_tokens=3, duration_ms=1500)
        await queue.publish(topics.event("agent_turn_completed"), events.new(done, Trace.root()))
        failed = AgentTurnCompleted(seat=SEAT, failed=True, duration_ms=20)
        await queue.publish(topics.event("agent_turn_completed"), events.new(failed, Trace.root()))
        assert sample(metrics, "crewlet_turns_completed_total") == 1
        assert sample(metrics, "crewlet_turns_failed_total") == 1
        assert sample(metrics, "crewlet_turn_seconds_count") == 2
        assert sample(metrics, "crewlet_turn_seconds_sum") == 1.52
        assert sample(metrics, "crewlet_llm_tokens_total", kind="input") == 7
        assert sample(metrics, "crewlet_llm_tokens_total", kind="output") == 3

        broker.go_away()
        with pytest.raises(Unavailable):
            await queue.publish(TOPIC, events.new(TaskAssigned(seat=SEAT), Trace.root()))
        with pytest.raises(Unavailable):  # a turn's record that did not get out is no turn yet (its retry counts it)
            await queue.publish(topics.event("agent_turn_completed"), events.new(done, Trace.root()))
        assert sample(metrics, "crewlet_queue_publishes_total", stream="CREWLET_AGENT", outcome="failed") == 1
        assert sample(metrics, "crewlet_queue_publishes_total", stream="CREWLET_EVENTS", outcome="failed") == 1
        assert sample(metrics, "crewlet_turns_completed_total") == 1

