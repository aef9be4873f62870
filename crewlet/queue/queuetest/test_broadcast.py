"""Broadcast streams: ``subscribe_stream`` (design: Broadcast Streams).

Every subscriber gets every matching event from the moment ``subscribe_stream``
returns; nothing is acked, nothing is replayed, no consumer group divides it.
"""
from __future__ import annotations

import asyncio

import pytest

from crewlet.queue import topics
from crewlet.queue.errors import InvalidArgument
from crewlet.queue.queuetest.harness import FIRST, Collector, ev, eventually, inbox, state, uniq


def event_topic(*tail: str) -> str:
    return ".".join(("crewlet.events", uniq("probe"), *tail))


def seen(col: Collector) -> list[tuple[str, object]]:
    return [(topic, event.payload.get("i")) for topic, event in col.items]


async def test_every_subscriber_gets_every_matching_event(harness, queue):
    topic = event_topic()
    other = await harness.client("n2")
    cols = [Collector(harness) for _ in range(3)]
    streams = [
        await queue.subscribe_stream(topic, cols[0].stream_handler),
        await queue.subscribe_stream("crewlet.events.>", cols[1].stream_handler),
        await other.subscribe_stream(topic, cols[2].stream_handler),
    ]
    for i in (1, 2, 3):
        await queue.publish(topic, ev(i))
    for col in cols:
        await col.wait_for(3)
    for col in cols:
        assert seen(col) == [(topic, 1), (topic, 2), (topic, 3)]
    await asyncio.gather(*(col.quiet() for col in cols))
    for stream in streams:
        await stream.close()


async def test_a_broadcast_handler_gets_the_topic_and_the_event_as_stamped(harness, queue):
    topic = event_topic()
    col = Collector(harness)
    stream = await queue.subscribe_stream(topic, col.stream_handler)
    sent = ev(7, nested={"a": [1, 2]})
    await queue.publish(topic, sent)
    await col.wait_for(1)
    got_topic, got = col.items[0]
    assert got_topic == topic
    assert got is not sent
    assert (got.id, got.type, got.payload, got.timestamp) == (sent.id, sent.type, sent.payload, sent.timestamp)
    assert got.node == "n1" and sent.node == ""
    await stream.close()


async def test_crewlet_events_does_not_see_crewlet_notifications_inbound(harness, queue):
    col = Collector(harness)
    stream = await queue.subscribe_stream(topics.EVENTS_ALL, col.stream_handler)
    inbound = ev("inbound")
    await queue.publish(topics.NOTIFICATIONS_INBOUND, inbound)
    topic = event_topic()
    await queue.publish(topic, ev("event"))
    await col.wait_for(1)
    await col.quiet()
    assert seen(col) == [(topic, "event")]
    await stream.close()


async def test_a_star_matches_exactly_one_segment(harness, queue):
    base = event_topic()
    one, two = Collector(harness), Collector(harness)
    s1 = await queue.subscribe_stream(base + ".*", one.stream_handler)
    handle = uniq("seat")
    s2 = await queue.subscribe_stream(f"crewlet.agent.*.{handle}", two.stream_handler)
    await queue.publish(base + ".a", ev(1))
    await queue.publish(base + ".a.b", ev(2))  # two segments: no match
    await queue.publish(base, ev(3))  # no segment: no match
    await queue.publish(base + ".c", ev(4))
    await queue.publish(f"crewlet.agent.s1.{handle}", ev(5))
    await queue.publish(f"crewlet.agent.s1.x.{handle}", ev(6))
    await queue.publish(f"crewlet.agent.{handle}", ev(7))
    await one.wait_for(2)
    await two.wait_for(1)
    await asyncio.gather(one.quiet(), two.quiet())
    assert seen(one) == [(base + ".a", 1), (base + ".c", 4)]
    assert seen(two) == [(f"crewlet.agent.s1.{handle}", 5)]
    await s1.close()
    await s2.close()


