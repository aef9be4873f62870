"""Batches: ``subscribe_batch`` drains, partitions and settles (design: Inbox Batching & Coalescing).

Every case runs on every backend. A drain is built either from a backlog that is
already on the broker when the subscription attaches (so the first fetch takes it
all) or from publishes during a linger. Timestamps are set explicitly wherever the
case is about ordering, so arrival order and timestamp order can disagree. Here:
the linger and the batch size, the delivery budget per message and per
partition, failing partitions and key functions, options at runtime, closing,
and ordering. A gate (pause, hold, detach, deferral) that stops a drain is
test_batch_gates.py's, which builds its drains with the helpers here.
"""
from __future__ import annotations

import asyncio
import json
import math
from datetime import datetime, timedelta, timezone

from crewlet.queue.contract import MAX_DELIVERIES, MAX_LINGER_SECONDS, BatchOptions, Outcome, Partition
from crewlet.queue.queuetest.harness import FIRST, Collector, drained, ev, eventually, inbox

#: What a first delivery says is left.
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
#: A linger that never elapses inside a case: the case always stops it first.
LONG_LINGER = 30.0


def at(i: int, key: str | None, seconds: float):
    """Event ``i`` of conversation ``key`` stamped T0 + ``seconds``."""
    event = ev(i) if key is None else ev(i, k=key)
    event.timestamp = T0 + timedelta(seconds=seconds)
    return event


def by_k(event) -> str:
    return event.payload["k"]


def ids(partition: Partition) -> list:
    return [e.payload["i"] for e in partition.events]


def shapes(col: Collector) -> list[list]:
    return [ids(p) for p in col.items]


def flat(col: Collector) -> list:
    return [d for p in col.items for d in p.deliveries]


async def backlog_of(queue, topic: str, group: str, events) -> None:
    """Mail already waiting on the broker before anything attaches."""
    await queue.ensure_subscription(topic, group)
    for event in events:
        await queue.publish(topic, event)
    assert await queue.backlog(topic, group) == len(events)


async def drain_of(harness, queue, events, partitions: int, opts: BatchOptions | None = None):
    """``events`` waiting on a fresh pair, then a batch consumer (by conversation unless ``opts`` says otherwise).

    Returns once it has been handed ``partitions`` partitions: (topic, group, collector).
    """
    topic, group = inbox()
    await backlog_of(queue, topic, group, events)
    col = Collector(harness)
    await queue.subscribe_batch(topic, group, opts if opts is not None else BatchOptions(partition_key=by_k), col)
    await col.wait_for(partitions)
    return topic, group, col


# ---------------------------------------------------------------------------
# Linger and batch size


async def _dispatches_without_lingering(harness, queue, linger) -> None:
    topic, group = inbox()
    col = Collector(harness)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k, linger_s=linger), col)
    await queue.publish(topic, ev(1, k="c"))
    # Nothing else is coming: a drain that waited for company would never dispatch this.
    await col.wait_for(1)
    await queue.publish(topic, ev(2, k="c"))
    await col.wait_for(2)
    assert shapes(col) == [[1], [2]]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_zero_linger_dispatches_each_event_as_it_arrives(harness, queue):
    assert BatchOptions(linger_s=0).effective_linger_s() == 0.0
    await _dispatches_without_lingering(harness, queue, 0)


async def test_a_negative_linger_is_no_linger(harness, queue):
    assert BatchOptions(linger_s=-5).effective_linger_s() == 0.0
    assert BatchOptions(linger_s=float("nan")).effective_linger_s() == 0.0
    await _dispatches_without_lingering(harness, queue, -5)


