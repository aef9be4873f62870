"""Holds, pausing, and handlers in flight (docs/design.md § Core delivery).

A held (topic, group) is handed nothing: its mail waits on the broker with its
order and its delivery count intact, and nothing goes round the broker again
while it waits (design: "A held seat costs nothing while it waits").
"""
from __future__ import annotations

import asyncio

import pytest

from crewlet.queue.contract import Outcome
from crewlet.queue.queuetest.harness import FIRST, Collector, attached, drained, ev, eventually, inbox, only, state


def payloads(col: Collector) -> list:
    return col.payloads()


async def flushed(harness, queue, col: Collector, topic: str, group: str, expected: list) -> None:
    """Once the gate lifts: ``expected`` arrives in order and no more, none of it having spent a delivery while
    it waited, and the pair's backlog drains."""
    await col.wait_for(len(expected))
    assert payloads(col) == expected
    assert [d.remaining for d in col.items] == [FIRST] * len(expected)
    await col.quiet()
    await drained(harness, queue, topic, group)


#: Two keys held on one pair and then released one at a time, each verb taken through the subscription
#: ("sub") or through the (topic, group) pair ("pair"): the gate stays until the last key goes.
TWO_KEYS = {
    "held-through-the-subscription-and-the-pair": (
        (("sub", "sandbox"), ("pair", "budget")),
        (("sub", "sandbox"), ("pair", "budget")),
    ),
    "both-held-through-the-subscription-one-released-through-the-pair": (
        (("sub", "sandbox"), ("sub", "no-provider")),
        (("pair", "sandbox"), ("sub", "no-provider")),
    ),
}


async def test_a_held_subscription_keeps_its_mail_while_other_topics_flow_and_flushes_in_order_on_release(
    harness, queue
):
    held_topic, held_group = inbox("held")
    free_topic, free_group = inbox("free")
    held, free = Collector(harness), Collector(harness)
    wire = Collector(harness)  # every message the broker stores on the held topic
    stream = await queue.subscribe_stream(held_topic, wire.stream_handler)
    await queue.subscribe(held_topic, held_group, held)
    await queue.subscribe(free_topic, free_group, free)
    await queue.hold(held_topic, held_group, "sandbox")
    for i in (1, 2, 3):
        await queue.publish(held_topic, ev(i))
        await queue.publish(free_topic, ev(10 + i))
    await free.wait_for(3)
    assert payloads(free) == [11, 12, 13]
    await wire.wait_for(3)
    # Nothing handed over, and nothing parked, requeued or republished.
    await asyncio.gather(held.quiet(expect=0), wire.quiet(expect=3))
    backlogs, dead, listing = await state(queue, (held_topic, held_group))
    assert backlogs == (3,) and dead == []
    await queue.release(held_topic, held_group, "sandbox")
    await held.wait_for(3)
    assert payloads(held) == [1, 2, 3]
    # It waited on the broker, so no delivery was spent while it was held.
    assert [d.remaining for d in held.items] == [FIRST] * 3
    await asyncio.gather(held.quiet(), wire.quiet(expect=3))
    await drained(harness, queue, held_topic, held_group)
    assert await queue.list_subscriptions(">") == listing
    await stream.close()


