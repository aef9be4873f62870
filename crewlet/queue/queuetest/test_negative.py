"""Conformance: negative paths and reachability (docs/design.md § Negative paths), on every backend.

Every refusal here also checks that nothing was written: the backlog, the dead
letters and the listing are what they were before.
"""
from __future__ import annotations

import pytest

from crewlet.events import Event
from crewlet.queue.contract import MAX_PAYLOAD_BYTES, BatchOptions
from crewlet.queue.errors import InvalidArgument, NotLive, QueueError, TooLarge, Unavailable
from crewlet.queue.queuetest.harness import FIRST, Collector, attached, drained, ev, eventually, inbox, needs, state


def sized(total: int, node: str) -> Event:
    """An event whose encoding is exactly ``total`` bytes (node preset, so stamping adds nothing)."""
    event = Event(type="conformance_probe", payload={"pad": ""}, node=node)
    event.payload["pad"] = "x" * (total - len(event.to_json()))
    assert len(event.to_json()) == total
    return event


async def watched(harness, queue):
    """A (topic, group) that a consumer, a broadcast subscriber and a publish listener all watch.

    The pair, what each watcher saw, and the broker's state before the case acts,
    so a refused publish can be shown to have reached nobody and written nothing.
    """
    topic, group = inbox()
    col, streamed, heard = Collector(harness), Collector(harness), []

    async def listener(t, e):
        heard.append(e)

    queue.add_publish_listener(listener)
    await queue.subscribe(topic, group, col)
    await queue.subscribe_stream(topic, streamed.stream_handler)
    return topic, group, col, streamed, heard, await state(queue, (topic, group))


# ---------------------------------------------------------------------------
# Refused publishes


async def test_an_oversized_publish_is_refused_as_permanently_too_large_and_lands_nowhere(harness, queue):
    topic, group, col, streamed, heard, before = await watched(harness, queue)
    oversized = sized(MAX_PAYLOAD_BYTES + 1, queue.node)
    with pytest.raises(TooLarge) as refused:
        await queue.publish(topic, oversized)
    assert not isinstance(refused.value, Unavailable), "too large is permanent, not retryable"
    await col.quiet(0)
    assert len(streamed) == 0 and heard == []
    assert await state(queue, (topic, group)) == before
    await queue.publish(topic, ev("after"))  # the client is unharmed
    (got,) = await col.wait_for(1)
    assert got.event.payload == {"i": "after"}


