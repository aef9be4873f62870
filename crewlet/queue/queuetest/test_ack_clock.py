"""The ack clock: a fetched, unacked message is invisible to the rest of its group for ack_wait.

It measures whether the member holding a message is alive, not how long its
handler takes: while a client holds a message (its handler runs, a batch is
collecting it, its partition waits behind another) the client restarts the
clock with in-progress signals, so a long handler keeps its message and is
delivered once. A member that dies without settling loses the message to
another member about one ack window later, and that redelivery spends a
delivery like any other. A clean stop does not wait for the clock at all: what
no handler is working on goes back at once, and a handler cancelled at the end
of its grace hands its mail back as it ends.
"""
from __future__ import annotations

import asyncio

from crewlet.queue.contract import MAX_DELIVERIES, BatchOptions, Timings
from crewlet.queue.queuetest.harness import Collector, ev, eventually, inbox, needs

FIRST = MAX_DELIVERIES - 1
#: A clean stop's hand-back must arrive well inside this; the ack clock in those cases is 30 s.
PROMPT_S = 5.0


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


def seen(collector: Collector) -> list:
    """Every event payload ``i`` a collector saw, single deliveries and partitions alike."""
    out: list[int] = []
    for item in collector.items:
        events = item.events if hasattr(item, "events") else [item.event]
        out.extend(e.payload["i"] for e in events)
    return out


def held(client) -> int:
    """Messages the client's consume loops hold unsettled (the shared client's own bookkeeping)."""
    return sum(len(att.held) for att in client._attachments)


async def outlast_the_ack_wait(harness, *collectors: Collector) -> None:
    """Three ack windows in which none of ``collectors`` may see anything new."""
    counts = [len(c) for c in collectors]
    await asyncio.sleep(3 * harness.timings.ack_wait_s)
    assert [len(c) for c in collectors] == counts, [c.items for c in collectors]


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


async def test_a_handler_working_longer_than_the_ack_wait_keeps_its_message_and_is_delivered_once(harness):
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
        await outlast_the_ack_wait(other, holder, rival)  # in-progress signals kept the clock running
        gate.set()
        await empty(second, topic, group, harness)
        await asyncio.gather(holder.quiet(expect=1), rival.quiet(expect=0))
        assert holder.payloads() == [1] and holder.items[0].remaining == FIRST
        assert await second.dead_letters() == []
    finally:
        gate.set()
        await other.stop()


async def test_partitions_waiting_behind_a_long_partition_keep_their_messages_past_the_ack_wait(harness):
    other = await short_clock(harness)
    gate = asyncio.Event()
    try:
        first, second = await other.client("n1"), await other.client("n2")
        topic, group = inbox()
        await first.ensure_subscription(topic, group)
        for i, key in ((1, "a"), (2, "b"), (3, "c")):
            await first.publish(topic, ev(i, k=key))
        opts = BatchOptions(partition_key=lambda e: e.payload["k"])
        holder, rival = Collector(harness), Collector(harness)

        async def first_waits(partition):
            await holder(partition)
            if partition.key == "a":
                await gate.wait()

        await first.subscribe_batch(topic, group, opts, first_waits)
        await holder.wait_for(1)
        await second.subscribe_batch(topic, group, opts, rival)
        await outlast_the_ack_wait(other, holder, rival)
        gate.set()
        await holder.wait_for(3)
        await empty(second, topic, group, harness)
        await rival.quiet(expect=0)
        assert seen(holder) == [1, 2, 3]
        assert all(d.remaining == FIRST for p in holder.items for d in p.deliveries), "nothing was redelivered"
    finally:
        gate.set()
        await other.stop()


async def test_a_member_that_dies_without_settling_loses_its_message_to_another_after_the_ack_wait(harness):
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
        await other.crash(first)
        await rival.quiet(expect=0)  # no hand-back: the clock has to run out first
        await rival.wait_for(1)
        assert rival.payloads() == [1]
        assert holder.items[0].remaining == FIRST
        assert rival.items[0].remaining == FIRST - 1  # the clock's redelivery spent one
        assert rival.items[0].event.id == holder.items[0].event.id
        await empty(second, topic, group, harness)
        await rival.quiet(expect=1)
        assert await second.dead_letters() == []
    finally:
        gate.set()
        await other.stop()