async def test_the_linger_is_clamped_to_sixty_seconds_and_max_batch_to_at_least_one(harness, queue):
    assert MAX_LINGER_SECONDS == 60
    assert BatchOptions(linger_s=3600).effective_linger_s() == 60.0
    assert BatchOptions(linger_s=math.inf).effective_linger_s() == 60.0
    assert BatchOptions(linger_s=59.5).effective_linger_s() == 59.5
    assert BatchOptions(max_batch=0).effective_max_batch() == 1
    assert BatchOptions(max_batch=-3).effective_max_batch() == 1
    assert BatchOptions(max_batch=7).effective_max_batch() == 7
    # Behaviour: a max_batch of zero still delivers, one event per drain.
    zero = BatchOptions(partition_key=by_k, max_batch=0)
    topic, group, col = await drain_of(harness, queue, [at(i, "k", i) for i in (1, 2, 3)], 3, zero)
    assert shapes(col) == [[1], [2], [3]]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_events_of_one_key_arriving_within_the_linger_join_one_partition(harness, queue):
    topic, group = inbox()
    col = Collector(harness)
    # Longer than the quiet window, so the window can show the linger holding the first event.
    linger = harness.quiet_s + 0.35
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k, linger_s=linger), col)
    await queue.publish(topic, at(1, "a", 0))
    await col.quiet(expect=0)  # lingering: nothing dispatched yet
    await queue.publish(topic, at(2, "b", 1))
    await queue.publish(topic, at(3, "a", 2))
    await col.wait_for(2)
    assert [(p.key, ids(p)) for p in col.items] == [("a", [1, 3]), ("b", [2])]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_partitions_keep_arrival_order_by_key(harness, queue):
    keys = ["a", "b", "a", "c", "b", "a"]
    topic, group, col = await drain_of(harness, queue, [at(i, k, i) for i, k in enumerate(keys, 1)], 3)
    assert [(p.key, ids(p)) for p in col.items] == [("a", [1, 3, 6]), ("b", [2, 5]), ("c", [4])]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_max_batch_chunks_a_large_backlog(harness, queue):
    pairs_of_two = BatchOptions(partition_key=by_k, max_batch=2)
    topic, group, col = await drain_of(harness, queue, [at(i, "k", i) for i in range(1, 6)], 3, pairs_of_two)
    assert shapes(col) == [[1, 2], [3, 4], [5]]
    await col.quiet()
    await drained(harness, queue, topic, group)


# ---------------------------------------------------------------------------
# The delivery budget, per message and per partition


async def test_a_batch_handler_is_told_the_deliveries_left(harness, queue):
    topic, group = inbox()
    await backlog_of(queue, topic, group, [at(1, "k", 0), at(2, "k", 1)])
    col = Collector(harness, outcome=lambda p: Outcome.NAK if len(col) == 1 else None)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k), col)

    def both_back() -> bool:
        return sorted(d.event.payload["i"] for p in col.items[1:] for d in p.deliveries) == [1, 2]

    await eventually(both_back, harness.wait_s, "both events redelivered")
    first = col.items[0]
    assert ids(first) == [1, 2]
    assert [d.remaining for d in first.deliveries] == [FIRST, FIRST]
    assert first.headroom == FIRST
    assert all(d.remaining == FIRST - 1 for p in col.items[1:] for d in p.deliveries)
    assert all(p.headroom == FIRST - 1 for p in col.items[1:])
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_a_partition_at_mixed_counts_tells_each_message_its_own_and_the_partition_the_minimum(harness, queue):
    topic, group = inbox()
    naks = 3
    opts = BatchOptions(partition_key=by_k, linger_s=0)
    seen: list[Partition] = []

    async def handler(p: Partition):
        seen.append(p)
        if len(seen) == naks:
            # The next drain lingers long enough for the backed-off redelivery to join it,
            # and the hold keeps it from starting before the fresh mail is on the broker.
            opts.linger_s = 0.3
            await sub.hold("build")
        return Outcome.NAK if len(seen) <= naks else None

    sub = await queue.subscribe_batch(topic, group, opts, handler)
    await queue.publish(topic, at(1, "k", 0))
    await eventually(lambda: len(seen) >= naks, harness.wait_s, f"{naks} naks")
    await queue.publish(topic, at(2, "k", 1))
    await queue.publish(topic, at(3, "k", 2))
    await sub.release("build")
    await eventually(lambda: len(seen) >= naks + 1, harness.wait_s, "the mixed partition")
    assert [ids(p) for p in seen[:naks]] == [[1]] * naks
    assert [p.deliveries[0].remaining for p in seen[:naks]] == [FIRST, FIRST - 1, FIRST - 2]
    assert [p.headroom for p in seen[:naks]] == [FIRST, FIRST - 1, FIRST - 2]
    mixed = seen[naks]
    assert ids(mixed) == [1, 2, 3]
    assert [d.remaining for d in mixed.deliveries] == [FIRST - naks, FIRST, FIRST]
    assert mixed.headroom == FIRST - naks
    await drained(harness, queue, topic, group)
    assert len(seen) == naks + 1
    assert await queue.dead_letters() == []


# ---------------------------------------------------------------------------
# Failing partitions and key functions


async def test_a_failing_partition_is_redelivered_alone(harness, queue):
    topic, group = inbox()
    await backlog_of(queue, topic, group, [at(1, "a", 0), at(2, "b", 1), at(3, "a", 2)])
    failed: list[Partition] = []

    def outcome(p: Partition):
        if p.key == "a" and not failed:
            failed.append(p)
            return Outcome.NAK
        return None

    col = Collector(harness, outcome=outcome)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k), col)

    def a_redelivered() -> bool:
        again = [e.payload["i"] for p in col.items[2:] for e in p.events]
        return sorted(again) == [1, 3]

    await eventually(a_redelivered, harness.wait_s, "the failed partition's redelivery")
    await col.quiet()
    assert [(p.key, ids(p)) for p in col.items[:2]] == [("a", [1, 3]), ("b", [2])]
    assert all(p.key == "a" for p in col.items[2:]), shapes(col)
    assert all(d.remaining == FIRST - 1 for p in col.items[2:] for d in p.deliveries)
    assert [d.event.payload["i"] for d in flat(col)].count(2) == 1  # the healthy one was not replayed
    await drained(harness, queue, topic, group)
    assert await queue.dead_letters() == []