async def test_an_event_of_exactly_the_limit_is_accepted_and_delivered(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    limit = sized(MAX_PAYLOAD_BYTES, queue.node)
    await queue.publish(topic, limit)
    (got,) = await col.wait_for(1)
    assert got.event.id == limit.id
    assert len(got.event.to_json()) == MAX_PAYLOAD_BYTES
    await drained(harness, queue, topic, group)


async def test_a_missing_event_is_refused_and_reaches_nobody(harness, queue):
    topic, group, col, streamed, heard, before = await watched(harness, queue)
    for missing in (None, {"type": "conformance_probe", "payload": {}}, b"{}", "event"):
        with pytest.raises(InvalidArgument):
            await queue.publish(topic, missing)
    await col.quiet(0)
    assert len(streamed) == 0 and heard == []
    assert await state(queue, (topic, group)) == before


async def test_bad_arguments_are_refused_and_create_nothing(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    before = await state(queue, (topic, group))
    good = inbox("never")

    async def handler(_):
        return None

    bad_topics = ["", "crewlet.agent.*.inbox", "crewlet.agent.>", "crewlet..inbox", "crewlet.agent.a b.inbox", "crewlet.agent.x."]
    bad_groups = ["", "   ", "line\nbreak", "tab\tgroup"]
    for bad in bad_topics:
        with pytest.raises(InvalidArgument):
            await queue.publish(bad, ev(1))
        with pytest.raises(InvalidArgument):
            await queue.ensure_subscription(bad, good[1])
        with pytest.raises(InvalidArgument):
            await queue.subscribe(bad, good[1], handler)
        with pytest.raises(InvalidArgument):
            await queue.delete_subscription(bad, group)
    for bad in bad_groups:
        with pytest.raises(InvalidArgument):
            await queue.ensure_subscription(good[0], bad)
        with pytest.raises(InvalidArgument):
            await queue.subscribe(good[0], bad, handler)
        with pytest.raises(InvalidArgument):
            await queue.subscribe_batch(good[0], bad, BatchOptions(), handler)
        with pytest.raises(InvalidArgument):
            await queue.delete_subscription(topic, bad)
    with pytest.raises(InvalidArgument):
        await queue.subscribe_batch(good[0], good[1], None, handler)
    with pytest.raises(InvalidArgument):
        await queue.subscribe(good[0], good[1], "not a handler")
    assert issubclass(InvalidArgument, ValueError)
    assert await state(queue, (topic, group)) == before
    assert await queue.list_subscriptions(good[0]) == []


# ---------------------------------------------------------------------------
# Verbs that must not bring a subscription back


async def test_a_hold_does_not_resurrect_a_deleted_subscription(harness, queue):
    topic, group = inbox()
    sub = await queue.subscribe(topic, group, Collector(harness))
    await queue.publish(topic, ev("doomed"))
    assert await queue.delete_subscription(topic, group) is True
    before = await state(queue, (topic, group))
    await queue.hold(topic, group, "sandbox")
    await sub.hold("budget")
    await queue.release(topic, group, "sandbox")
    await sub.release("budget")
    assert await state(queue, (topic, group)) == before
    assert await queue.list_subscriptions(topic) == []
    await queue.publish(topic, ev("after"))
    assert await queue.backlog(topic, group) == 0, "a hold kept a deleted subscription's interest alive"
    assert await state(queue, (topic, group)) == before


async def test_quiesce_with_no_attachment_changes_nothing(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    await queue.publish(topic, ev("waiting"))
    before = await state(queue, (topic, group))
    assert await queue.quiesce(topic, group) is False
    assert await queue.unquiesce(topic, group) is False
    never = inbox("never")
    assert await queue.quiesce(*never) is False
    assert await state(queue, (topic, group), never) == (before[0] + (0,), before[1], before[2])
    col = Collector(harness)
    sub = await queue.subscribe(topic, group, col)  # the earlier quiesce left no stale gate
    (got,) = await col.wait_for(1)
    assert got.event.payload == {"i": "waiting"} and got.remaining == FIRST
    assert await sub.unquiesce() is False


# ---------------------------------------------------------------------------
# Reachability


async def test_a_verb_that_cannot_reach_the_broker_says_unavailable(harness, queue):
    needs(harness, "outage")
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    assert await queue.dead_letters() == []
    never = inbox("never")

    async def handler(_):
        return None

    await harness.go_away()
    try:
        verbs = {
            "publish": lambda: queue.publish(topic, ev("lost")),
            "ensure_subscription": lambda: queue.ensure_subscription(*never),
            "delete_subscription": lambda: queue.delete_subscription(topic, group),
            "list_subscriptions": lambda: queue.list_subscriptions(">"),
            "subscribe": lambda: queue.subscribe(never[0], never[1], handler),
            "backlog": lambda: queue.backlog(topic, group),
            "dead_letters": lambda: queue.dead_letters(),
            "replay_dead_letter": lambda: queue.replay_dead_letter("1"),
            "round_trip": lambda: queue.round_trip(1.0),
        }
        for name, call in verbs.items():
            with pytest.raises(Unavailable) as info:
                await call()
            assert not isinstance(info.value, NotLive), f"{name}: unavailable is not 'not live'"
            assert isinstance(info.value, QueueError)
    finally:
        await harness.come_back()

    async def answers():
        try:
            return await queue.list_subscriptions(">") is not None
        except Unavailable:
            return False

    await eventually(answers, harness.wait_s, "the broker to be reachable again")
    assert await queue.backlog(topic, group) == 0, "a refused publish landed"
    assert await queue.dead_letters() == []
    assert await queue.list_subscriptions(never[0]) == [], "a refused ensure/subscribe created a subscription"
    await queue.ensure_subscription(topic, group)
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    await queue.publish(topic, ev("back"))
    (got,) = await col.wait_for(1)
    assert got.event.payload == {"i": "back"}, "the lost publish must not surface after the outage"


async def test_unavailable_is_retryable_and_distinct_from_not_live(harness, queue):
    needs(harness, "outage")
    assert not issubclass(Unavailable, NotLive) and not issubclass(NotLive, Unavailable)
    assert not issubclass(Unavailable, TooLarge) and not issubclass(TooLarge, Unavailable)
    topic, _ = inbox()
    await harness.go_away()
    try:
        with pytest.raises(Unavailable):
            await queue.publish(topic, ev(1))
        await queue.close()  # closing works while the broker is gone
        with pytest.raises(NotLive):
            await queue.publish(topic, ev(2))  # closed for good beats unreachable
        with pytest.raises(NotLive):
            await queue.backlog(topic, "g")
    finally:
        await harness.come_back()
    with pytest.raises(NotLive):
        await queue.publish(topic, ev(3))  # and stays closed when the broker returns


async def test_local_verbs_still_work_while_the_broker_is_gone(harness, queue):
    needs(harness, "outage")
    topic, group = inbox()
    other_topic, other_group = inbox("other")
    sub = await queue.subscribe(topic, group, Collector(harness))
    other = await queue.subscribe(other_topic, other_group, Collector(harness))
    await harness.go_away()
    try:
        assert await sub.quiesce() is True
        assert await sub.unquiesce() is True
        assert await queue.quiesce(topic, group) is True
        assert await queue.unquiesce(topic, group) is True
        await sub.hold("sandbox")
        await queue.hold(topic, group, "budget")
        await sub.release("sandbox")
        await queue.release(topic, group, "budget")
        await queue.pause_delivery()
        await queue.resume_delivery()
        assert queue.in_flight() == 0
        assert await queue.wait_idle(0) is True
        assert await sub.detach() is True
        assert await queue.detach(other_topic, other_group) is True
        assert await other.detach() is False
        assert await queue.detach(topic, group) is False
    finally:
        await harness.come_back()


async def test_a_client_says_it_is_connected_only_while_the_broker_is_reachable_and_it_is_open(harness, queue):
    needs(harness, "outage")
    assert queue.connected
    await harness.go_away()
    try:
        await eventually(lambda: not queue.connected, harness.wait_s, "the client to notice the broker is gone")
    finally:
        await harness.come_back()
    await eventually(lambda: queue.connected, harness.wait_s, "the client to reconnect")
    await queue.close()
    assert not queue.connected
