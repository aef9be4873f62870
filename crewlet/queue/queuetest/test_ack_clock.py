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
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from crewlet.queue.contract import BatchOptions, EventQueue, Timings
from crewlet.queue.queuetest.harness import FIRST, Collector, Harness, drained, ev, eventually, inbox, needs, publish_all

#: A clean stop's hand-back must arrive well inside this; the ack clock in those cases is 30 s.
PROMPT_S = 5.0
#: Three conversations of one event each, waiting before anything attaches.
THREE_KEYS = ((1, "a"), (2, "b"), (3, "c"))
BY_KEY = BatchOptions(partition_key=lambda e: e.payload["k"])


def ack_wait_for(harness) -> float:
    """Short, but comfortably longer than the backend's "must not arrive" window."""
    return max(0.5, 3 * harness.quiet_s)


async def short_clock(harness):
    needs(harness, "ack_clock")
    return await harness.with_timings(Timings(backoff_base_s=0.005, backoff_cap_s=0.02, ack_wait_s=ack_wait_for(harness)))


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


@dataclass
class Members:
    """Two members of one group on one broker: ``first`` takes the mail, ``second`` attaches as its rival.

    ``holder`` and ``rival`` record what each saw; ``gate`` is what a stuck
    handler of ``first`` waits on, opened when the case ends whatever happens.
    """

    broker: Harness
    first: EventQueue
    second: EventQueue
    topic: str
    group: str
    holder: Collector
    rival: Collector
    gate: asyncio.Event

    async def first_holds_one(self) -> None:
        """``first`` takes event 1 with a handler stuck on the gate; then ``second`` attaches."""
        await self.first.subscribe(self.topic, self.group, stuck(self.holder, self.gate))
        await self.first.publish(self.topic, ev(1))
        await self.holder.wait_for(1)
        await self.second.subscribe(self.topic, self.group, self.rival)

    async def waiting(self, keyed: tuple[tuple[int, str], ...]) -> None:
        """Mail of these (i, conversation) pairs on the broker before anything attaches."""
        await self.first.ensure_subscription(self.topic, self.group)
        await publish_all(self.first, self.topic, [ev(i, k=key) for i, key in keyed])

    async def empty(self) -> None:
        """The group's backlog, seen from the member that stays, reaches zero."""
        await drained(self.broker, self.second, self.topic, self.group)


@asynccontextmanager
async def two_members(harness: Harness, *, short: bool = True) -> AsyncIterator[Members]:
    """Two clients of one group: on a broker with a short ack clock, or (``short=False``) the case's own."""
    broker = await short_clock(harness) if short else harness
    gate = asyncio.Event()
    try:
        first, second = await broker.client("n1"), await broker.client("n2")
        topic, group = inbox()
        yield Members(broker, first, second, topic, group, Collector(harness), Collector(harness), gate)
    finally:
        gate.set()
        if short:
            await broker.stop()


async def test_a_fetched_unacked_message_stays_invisible_to_other_members_of_its_group(harness):
    async with two_members(harness) as m:
        await m.first_holds_one()
        await m.rival.quiet(expect=0)  # well inside ack_wait: nobody else sees it
        assert await m.second.backlog(m.topic, m.group) == 1
        assert await m.second.dead_letters() == []
        m.gate.set()  # settled inside the window: it is never seen again
        await m.empty()
        await m.rival.quiet(expect=0)
        assert m.holder.payloads() == [1]


async def test_a_handler_working_longer_than_the_ack_wait_keeps_its_message_and_is_delivered_once(harness):
    async with two_members(harness) as m:
        await m.first_holds_one()
        await outlast_the_ack_wait(m.broker, m.holder, m.rival)  # in-progress signals kept the clock running
        m.gate.set()
        await m.empty()
        await asyncio.gather(m.holder.quiet(expect=1), m.rival.quiet(expect=0))
        assert m.holder.payloads() == [1] and m.holder.items[0].remaining == FIRST
        assert await m.second.dead_letters() == []


async def test_partitions_waiting_behind_a_long_partition_keep_their_messages_past_the_ack_wait(harness):
    async with two_members(harness) as m:
        await m.waiting(THREE_KEYS)

        async def first_waits(partition):
            await m.holder(partition)
            if partition.key == "a":
                await m.gate.wait()

        await m.first.subscribe_batch(m.topic, m.group, BY_KEY, first_waits)
        await m.holder.wait_for(1)
        await m.second.subscribe_batch(m.topic, m.group, BY_KEY, m.rival)
        await outlast_the_ack_wait(m.broker, m.holder, m.rival)
        m.gate.set()
        await m.holder.wait_for(3)
        await m.empty()
        await m.rival.quiet(expect=0)
        assert seen(m.holder) == [1, 2, 3]
        assert all(d.remaining == FIRST for p in m.holder.items for d in p.deliveries), "nothing was redelivered"