async def test_a_failing_partition_is_dead_lettered_alone(harness, queue):
    topic, group = inbox()
    events = [at(1, "a", 0), at(2, "b", 1), at(3, "a", 2)]
    await backlog_of(queue, topic, group, events)
    col = Collector(harness, outcome=lambda p: Outcome.NAK if p.key == "a" else None)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k), col)

    async def two_dead() -> bool:
        return len(await queue.dead_letters()) >= 2

    await eventually(two_dead, 30.0, "both events of the failing partition dead-lettered")
    await drained(harness, queue, topic, group)
    await col.quiet()
    dead = await queue.dead_letters()
    assert sorted(d.event.id for d in dead) == sorted([events[0].id, events[2].id])
    assert all((d.topic, d.group, d.deliveries) == (topic, group, MAX_DELIVERIES) for d in dead)
    delivered = [e.payload["i"] for p in col.items for e in p.events]
    assert delivered.count(1) == MAX_DELIVERIES and delivered.count(3) == MAX_DELIVERIES
    assert delivered.count(2) == 1
    assert [p.key for p in col.items].count("b") == 1
    last = [d for p in col.items for d in p.deliveries if d.event.payload["i"] == 1][-1]
    assert last.remaining == 0


async def test_a_key_function_that_raises_falls_back_to_a_unique_key_per_event(harness, queue):
    topic, group = inbox()

    def key(event) -> str:
        if event.payload.get("bad"):
            raise RuntimeError("no conversation here")
        return event.payload["k"]

    e1, e2, e3, e4 = at(1, "a", 0), ev(2, bad=True), ev(3, bad=True), at(4, "a", 3)
    e2.timestamp, e3.timestamp = T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)
    await backlog_of(queue, topic, group, [e1, e2, e3, e4])
    col = Collector(harness)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=key), col)
    await col.wait_for(3)
    assert [(p.key, ids(p)) for p in col.items] == [
        ("a", [1, 4]),
        (f"event:{e2.id}", [2]),
        (f"event:{e3.id}", [3]),
    ]
    await col.quiet()
    await drained(harness, queue, topic, group)
    assert await queue.dead_letters() == []


# ---------------------------------------------------------------------------
# Options at runtime, and closing


async def test_options_changed_at_runtime_take_effect_on_the_next_cycle(harness, queue):
    topic, group = inbox()
    await backlog_of(queue, topic, group, [at(i, "k", i) for i in range(1, 5)])
    opts = BatchOptions(partition_key=by_k, max_batch=1)

    def grow(p: Partition):
        opts.max_batch = 10  # read again on the next cycle, not this one

    col = Collector(harness, outcome=grow)
    await queue.subscribe_batch(topic, group, opts, col)
    await col.wait_for(2)
    assert shapes(col) == [[1], [2, 3, 4]]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_a_partition_key_changed_at_runtime_takes_effect_on_the_next_cycle(harness, queue):
    topic, group = inbox()
    await backlog_of(queue, topic, group, [at(i, "k", i) for i in range(1, 5)])
    opts = BatchOptions(partition_key=None, max_batch=2)

    def rekey(p: Partition):
        opts.partition_key = by_k

    col = Collector(harness, outcome=rekey)
    await queue.subscribe_batch(topic, group, opts, col)
    await col.wait_for(3)
    # The first drain was already partitioned (uniquely) when the key changed.
    assert shapes(col) == [[1], [2], [3, 4]]
    assert col.items[0].key.startswith("event:") and col.items[1].key.startswith("event:")
    assert col.items[2].key == "k"
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_closing_cancels_a_pending_lingered_flush_and_keeps_the_mail(harness, queue):
    topic, group = inbox()
    col = Collector(harness)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k, linger_s=LONG_LINGER), col)
    await queue.publish(topic, at(1, "a", 0))
    await col.quiet(expect=0)  # collected and lingering
    # The deadline is well inside the linger: a close that waited the flush out fails here.
    await asyncio.wait_for(queue.close(), harness.wait_s)
    other = await harness.client("n2")
    assert await other.backlog(topic, group) == 1
    assert await other.dead_letters() == []
    again = Collector(harness)
    await other.subscribe_batch(topic, group, BatchOptions(partition_key=by_k), again)
    await again.wait_for(1)
    assert shapes(again) == [[1]]
    await again.quiet()
    assert len(col) == 0
    await drained(harness, other, topic, group)