async def test_a_hold_taken_before_attaching_gates_the_attachment_from_the_start(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    await queue.publish(topic, ev(1))
    await queue.hold(topic, group, "recovered-run")
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    await queue.publish(topic, ev(2))
    await col.quiet(expect=0)
    backlogs, dead, _ = await state(queue, (topic, group))
    assert backlogs == (2,) and dead == []
    await queue.release(topic, group, "recovered-run")
    await flushed(harness, queue, col, topic, group, [1, 2])


@pytest.mark.parametrize("holds, releases", list(TWO_KEYS.values()), ids=list(TWO_KEYS))
async def test_holds_are_scoped_by_key_so_releasing_one_of_two_keeps_the_gate(harness, queue, holds, releases):
    topic, group, col, sub = await attached(harness, queue)

    def take(via: str, verb: str, key: str):
        return getattr(sub, verb)(key) if via == "sub" else getattr(queue, verb)(topic, group, key)

    for via, key in holds:
        await take(via, "hold", key)
    await queue.publish(topic, ev(1))
    (first_via, first_key), (last_via, last_key) = releases
    await take(first_via, "release", first_key)
    await col.quiet(expect=0)  # the other key still holds it
    await only(queue, {(topic, group): 1})
    await take(last_via, "release", last_key)
    await flushed(harness, queue, col, topic, group, [1])


async def test_holding_the_same_key_twice_is_one_hold(harness, queue):
    topic, group, col, sub = await attached(harness, queue)
    await sub.hold("sandbox")
    await queue.hold(topic, group, "sandbox")
    await queue.publish(topic, ev(1))
    await col.quiet(expect=0)
    await sub.release("sandbox")  # one release lifts it
    await flushed(harness, queue, col, topic, group, [1])


async def test_holds_are_scoped_by_the_topic_group_pair_so_a_sibling_group_is_not_gated(harness, queue):
    topic, group = inbox()
    sibling_group = group + "-audit"
    other_topic = topic.replace(".inbox", ".control")
    held, sibling, same_group_other_topic = Collector(harness), Collector(harness), Collector(harness)
    await queue.subscribe(topic, group, held)
    await queue.subscribe(topic, sibling_group, sibling)
    await queue.subscribe(other_topic, group, same_group_other_topic)
    await queue.hold(topic, group, "sandbox")
    await queue.publish(topic, ev(1))
    await queue.publish(other_topic, ev(2))
    await sibling.wait_for(1)
    await same_group_other_topic.wait_for(1)
    assert payloads(sibling) == [1] and payloads(same_group_other_topic) == [2]
    await held.quiet(expect=0)
    assert await queue.backlog(topic, group) == 1
    await queue.release(topic, group, "sandbox")
    await held.wait_for(1)
    assert payloads(held) == [1]
    await held.quiet()
    for t, g in ((topic, group), (topic, sibling_group), (other_topic, group)):
        await drained(harness, queue, t, g)


async def test_releasing_an_unheld_pair_is_a_no_op(harness, queue):
    topic, group = inbox()
    never_held_topic, never_held_group = inbox("never")
    col = Collector(harness)
    sub = await queue.subscribe(topic, group, col)
    before = await state(queue, (topic, group), (never_held_topic, never_held_group))
    await queue.release(never_held_topic, never_held_group, "sandbox")  # a pair this client never touched
    await queue.release(topic, group, "sandbox")  # attached, never held
    await sub.release("sandbox")
    assert await state(queue, (topic, group), (never_held_topic, never_held_group)) == before
    await queue.publish(topic, ev(1))
    await col.wait_for(1)  # still ungated
    await sub.hold("sandbox")
    await sub.release("other-key")  # a key that is not held releases nothing
    await queue.publish(topic, ev(2))
    await col.quiet(expect=1)
    await sub.release("sandbox")
    await col.wait_for(2)
    assert payloads(col) == [1, 2]
    await col.quiet()
    await drained(harness, queue, topic, group)


async def test_pausing_all_delivery_still_accepts_publishes(harness, queue):
    pairs = [inbox("a"), inbox("b")]
    cols = [Collector(harness), Collector(harness)]
    for (topic, group), col in zip(pairs, cols):
        await queue.subscribe(topic, group, col)
    await queue.pause_delivery()
    for i, (topic, _) in enumerate(pairs):
        await queue.publish(topic, ev(i))
        await queue.publish(topic, ev(i + 10))
    await asyncio.gather(*(col.quiet(expect=0) for col in cols))
    backlogs, dead, _ = await state(queue, *pairs)
    assert backlogs == (2, 2) and dead == []
    await queue.resume_delivery()
    for i, col in enumerate(cols):
        await col.wait_for(2)
        assert payloads(col) == [i, i + 10]
        assert [d.remaining for d in col.items] == [FIRST, FIRST]
    await asyncio.gather(*(col.quiet() for col in cols))
    for topic, group in pairs:
        await drained(harness, queue, topic, group)


async def test_pausing_and_holding_are_idempotent(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    await queue.pause_delivery()
    await queue.pause_delivery()
    await queue.publish(topic, ev(1))
    await col.quiet(expect=0)
    await only(queue, {(topic, group): 1})
    await queue.resume_delivery()  # one resume undoes any number of pauses
    await col.wait_for(1)
    await queue.resume_delivery()  # and resuming twice is harmless
    await queue.publish(topic, ev(2))
    await col.wait_for(2)
    await queue.hold(topic, group, "sandbox")
    await queue.hold(topic, group, "sandbox")
    await queue.publish(topic, ev(3))
    await col.quiet(expect=2)
    await only(queue, {(topic, group): 1})
    await queue.release(topic, group, "sandbox")  # one release lifts a key however often it was held
    await col.wait_for(3)
    assert payloads(col) == [1, 2, 3]
    await col.quiet()
    await drained(harness, queue, topic, group)


# ---------------------------------------------------------------------------
# Handlers in flight


async def test_handlers_in_flight_can_be_counted_and_waited_for(harness, queue):
    gate = asyncio.Event()
    started = Collector(harness)

    async def blocking(item):
        await started(item)
        await gate.wait()

    assert queue.in_flight() == 0
    assert await queue.wait_idle(0) is True
    pairs = [inbox("a"), inbox("b")]
    for topic, group in pairs:
        await queue.subscribe(topic, group, blocking)
        await queue.publish(topic, ev(topic))
    await started.wait_for(2)
    assert queue.in_flight() == 2
    assert await queue.wait_idle(0.05) is False  # the deadline passes first
    assert queue.in_flight() == 2  # and waiting disturbed nothing
    waiter = asyncio.ensure_future(queue.wait_idle(harness.wait_s))
    gate.set()
    assert await waiter is True
    assert queue.in_flight() == 0
    for topic, group in pairs:
        await drained(harness, queue, topic, group)


async def test_a_handler_that_fails_or_hands_back_leaves_the_count(harness, queue):
    topic, group = inbox()
    seen = []

    async def handler(delivery):
        seen.append(queue.in_flight())
        if len(seen) == 1:
            raise RuntimeError("boom")
        if len(seen) == 2:
            return Outcome.NAK
        return None

    await queue.subscribe(topic, group, handler)
    await queue.publish(topic, ev(1))
    await eventually(lambda: len(seen) >= 3, harness.wait_s, "three deliveries")
    assert seen == [1, 1, 1]
    assert await queue.wait_idle(harness.wait_s) is True
    assert queue.in_flight() == 0
    await drained(harness, queue, topic, group)


async def test_a_drain_racing_new_handlers_never_counts_below_zero(harness, queue):
    pairs = [inbox(f"r{i}") for i in range(3)]
    done = Collector(harness)
    inside: list[int] = []  # the count as a running handler sees it
    outside: list[int] = []  # the count as a drain racing them sees it

    async def handler(item):
        inside.append(queue.in_flight())
        if item.event.payload["i"] % 3 == 0 and item.remaining == FIRST:
            raise RuntimeError("a failing handler still leaves the count")
        await done(item)

    for topic, group in pairs:
        await queue.subscribe(topic, group, handler)
    per_pair = 8
    stop = asyncio.Event()

    async def drainer() -> None:
        while not stop.is_set():
            outside.append(queue.in_flight())
            await queue.wait_idle(0.01)
            outside.append(queue.in_flight())

    task = asyncio.ensure_future(drainer())
    try:
        for i in range(1, per_pair + 1):
            for topic, _ in pairs:
                await queue.publish(topic, ev(i))
        await done.wait_for(len(pairs) * per_pair)
    finally:
        stop.set()
        await task
    assert await queue.wait_idle(harness.wait_s) is True
    assert queue.in_flight() == 0
    assert min(outside) >= 0, outside
    assert min(inside) >= 1 and max(inside) <= len(pairs), inside
    for topic, group in pairs:
        await drained(harness, queue, topic, group)
