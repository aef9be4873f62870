"""Conformance: hand-backs and the delivery budget (docs/design.md § Core delivery), on every backend.

Design: docs/design.md § Delivery semantics. A Nak returns behind the mail
that was waiting, a Defer at the head; each hand-back spends one delivery,
and past the budget the event is dead-lettered once; the deliveries left read
the same per message and per partition of one. Every case runs against each
backend through the ``harness`` / ``queue`` fixtures.
"""
from __future__ import annotations

import asyncio

import pytest

from crewlet.queue.contract import MAX_DELIVERIES, BatchOptions, Outcome, SubscriptionRef
from crewlet.queue.queuetest.harness import (
    FIRST,
    Collector,
    attached,
    drained,
    ev,
    eventually,
    inbox,
    only,
    publish_all,
)
from crewlet.queue.queuetest.test_core_delivery import remaining


def once(event, outcome):
    """A handler's verdict: ``outcome`` for the first delivery of ``event``, an ack for everything else."""
    done = set()

    def decide(delivery):
        if delivery.event.id == event.id and event.id not in done:
            done.add(event.id)
            return outcome
        return None

    return decide


# ---------------------------------------------------------------------------
# Nak, Defer, the delivery budget


async def test_nak_twice_then_ack_is_three_deliveries(harness, queue):
    topic, group, col, _ = await attached(harness, queue, lambda d: Outcome.NAK if len(col) <= 2 else None)
    sent = ev("flaky")
    await queue.publish(topic, sent)
    await col.wait_for(3)
    await col.quiet(3)
    assert [d.event.id for d in col.items] == [sent.id] * 3
    assert remaining(col) == [FIRST, FIRST - 1, FIRST - 2]
    await drained(harness, queue, topic, group)
    assert await queue.dead_letters() == []


async def test_a_handler_never_runs_under_a_cancelled_context_inherited_from_its_publisher(harness, queue):
    topic, group = inbox()
    started, proceed = asyncio.Event(), asyncio.Event()
    seen: dict = {}

    async def handler(delivery):
        seen["task"] = asyncio.current_task()
        started.set()
        try:
            await proceed.wait()
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        task = asyncio.current_task()
        assert task is not None
        seen["cancelling"] = task.cancelling()
        seen["finished"] = True

    col = Collector(harness, handler)
    await queue.subscribe(topic, group, col)

    async def publisher():
        await queue.publish(topic, ev("from-a-request"))
        await asyncio.Event().wait()  # the request goes on until it is cancelled

    pub = asyncio.create_task(publisher())
    await asyncio.wait_for(started.wait(), harness.wait_s)
    pub.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pub
    proceed.set()
    await eventually(lambda: seen.get("finished") or seen.get("cancelled"), harness.wait_s, "the handler to finish")
    assert not seen.get("cancelled"), "the publisher's cancellation reached the handler"
    assert seen["task"] is not pub
    assert seen["cancelling"] == 0
    await drained(harness, queue, topic, group)
    await col.quiet(1)