async def test_closing_a_broadcast_stops_dispatch(harness, queue):
    topic = event_topic()
    closed, open_ = Collector(harness), Collector(harness)
    mailbox, group = inbox()
    await queue.ensure_subscription(mailbox, group)
    stream = await queue.subscribe_stream(topic, closed.stream_handler)
    keeper = await queue.subscribe_stream(topic, open_.stream_handler)
    before = await state(queue, (mailbox, group))
    await queue.publish(topic, ev(1))
    await closed.wait_for(1)
    await stream.close()
    await stream.close()  # closing twice is fine
    await queue.publish(topic, ev(2))
    await open_.wait_for(2)
    await closed.quiet(expect=1)
    assert seen(open_) == [(topic, 1), (topic, 2)]
    assert await state(queue, (mailbox, group)) == before  # a broadcast writes nothing durable
    await keeper.close()


async def test_a_failing_broadcast_handler_breaks_nothing(harness, queue):
    topic = event_topic()
    group = uniq("g")
    failures = []

    async def failing(t, event):
        failures.append(event.payload["i"])
        raise RuntimeError("a dashboard tab blew up")

    healthy, durable = Collector(harness), Collector(harness)
    bad = await queue.subscribe_stream(topic, failing)
    good = await queue.subscribe_stream(topic, healthy.stream_handler)
    await queue.subscribe(topic, group, durable)
    await queue.publish(topic, ev(1))  # the publish does not raise
    await queue.publish(topic, ev(2))
    await healthy.wait_for(2)
    await durable.wait_for(2)
    await eventually(lambda: failures == [1, 2], harness.wait_s, "the failing handler to see both")
    assert seen(healthy) == [(topic, 1), (topic, 2)]
    assert durable.payloads() == [1, 2]
    await asyncio.gather(healthy.quiet(), durable.quiet())
    assert await queue.dead_letters() == []
    await bad.close()
    await good.close()


async def test_a_broadcast_never_consumes_from_a_durable_subscription(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    col = Collector(harness)
    stream = await queue.subscribe_stream(topic, col.stream_handler)
    await queue.publish(topic, ev(1))
    await col.wait_for(1)
    await col.quiet()
    # The mailbox still holds it, undelivered.
    assert await queue.backlog(topic, group) == 1
    mail = Collector(harness)
    await queue.subscribe(topic, group, mail)
    await mail.wait_for(1)
    assert mail.payloads() == [1] and mail.items[0].remaining == FIRST
    await asyncio.gather(mail.quiet(), col.quiet(expect=1))
    await stream.close()


async def test_broadcast_history_is_not_replayed(harness, queue):
    topic = event_topic()
    mailbox, group = inbox()
    await queue.ensure_subscription(mailbox, group)
    await queue.publish(topic, ev("old"))  # kept by the event stream's limits
    await queue.publish(mailbox, ev("old-mail"))  # kept by the mailbox
    events, mail = Collector(harness), Collector(harness)
    s1 = await queue.subscribe_stream(topic, events.stream_handler)
    s2 = await queue.subscribe_stream(mailbox, mail.stream_handler)
    await queue.publish(topic, ev("new"))
    await queue.publish(mailbox, ev("new-mail"))
    await events.wait_for(1)
    await mail.wait_for(1)
    await asyncio.gather(events.quiet(), mail.quiet())
    assert seen(events) == [(topic, "new")]
    assert seen(mail) == [(mailbox, "new-mail")]
    assert await queue.backlog(mailbox, group) == 2
    await s1.close()
    await s2.close()


async def test_a_pattern_spanning_every_namespace_is_refused(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    before = await state(queue, (topic, group))
    col = Collector(harness)
    for pattern in (">", "*.>", "crewlet.>", "crewlet.*", "*", "crewlet", "*.events.>"):
        with pytest.raises(InvalidArgument):
            await queue.subscribe_stream(pattern, col.stream_handler)
    await queue.publish(topic, ev(1))
    await queue.publish(event_topic(), ev(2))
    await col.quiet(expect=0)  # nothing half-made is listening
    backlogs, dead, listing = await state(queue, (topic, group))
    assert backlogs == (1,) and dead == before[1] and listing == before[2]
