"""Batches stopped by a gate: a pause, hold, detach or deferral sends a drain back (design: Inbox Batching & Coalescing).

Every case runs on every backend. A gate taken while a drain lingers sends the
whole drain back; one that lands between partitions sends back the partitions
not yet dispatched; either way each message pays exactly one delivery, the
stopped mail comes back in its order ahead of newer mail, and a held batch
subscription is handed nothing and republishes nothing. The drains are built
with test_batches.py's helpers.
"""
from __future__ import annotations

import asyncio

from crewlet.queue.contract import BatchOptions, Outcome, Partition
from crewlet.queue.queuetest.harness import FIRST, Collector, drained, eventually, inbox, state
from crewlet.queue.queuetest.test_batches import LONG_LINGER, at, backlog_of, by_k, flat, ids, shapes


# ---------------------------------------------------------------------------
# A gate taken during the linger: the whole drain goes back, each message paying one


async def _gate_during_linger(harness, queue, take, lift) -> None:
    topic, group = inbox()
    opts = BatchOptions(partition_key=by_k, linger_s=LONG_LINGER)
    col = Collector(harness)
    sub = await queue.subscribe_batch(topic, group, opts, col)
    await queue.publish(topic, at(1, "a", 0))
    await queue.publish(topic, at(2, "b", 1))
    await col.quiet(expect=0)  # collected and lingering
    opts.linger_s = 0.1  # the re-drain need not wait long
    await take(queue, sub)
    await col.quiet(expect=0)  # nothing of the stopped drain was dispatched
    assert await queue.backlog(topic, group) == 2
    assert await queue.dead_letters() == []
    await lift(queue, sub, opts, col)
    await col.wait_for(2)
    assert [(p.key, ids(p)) for p in col.items] == [("a", [1]), ("b", [2])]
    # Being drained was the delivery: each message paid exactly one.
    assert [d.remaining for d in flat(col)] == [FIRST - 1, FIRST - 1]
    await col.quiet()
    await drained(harness, queue, sub.ref.topic, sub.ref.group)


async def _pause(queue, sub):
    await queue.pause_delivery()


async def _resume(queue, sub, opts, col):
    await queue.resume_delivery()


async def _hold(queue, sub):
    await sub.hold("sandbox")


async def _release(queue, sub, opts, col):
    await sub.release("sandbox")


async def _detach(queue, sub):
    assert await sub.detach() is True


async def _reattach(queue, sub, opts, col):
    await queue.subscribe_batch(sub.ref.topic, sub.ref.group, opts, col)


async def test_a_pause_taken_during_the_linger_stops_the_batch_and_each_message_pays_one_delivery(harness, queue):
    await _gate_during_linger(harness, queue, _pause, _resume)


async def test_a_hold_taken_during_the_linger_stops_the_batch_and_each_message_pays_one_delivery(harness, queue):
    await _gate_during_linger(harness, queue, _hold, _release)


async def test_a_detach_during_the_linger_stops_the_batch_and_each_message_pays_one_delivery(harness, queue):
    await _gate_during_linger(harness, queue, _detach, _reattach)


# ---------------------------------------------------------------------------
# A gate landing between partitions: the rest of the drain goes back, each paying one


async def _gate_between_partitions(harness, queue, take, lift, *, first_returns: bool) -> None:
    """Partition "a" takes the gate; "b" and "c" must not be dispatched by that drain.

    ``first_returns`` says whether "a" itself comes back (a deferral hands its own
    partition back too; a pause, hold or detach taken inside a handler that then
    acks does not).
    """
    topic, group = inbox()
    await backlog_of(queue, topic, group, [at(1, "a", 0), at(2, "b", 1), at(3, "c", 2)])
    opts = BatchOptions(partition_key=by_k)

    async def outcome(p: Partition):
        if len(col) == 1:
            return await take(queue, sub)
        return None

    col = Collector(harness, outcome=outcome)
    sub = await queue.subscribe_batch(topic, group, opts, col)
    await col.wait_for(1)
    await col.quiet(expect=1)  # the rest of that drain was not dispatched
    assert shapes(col) == [[1]]
    waiting = 3 if first_returns else 2

    async def backlog_is() -> bool:
        return await queue.backlog(topic, group) == waiting

    await eventually(backlog_is, harness.wait_s, f"{waiting} messages back on the broker")
    assert await queue.dead_letters() == []
    await lift(queue, sub, opts, col)
    back = [1, 2, 3] if first_returns else [2, 3]
    await eventually(lambda: sorted(d.event.payload["i"] for d in flat(col)[1:]) == back, harness.wait_s, f"{back} back")
    rest = flat(col)[1:]
    # Oldest conversation first, and every message that went back paid exactly one delivery.
    assert [d.event.payload["i"] for d in rest] == back
    assert [d.remaining for d in rest] == [FIRST - 1] * len(back)
    await col.quiet()
    await drained(harness, queue, topic, group)


