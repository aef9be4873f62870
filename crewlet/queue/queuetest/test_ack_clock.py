"""The ack clock: a fetched, unacked message is invisible to the rest of its group for ack_wait.

It is a backstop rather than the handoff path (a deferral is the handoff): a
member that stops settling loses the message to another member when the clock
runs out, and that redelivery spends a delivery like any other.
"""
from __future__ import annotations

import asyncio

from crewlet.queue.contract import MAX_DELIVERIES, BatchOptions, Timings
from crewlet.queue.queuetest.harness import Collector, ev, eventually, inbox, needs

FIRST = MAX_DELIVERIES - 1


def ack_wait_for(harness) -> float:
    """Short, but comfortably longer than the backend's "must not arrive" window."""
    return max(0.5, 3 * harness.quiet_s)


async def short_clock(harness):
    needs(harness, "ack_clock")
    return await harness.with_timings(Timings(backoff_base_s=0.005, backoff_cap_s=0.02, ack_wait_s=ack_wait_for(harness)))


async def empty(queue, topic, group, harness) -> None:
    async def drained() -> bool:
        return await queue.backlog(topic, group) == 0

    await eventually(drained, harness.wait_s, f"an empty backlog on {topic}")


def stuck(started: Collector, gate: asyncio.Event):
    """A member that takes its delivery and does not settle it until the gate opens."""

    async def handler(item):
        await started(item)
        await gate.wait()

    return handler


async def test_a_fetched_unacked_message_stays_invisible_to_other_members_of_its_group(harness):
    other = await short_clock(harness)
    gate = asyncio.Event()
    try:
        first, second = await other.client("n1"), await other.client("n2")
        topic, group = inbox()
        holder, rival = Collector(harness), Collector(harness)
        await first.subscribe(topic, group, stuck(holder, gate))
        await first.publish(topic, ev(1))
        await holder.wait_for(1)
        await second.subscribe(topic, group, rival)
        await rival.quiet(expect=0)  # well inside ack_wait: nobody else sees it
        assert await second.backlog(topic, group) == 1
        assert await second.dead_letters() == []
        gate.set()  # settled inside the window: it is never seen again
        await empty(second, topic, group, harness)
        await rival.quiet(expect=0)
        assert holder.payloads() == [1]
    finally:
        gate.set()
        await other.stop()


async def test_a_fetched_unacked_message_is_redelivered_when_the_ack_clock_expires(harness):
    other = await short_clock(harness)
    gate = asyncio.Event()
    try:
        first, second = await other.client("n1"), await other.client("n2")
        topic, group = inbox()
        holder, rival = Collector(harness), Collector(harness)
        await first.subscribe(topic, group, stuck(holder, gate))
        await first.publish(topic, ev(1))
        await holder.wait_for(1)
        await second.subscribe(topic, group, rival)
        await rival.wait_for(1)  # the clock ran out on the holder
        assert rival.payloads() == [1]
        assert holder.items[0].remaining == FIRST
        assert rival.items[0].remaining == FIRST - 1  # the clock's redelivery spent one
        assert rival.items[0].event.id == holder.items[0].event.id
        gate.set()
        await empty(second, topic, group, harness)
        await asyncio.gather(holder.quiet(expect=1), rival.quiet(expect=1))
        assert await second.dead_letters() == []
    finally:
        gate.set()
        await other.stop()


async def test_the_ack_clock_covers_a_whole_batch_drain(harness):
    other = await short_clock(harness)
    gate = asyncio.Event()
    try:
        first, second = await other.client("n1"), await other.client("n2")
        topic, group = inbox()
        await first.ensure_subscription(topic, group)
        for i in (1, 2, 3):
            await first.publish(topic, ev(i, k="k"))
        opts = BatchOptions(partition_key=lambda e: e.payload["k"])
        holder, rival = Collector(harness), Collector(harness)
        await first.subscribe_batch(topic, group, opts, stuck(holder, gate))
        await holder.wait_for(1)
        assert [e.payload["i"] for e in holder.items[0].events] == [1, 2, 3]
        await second.subscribe_batch(topic, group, opts, rival)
        await eventually(
            lambda: sorted(e.payload["i"] for p in rival.items for e in p.events) == [1, 2, 3],
            harness.wait_s,
            "the whole drain redelivered to the other member",
        )
        assert all(d.remaining == FIRST - 1 for p in rival.items for d in p.deliveries)
        gate.set()
        await empty(second, topic, group, harness)
        assert await second.dead_letters() == []
    finally:
        gate.set()
        await other.stop()