async def test_the_whole_batch_drain_of_a_member_that_dies_returns_after_the_ack_wait(harness):
    other = await short_clock(harness)
    gate = asyncio.Event()
    try:
        first, second = await other.client("n1"), await other.client("n2")
        topic, group = inbox()
        await first.ensure_subscription(topic, group)
        for i in (1, 2, 3):
            await first.publish(topic, ev(i, k="k"))
        await first.publish(topic, ev(4, k="later"))
        opts = BatchOptions(partition_key=lambda e: e.payload["k"])
        holder, rival = Collector(harness), Collector(harness)
        await first.subscribe_batch(topic, group, opts, stuck(holder, gate))
        await holder.wait_for(1)
        assert [e.payload["i"] for e in holder.items[0].events] == [1, 2, 3]
        await second.subscribe_batch(topic, group, opts, rival)
        await other.crash(first)
        await eventually(
            lambda: sorted(seen(rival)) == [1, 2, 3, 4],
            harness.wait_s,
            "the whole drain redelivered to the other member",
        )
        assert all(d.remaining == FIRST - 1 for p in rival.items for d in p.deliveries)
        await empty(second, topic, group, harness)
        assert await second.dead_letters() == []
    finally:
        gate.set()
        await other.stop()


async def test_pausing_delivery_hands_back_at_once_the_partitions_no_handler_is_working_on(harness):
    gate = asyncio.Event()
    first, second = await harness.client("n1"), await harness.client("n2")
    topic, group = inbox()
    await first.ensure_subscription(topic, group)
    for i, key in ((1, "a"), (2, "b"), (3, "c")):
        await first.publish(topic, ev(i, k=key))
    opts = BatchOptions(partition_key=lambda e: e.payload["k"])
    holder, rival = Collector(harness), Collector(harness)
    try:
        await first.subscribe_batch(topic, group, opts, stuck(holder, gate))
        await holder.wait_for(1)
        await second.subscribe_batch(topic, group, opts, rival)
        await first.pause_delivery()  # the stop of a process: b and c must not wait for a's handler
        await eventually(lambda: sorted(seen(rival)) == [2, 3], PROMPT_S, "the undispatched partitions at the other member")
        assert all(d.remaining == FIRST - 1 for p in rival.items for d in p.deliveries), "being drained was the delivery"
        gate.set()  # the running handler finishes and settles its own partition
        await empty(second, topic, group, harness)
        await asyncio.gather(holder.quiet(expect=1), rival.quiet())
        assert seen(holder) == [1] and sorted(seen(rival)) == [2, 3]
        assert await second.dead_letters() == []
    finally:
        gate.set()


async def test_pausing_delivery_hands_back_at_once_what_a_lingering_batch_has_collected(harness):
    first, second = await harness.client("n1"), await harness.client("n2")
    topic, group = inbox()
    await first.ensure_subscription(topic, group)
    holder, rival = Collector(harness), Collector(harness)
    await first.subscribe_batch(topic, group, BatchOptions(linger_s=60, max_batch=50), holder)
    await first.publish(topic, ev(1))
    await eventually(lambda: held(first) == 1, harness.wait_s, "the message fetched into the lingering drain")
    await second.subscribe_batch(topic, group, BatchOptions(), rival)
    await rival.quiet(expect=0)  # the lingering drain holds it
    await first.pause_delivery()
    await rival.wait_for(1, timeout_s=PROMPT_S)
    assert seen(rival) == [1] and rival.items[0].headroom == FIRST - 1
    await empty(second, topic, group, harness)
    await holder.quiet(expect=0)


async def test_closing_a_client_hands_back_the_mail_of_a_handler_cancelled_at_the_end_of_its_grace(harness):
    gate = asyncio.Event()
    first, second = await harness.client("n1"), await harness.client("n2")
    topic, group = inbox()
    holder, rival = Collector(harness), Collector(harness)
    cancelled = asyncio.Event()

    async def works_until_cancelled(delivery):
        await holder(delivery)
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        await first.subscribe(topic, group, works_until_cancelled)
        await first.publish(topic, ev(1))
        await holder.wait_for(1)
        await second.subscribe(topic, group, rival)
        await first.close(grace_s=0.0)
        assert cancelled.is_set()
        await rival.wait_for(1, timeout_s=PROMPT_S)
        assert rival.payloads() == [1] and rival.items[0].remaining == FIRST - 1
        await empty(second, topic, group, harness)
        assert await second.dead_letters() == []
    finally:
        gate.set()


async def test_a_handler_that_finishes_inside_the_close_grace_settles_its_own_mail(harness):
    gate = asyncio.Event()
    first, second = await harness.client("n1"), await harness.client("n2")
    topic, group = inbox()
    holder, rival = Collector(harness), Collector(harness)
    await first.subscribe(topic, group, stuck(holder, gate))
    await first.publish(topic, ev(1))
    await holder.wait_for(1)
    await second.subscribe(topic, group, rival)
    closing = asyncio.ensure_future(first.close(grace_s=30.0))
    await rival.quiet(expect=0)  # running: it keeps its message through the grace
    gate.set()
    await closing
    await empty(second, topic, group, harness)
    await rival.quiet(expect=0)
    assert holder.payloads() == [1]