# ---------------------------------------------------------------------------
# Ordering: conversations by age, events by timestamp


async def test_the_oldest_conversation_dispatches_first(harness, queue):
    # The hot conversation's mail arrived first; the waiting one's is older.
    topic, group, col = await drain_of(harness, queue, [at(1, "hot", 10), at(2, "wait", 0), at(3, "hot", 11)], 2)
    assert [(p.key, ids(p)) for p in col.items] == [("wait", [2]), ("hot", [1, 3])]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_within_a_partition_events_are_ordered_by_timestamp(harness, queue):
    topic, group, col = await drain_of(harness, queue, [at(1, "k", 3), at(2, "k", 1), at(3, "k", 2)], 1)
    assert shapes(col) == [[2, 3, 1]]
    stamps = [e.timestamp for e in col.items[0].events]
    assert stamps == sorted(stamps)
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_a_redelivered_event_rejoins_its_conversation_in_timestamp_order(harness, queue):
    topic, group = inbox()
    opts = BatchOptions(partition_key=by_k)

    async def outcome(p: Partition):
        if len(col) == 1:
            # While this one fails, an older and a newer message of its conversation arrive.
            await queue.publish(topic, at(2, "k", 1))
            await queue.publish(topic, at(3, "k", 3))
            opts.linger_s = 0.3  # long enough for the backed-off redelivery to join them
            return Outcome.NAK
        return None

    col = Collector(harness, outcome=outcome)
    await queue.subscribe_batch(topic, group, opts, col)
    await queue.publish(topic, at(1, "k", 2))
    await col.wait_for(2)
    assert shapes(col) == [[1], [2, 1, 3]]
    assert [d.remaining for d in col.items[1].deliveries] == [FIRST, FIRST - 1, FIRST]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_ties_keep_arrival_order(harness, queue):
    topic, group, col = await drain_of(harness, queue, [at(i, k, 5) for i, k in enumerate("baba", 1)], 2)
    assert [(p.key, ids(p)) for p in col.items] == [("b", [1, 3]), ("a", [2, 4])]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_events_without_a_usable_timestamp_do_not_disable_aging(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    await queue.publish(topic, at(1, "hot", 10))
    # An event from a build that wrote no timestamp at all...
    raw = json.loads(ev(2, k="wait").to_json())
    del raw["timestamp"]
    await queue.transport.publish(topic, json.dumps(raw).encode())
    # ...and one from a Go build carrying the zero time, what an unset timestamp marshals to.
    zero = json.loads(ev(3).to_json())
    zero["timestamp"] = "0001-01-01T00:00:00Z"
    await queue.transport.publish(topic, json.dumps(zero).encode())
    await queue.publish(topic, at(4, "hot", 11))
    await queue.publish(topic, at(5, "wait", 0))
    assert await queue.backlog(topic, group) == 5
    col = Collector(harness)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k), col)
    await col.wait_for(3)
    parts = {p.key: ids(p) for p in col.items}
    assert len(col.items) == 3 and parts["hot"] == [1, 4] and sorted(parts["wait"]) == [2, 5]
    keys = [p.key for p in col.items]
    # The waiting conversation still outranks the hot one's fresher mail, and the
    # zero-time event counts as drained now: it does not jump every queue.
    assert keys.index("wait") < keys.index("hot"), keys
    assert keys == ["wait", "hot", keys[2]] and keys[2].startswith("event:"), keys
    await col.quiet()
    await drained(harness, queue, topic, group)
    assert await queue.dead_letters() == []


async def test_a_publish_during_a_batch_does_not_change_what_that_batch_dispatches(harness, queue):
    topic, group = inbox()
    await backlog_of(queue, topic, group, [at(1, "a", 0), at(2, "b", 1)])

    async def outcome(p: Partition):
        if len(col) == 1:
            await queue.publish(topic, at(3, "b", 2))
            await queue.publish(topic, at(4, "a", 3))

    col = Collector(harness, outcome=outcome)
    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=by_k), col)
    await eventually(lambda: len(flat(col)) >= 4, harness.wait_s, "all four events")
    assert [(p.key, ids(p)) for p in col.items[:2]] == [("a", [1]), ("b", [2])]
    later = [d.event.payload["i"] for p in col.items[2:] for d in p.deliveries]
    assert sorted(later) == [3, 4]
    assert all(d.remaining == FIRST for d in flat(col))
    await col.quiet()
    await drained(harness, queue, topic, group)