async def test_a_nak_returns_behind_the_mail_that_was_waiting(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    e1, e2 = await publish_all(queue, topic, [ev(1), ev(2)])
    col = Collector(harness, once(e1, Outcome.NAK))
    await queue.subscribe(topic, group, col)
    await col.wait_for(3)
    assert col.payloads() == [1, 2, 1]
    assert remaining(col) == [FIRST, FIRST, FIRST - 1]
    await col.quiet(3)
    await drained(harness, queue, topic, group)


async def test_a_defer_returns_at_the_head_and_quiesces_the_consumer(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    e1, e2 = await publish_all(queue, topic, [ev(1), ev(2)])
    col = Collector(harness, once(e1, Outcome.DEFER))
    sub = await queue.subscribe(topic, group, col)
    await col.wait_for(1)
    await col.quiet(1)  # the consumer quiesced itself: e2 is not taken either
    await only(queue, {(topic, group): 2})
    assert await sub.unquiesce() is True
    await col.wait_for(3)
    assert col.payloads() == [1, 1, 2]
    assert remaining(col) == [FIRST, FIRST - 1, FIRST]
    await col.quiet(3)
    await drained(harness, queue, topic, group)
    assert await queue.dead_letters() == []


async def test_after_the_delivery_budget_the_event_is_dead_lettered_once_and_the_backlog_is_empty(harness, queue):
    topic, group, col, _ = await attached(harness, queue, lambda d: Outcome.NAK)
    poison = ev("poison")
    await queue.publish(topic, poison)
    await col.wait_for(MAX_DELIVERIES)
    await eventually(queue.dead_letters, harness.wait_s, "the dead letter")
    await col.quiet(MAX_DELIVERIES)
    assert remaining(col) == list(range(MAX_DELIVERIES - 1, -1, -1))
    (dead,) = await queue.dead_letters()
    assert (dead.topic, dead.group, dead.deliveries) == (topic, group, MAX_DELIVERIES)
    assert dead.event.id == poison.id and dead.event.payload == poison.payload
    assert dead.event.node == queue.node, "the dead letter keeps the origin node"
    await drained(harness, queue, topic, group)
    assert await queue.list_subscriptions(topic) == [SubscriptionRef(topic, group)], "dead-lettering keeps the mailbox"


async def test_a_deferral_spends_one_delivery_like_every_other_hand_back(harness, queue):
    topic, group = inbox()
    plan = [Outcome.DEFER, Outcome.NAK, Outcome.DEFER, None]
    col = Collector(harness, lambda d: plan[len(col) - 1])
    sub = await queue.subscribe(topic, group, col)
    await queue.publish(topic, ev("handed-off"))
    for k, outcome in enumerate(plan, start=1):
        await col.wait_for(k)
        if outcome is Outcome.DEFER:
            await eventually(sub.unquiesce, harness.wait_s, "the deferral to quiesce the consumer")
    await col.quiet(len(plan))
    assert remaining(col) == [FIRST, FIRST - 1, FIRST - 2, FIRST - 3]
    await drained(harness, queue, topic, group)


async def test_a_message_deferred_every_time_is_dead_lettered_after_the_same_budget(harness, queue):
    topic, group, col, sub = await attached(harness, queue, lambda d: Outcome.DEFER)
    handed = ev("always-handed-back")
    await queue.publish(topic, handed)
    for k in range(1, MAX_DELIVERIES + 1):
        await col.wait_for(k)
        if k < MAX_DELIVERIES:
            await eventually(sub.unquiesce, harness.wait_s, f"deferral {k} to quiesce the consumer")
    await eventually(queue.dead_letters, harness.wait_s, "the dead letter")
    assert remaining(col) == list(range(MAX_DELIVERIES - 1, -1, -1))
    (dead,) = await queue.dead_letters()
    assert (dead.topic, dead.group, dead.deliveries, dead.event.id) == (topic, group, MAX_DELIVERIES, handed.id)
    await drained(harness, queue, topic, group)
    await eventually(sub.unquiesce, harness.wait_s, "the last deferral to quiesce the consumer")
    await col.quiet(MAX_DELIVERIES)


async def test_the_deliveries_left_read_per_message_and_per_partition_of_one_are_the_same(harness, queue):
    topic, _ = inbox()
    per_message = Collector(harness, lambda d: Outcome.NAK if len(per_message) <= 2 else None)
    per_partition = Collector(harness, lambda p: Outcome.NAK if len(per_partition) <= 2 else None)
    await queue.subscribe(topic, "per-message", per_message)
    await queue.subscribe_batch(topic, "per-partition", BatchOptions(max_batch=1), per_partition)
    sent = ev("counted")
    await queue.publish(topic, sent)
    await per_message.wait_for(3)
    await per_partition.wait_for(3)
    await per_message.quiet(3)
    assert len(per_partition) == 3
    expected = [FIRST, FIRST - 1, FIRST - 2]
    assert remaining(per_message) == expected
    assert all(len(p.deliveries) == 1 and p.deliveries[0].event.id == sent.id for p in per_partition.items)
    assert [p.deliveries[0].remaining for p in per_partition.items] == expected
    assert [p.headroom for p in per_partition.items] == expected