async def _pause_in_handler(queue, sub):
    await queue.pause_delivery()


async def _hold_in_handler(queue, sub):
    await sub.hold("sandbox")


async def _detach_in_handler(queue, sub):
    assert await sub.detach() is True


async def _defer(queue, sub):
    return Outcome.DEFER


async def _unquiesce(queue, sub, opts, col):
    assert await sub.unquiesce() is True


async def test_a_pause_between_partitions_stops_the_rest_of_the_batch(harness, queue):
    await _gate_between_partitions(harness, queue, _pause_in_handler, _resume, first_returns=False)


async def test_a_hold_between_partitions_stops_the_rest_of_the_batch(harness, queue):
    await _gate_between_partitions(harness, queue, _hold_in_handler, _release, first_returns=False)


async def test_a_detach_between_partitions_stops_the_rest_of_the_batch(harness, queue):
    await _gate_between_partitions(harness, queue, _detach_in_handler, _reattach, first_returns=False)


async def test_a_deferral_stops_the_rest_of_the_batch_and_each_message_pays_one_delivery(harness, queue):
    await _gate_between_partitions(harness, queue, _defer, _unquiesce, first_returns=True)


async def test_a_stopped_drain_comes_back_in_its_order_ahead_of_newer_mail(harness, queue):
    topic, group = inbox()
    await backlog_of(queue, topic, group, [at(i, k, i) for i, k in enumerate("abcd", 1)])
    opts = BatchOptions(partition_key=by_k)

    async def outcome(p: Partition):
        if len(col) == 1:
            opts.max_batch = 1  # from now on one message per drain: the broker's order shows
            await sub.hold("sandbox")

    col = Collector(harness, outcome=outcome)
    sub = await queue.subscribe_batch(topic, group, opts, col)
    await col.wait_for(1)
    await queue.publish(topic, at(5, "e", 5))
    await col.quiet(expect=1)
    await sub.release("sandbox")
    await col.wait_for(5)
    assert shapes(col) == [[1], [2], [3], [4], [5]]
    assert [d.remaining for d in flat(col)] == [FIRST, FIRST - 1, FIRST - 1, FIRST - 1, FIRST]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_a_held_batch_subscription_is_handed_nothing_and_nothing_is_republished(harness, queue):
    topic, group = inbox()
    wire = Collector(harness)  # sees every message the broker stores on the topic
    stream = await queue.subscribe_stream(topic, wire.stream_handler)
    col = Collector(harness)
    sub = await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k), col)
    await sub.hold("sandbox")
    for i in (1, 2, 3):
        await queue.publish(topic, at(i, "k", i))
    await wire.wait_for(3)
    # Nothing handed over, and no park: nothing went round the broker again.
    await asyncio.gather(col.quiet(expect=0), wire.quiet(expect=3))
    backlogs, dead, listing = await state(queue, (topic, group))
    assert backlogs == (3,) and dead == []
    await sub.release("sandbox")
    await eventually(lambda: len(flat(col)) >= 3, harness.wait_s, "the held mail")
    assert [d.event.payload["i"] for d in flat(col)] == [1, 2, 3]
    # The mail waited on the broker: its delivery count is intact.
    assert [d.remaining for d in flat(col)] == [FIRST] * 3
    await asyncio.gather(wire.quiet(expect=3), col.quiet())
    await drained(harness, queue, topic, group)
    assert await queue.list_subscriptions(">") == listing
    await stream.close()