async def test_a_member_that_dies_without_settling_loses_its_message_to_another_after_the_ack_wait(harness):
    async with two_members(harness) as m:
        await m.first_holds_one()
        await m.broker.crash(m.first)
        await m.rival.quiet(expect=0)  # no hand-back: the clock has to run out first
        await m.rival.wait_for(1)
        assert m.rival.payloads() == [1]
        assert m.holder.items[0].remaining == FIRST
        assert m.rival.items[0].remaining == FIRST - 1  # the clock's redelivery spent one
        assert m.rival.items[0].event.id == m.holder.items[0].event.id
        await m.empty()
        await m.rival.quiet(expect=1)
        assert await m.second.dead_letters() == []


async def test_the_whole_batch_drain_of_a_member_that_dies_returns_after_the_ack_wait(harness):
    async with two_members(harness) as m:
        await m.waiting(((1, "k"), (2, "k"), (3, "k"), (4, "later")))
        await m.first.subscribe_batch(m.topic, m.group, BY_KEY, stuck(m.holder, m.gate))
        await m.holder.wait_for(1)
        assert [e.payload["i"] for e in m.holder.items[0].events] == [1, 2, 3]
        await m.second.subscribe_batch(m.topic, m.group, BY_KEY, m.rival)
        await m.broker.crash(m.first)
        await eventually(
            lambda: sorted(seen(m.rival)) == [1, 2, 3, 4],
            harness.wait_s,
            "the whole drain redelivered to the other member",
        )
        assert all(d.remaining == FIRST - 1 for p in m.rival.items for d in p.deliveries)
        await m.empty()
        assert await m.second.dead_letters() == []


async def test_pausing_delivery_hands_back_at_once_the_partitions_no_handler_is_working_on(harness):
    async with two_members(harness, short=False) as m:
        await m.waiting(THREE_KEYS)
        await m.first.subscribe_batch(m.topic, m.group, BY_KEY, stuck(m.holder, m.gate))
        await m.holder.wait_for(1)
        await m.second.subscribe_batch(m.topic, m.group, BY_KEY, m.rival)
        await m.first.pause_delivery()  # the stop of a process: b and c must not wait for a's handler
        await eventually(lambda: sorted(seen(m.rival)) == [2, 3], PROMPT_S, "the undispatched partitions at the other member")
        assert all(d.remaining == FIRST - 1 for p in m.rival.items for d in p.deliveries), "being drained was the delivery"
        m.gate.set()  # the running handler finishes and settles its own partition
        await m.empty()
        await asyncio.gather(m.holder.quiet(expect=1), m.rival.quiet())
        assert seen(m.holder) == [1] and sorted(seen(m.rival)) == [2, 3]
        assert await m.second.dead_letters() == []


async def test_pausing_delivery_hands_back_at_once_what_a_lingering_batch_has_collected(harness):
    async with two_members(harness, short=False) as m:
        await m.first.ensure_subscription(m.topic, m.group)
        await m.first.subscribe_batch(m.topic, m.group, BatchOptions(linger_s=60, max_batch=50), m.holder)
        await m.first.publish(m.topic, ev(1))
        await eventually(lambda: held(m.first) == 1, harness.wait_s, "the message fetched into the lingering drain")
        await m.second.subscribe_batch(m.topic, m.group, BatchOptions(), m.rival)
        await m.rival.quiet(expect=0)  # the lingering drain holds it
        await m.first.pause_delivery()
        await m.rival.wait_for(1, timeout_s=PROMPT_S)
        assert seen(m.rival) == [1] and m.rival.items[0].headroom == FIRST - 1
        await m.empty()
        await m.holder.quiet(expect=0)


async def test_closing_a_client_hands_back_the_mail_of_a_handler_cancelled_at_the_end_of_its_grace(harness):
    async with two_members(harness, short=False) as m:
        cancelled = asyncio.Event()

        async def works_until_cancelled(delivery):
            await m.holder(delivery)
            try:
                await m.gate.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        await m.first.subscribe(m.topic, m.group, works_until_cancelled)
        await m.first.publish(m.topic, ev(1))
        await m.holder.wait_for(1)
        await m.second.subscribe(m.topic, m.group, m.rival)
        await m.first.close(grace_s=0.0)
        assert cancelled.is_set()
        await m.rival.wait_for(1, timeout_s=PROMPT_S)
        assert m.rival.payloads() == [1] and m.rival.items[0].remaining == FIRST - 1
        await m.empty()
        assert await m.second.dead_letters() == []


async def test_a_handler_that_finishes_inside_the_close_grace_settles_its_own_mail(harness):
    async with two_members(harness, short=False) as m:
        await m.first_holds_one()
        closing = asyncio.ensure_future(m.first.close(grace_s=30.0))
        await m.rival.quiet(expect=0)  # running: it keeps its message through the grace
        m.gate.set()
        await closing
        await m.empty()
        await m.rival.quiet(expect=0)
        assert m.holder.payloads() == [1]
