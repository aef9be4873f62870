"""Conformance: core delivery (docs/design.md § Core delivery), on every backend.

Design: docs/design.md § Delivery semantics, § Publish listeners. Every case
runs against each backend through the ``harness`` / ``queue`` fixtures. Here:
who gets a published event (its subscriber, one member of each group, never
another topic's), subscriptions made late, ensured and deleted, the mailbox
semantic, and the backend's name and publish listeners. Hand-backs and the
delivery budget are test_hand_backs.py's; holds, pausing, handlers in flight
and closing test_gates_and_closing.py's.
"""
from __future__ import annotations

import asyncio
import re

from crewlet.queue.contract import Outcome, SubscriptionRef, Timings
from crewlet.queue.queuetest.harness import (
    FIRST,
    Collector,
    attached,
    both_attached,
    drained,
    ev,
    eventually,
    inbox,
    needs,
    only,
    publish_all,
    state,
    uniq,
)


def remaining(col):
    return [d.remaining for d in col.items]


# ---------------------------------------------------------------------------
# A published event reaches its subscriber; topics never cross; every group a copy


async def test_a_published_event_reaches_its_subscriber_once_with_its_topic_and_a_full_budget(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    sent = ev(1)
    await queue.publish(topic, sent)
    (got,) = await col.wait_for(1)
    assert got.event.id == sent.id
    assert got.event.payload == {"i": 1}
    assert got.topic == topic
    assert got.remaining == FIRST
    await col.quiet()
    await drained(harness, queue, topic, group)
    assert await queue.dead_letters() == []


async def test_topics_never_cross_even_under_one_group_name(harness, queue):
    (t1, _), (t2, _) = inbox("one"), inbox("two")
    group = "workers"
    one, two = Collector(harness), Collector(harness)
    await queue.subscribe(t1, group, one)
    await queue.subscribe(t2, group, two)
    await queue.publish(t1, ev("one"))
    await queue.publish(t2, ev("two"))
    await one.wait_for(1)
    await two.wait_for(1)
    await one.quiet()
    assert one.payloads() == ["one"] and [d.topic for d in one.items] == [t1]
    assert two.payloads() == ["two"] and [d.topic for d in two.items] == [t2]
    await only(queue, {(t1, group): 0, (t2, group): 0})


async def test_every_group_gets_its_own_copy(harness, queue):
    topic, _ = inbox()
    groups = [f"group-{k}" for k in range(3)]
    cols = {g: Collector(harness) for g in groups}
    for g in groups:
        await queue.subscribe(topic, g, cols[g])
    sent = ev("fan-out")
    await queue.publish(topic, sent)
    for g in groups:
        await cols[g].wait_for(1)
    await cols[groups[0]].quiet()
    for g in groups:
        assert [d.event.id for d in cols[g].items] == [sent.id]
        assert cols[g].items[0].remaining == FIRST
    delivered = [cols[g].items[0].event for g in groups]
    assert len({id(e) for e in delivered}) == len(groups), "each group decodes its own copy"
    for g in groups:
        await drained(harness, queue, topic, g)


# ---------------------------------------------------------------------------
# Names that differ only by '.' vs '_' never share a subscription


async def test_topics_that_differ_only_by_dot_or_underscore_never_share_a_subscription(harness, queue):
    handle = uniq("seat")
    dotted, underscored = f"crewlet.agent.{handle}.a.b", f"crewlet.agent.{handle}.a_b"
    group = "g"
    assert await queue.ensure_subscription(dotted, group) is True
    assert await queue.ensure_subscription(underscored, group) is True, "a_b must not alias a.b"
    await queue.publish(dotted, ev("dot"))
    assert await queue.backlog(dotted, group) == 1
    assert await queue.backlog(underscored, group) == 0
    dot, under = Collector(harness), Collector(harness)
    await queue.subscribe(dotted, group, dot)
    await queue.subscribe(underscored, group, under)
    await queue.publish(underscored, ev("under"))
    await dot.wait_for(1)
    await under.wait_for(1)
    await dot.quiet()
    assert dot.payloads() == ["dot"] and under.payloads() == ["under"]
    assert [d.topic for d in dot.items] == [dotted]
    assert [d.topic for d in under.items] == [underscored]


async def test_groups_that_differ_only_by_dot_or_underscore_never_share_a_subscription(harness, queue):
    topic, _ = inbox()
    assert await queue.ensure_subscription(topic, "h.i") is True
    assert await queue.ensure_subscription(topic, "h_i") is True, "h_i must not alias h.i"
    sent = ev("both")
    await queue.publish(topic, sent)
    assert await queue.backlog(topic, "h.i") == 1
    assert await queue.backlog(topic, "h_i") == 1
    dotted = Collector(harness)
    await queue.subscribe(topic, "h.i", dotted)
    await dotted.wait_for(1)
    await drained(harness, queue, topic, "h.i")
    await dotted.quiet()
    assert await queue.backlog(topic, "h_i") == 1, "consuming h.i must not consume h_i's copy"
    under = Collector(harness)
    await queue.subscribe(topic, "h_i", under)
    (got,) = await under.wait_for(1)
    assert got.event.id == sent.id and got.remaining == FIRST
    await drained(harness, queue, topic, "h_i")


# ---------------------------------------------------------------------------
# Members of one group compete


async def test_members_of_one_group_compete_so_each_event_reaches_exactly_one_member(harness, queue):
    _, a, b, topic, group = await both_attached(harness, queue)
    sent = await publish_all(queue, topic, [ev(i) for i in range(12)])
    await eventually(lambda: len(a) + len(b) >= len(sent), harness.wait_s, "every event delivered")
    await a.quiet()
    got = [d.event.id for d in a.items + b.items]
    assert sorted(got) == sorted(e.id for e in sent), "each event exactly once across the members"
    assert all(d.remaining == FIRST for d in a.items + b.items), "nothing was redelivered"
    await drained(harness, queue, topic, group)


async def test_a_redelivery_goes_to_a_healthy_member_when_the_failing_one_steps_back(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    sent = ev("work")
    await queue.publish(topic, sent)

    async def fail_and_step_back(delivery):
        await queue.quiesce(topic, group)  # this node is sick: it stops taking work
        return Outcome.NAK

    sick = Collector(harness, fail_and_step_back)
    await queue.subscribe(topic, group, sick)
    await sick.wait_for(1)
    other = await harness.client("n2")
    healthy = Collector(harness)
    await other.subscribe(topic, group, healthy)
    (got,) = await healthy.wait_for(1)
    assert got.event.id == sent.id
    assert got.remaining == FIRST - 1, "the count rides on the message, whichever member takes it"
    await drained(harness, queue, topic, group)
    await healthy.quiet()
    assert len(sick) == 1
    assert await queue.dead_letters() == []


async def test_a_delivery_a_wedged_member_holds_past_the_progress_limit_returns_to_a_healthy_member(harness):
    needs(harness, "ack_clock")
    short = await harness.with_timings(
        Timings(
            backoff_base_s=harness.timings.backoff_base_s,
            backoff_cap_s=harness.timings.backoff_cap_s,
            ack_wait_s=0.2,
            progress_limit_s=0.3,
        )
    )
    stuck = asyncio.Event()
    try:
        hung_client = await short.client("n1")
        healthy_client = await short.client("n2")
        topic, group = inbox()
        await hung_client.ensure_subscription(topic, group)
        sent = ev("work")
        await hung_client.publish(topic, sent)

        async def hang(delivery):
            await stuck.wait()  # a wedged handler: its in-progress signals stop at the limit

        hung = Collector(short, hang)
        await hung_client.subscribe(topic, group, hung)
        await hung.wait_for(1)
        healthy = Collector(short)
        await healthy_client.subscribe(topic, group, healthy)
        (got,) = await healthy.wait_for(1)
        assert got.event.id == sent.id
        assert got.remaining == FIRST - 1
        await drained(short, healthy_client, topic, group)
    finally:
        stuck.set()
        await short.stop()


# ---------------------------------------------------------------------------
# A subscription made after the client started


async def test_a_subscription_made_after_the_client_started_still_delivers(harness, queue):
    first_topic, first_group = inbox("first")
    first = Collector(harness)
    await queue.subscribe(first_topic, first_group, first)
    await queue.publish(first_topic, ev(1))
    await first.wait_for(1)

    later_topic, later_group = inbox("later")
    later = Collector(harness)
    await queue.subscribe(later_topic, later_group, later)
    await queue.publish(later_topic, ev(2))
    await later.wait_for(1)
    await queue.publish(first_topic, ev(3))
    await first.wait_for(2)
    await later.quiet()
    assert first.payloads() == [1, 3] and later.payloads() == [2]


# ---------------------------------------------------------------------------
# ensure_subscription


async def test_ensure_subscription_says_whether_it_created_and_a_second_call_keeps_the_mail(harness, queue):
    topic, group = inbox()
    assert await queue.ensure_subscription(topic, group) is True
    await queue.publish(topic, ev(0))
    await queue.publish(topic, ev(1))
    assert await queue.ensure_subscription(topic, group) is False
    assert await queue.backlog(topic, group) == 2
    other = await harness.client("n2")
    assert await other.ensure_subscription(topic, group) is False, "another node's ensure is a no-op too"
    assert await queue.backlog(topic, group) == 2
    assert await queue.list_subscriptions(topic) == [SubscriptionRef(topic, group)]


async def test_subscribing_creates_the_subscription_so_a_later_ensure_reports_it_exists(harness, queue):
    topic, group = inbox()
    await queue.subscribe(topic, group, Collector(harness))
    assert await queue.ensure_subscription(topic, group) is False
    assert await queue.list_subscriptions(topic) == [SubscriptionRef(topic, group)]


async def test_mail_published_to_an_ensured_unattached_subscription_is_replayed_in_order_on_attach(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    sent = await publish_all(queue, topic, [ev(i) for i in range(6)])
    assert await queue.backlog(topic, group) == len(sent)
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    await col.wait_for(len(sent))
    assert [d.event.id for d in col.items] == [e.id for e in sent]
    assert remaining(col) == [FIRST] * len(sent)
    await col.quiet()
    await drained(harness, queue, topic, group)


# ---------------------------------------------------------------------------
# The mailbox semantic


async def test_a_publish_that_no_subscription_covers_retains_nothing(harness, queue):
    marker = uniq("ns")
    uncovered = [inbox("nobody")[0], f"crewlet.notifications.{marker}", f"{marker}.work"]
    group = "late-group"
    elsewhere_topic, elsewhere_group = inbox("elsewhere")
    await queue.ensure_subscription(elsewhere_topic, elsewhere_group)  # covers a different subject
    before = await state(queue, (elsewhere_topic, elsewhere_group))
    for topic in uncovered:
        await queue.publish(topic, ev(topic))
    assert await state(queue, (elsewhere_topic, elsewhere_group)) == before, "a publish created or filled a subscription"
    cols = []
    for topic in uncovered:
        assert await queue.ensure_subscription(topic, group) is True
        assert await queue.backlog(topic, group) == 0, f"{topic} retained a publish nobody covered"
        col = Collector(harness)
        await queue.subscribe(topic, group, col)
        cols.append(col)
    await cols[0].quiet(0)
    assert [len(c) for c in cols] == [0] * len(cols)
    assert await queue.backlog(elsewhere_topic, elsewhere_group) == 0
    assert await queue.dead_letters() == []


# ---------------------------------------------------------------------------
# delete_subscription


async def test_delete_subscription_says_whether_it_deleted(harness, queue):
    topic, group = inbox()
    assert await queue.delete_subscription(topic, group) is False, "nothing to delete yet"
    await queue.ensure_subscription(topic, group)
    assert await queue.delete_subscription(topic, group) is True
    assert await queue.delete_subscription(topic, group) is False
    assert await queue.list_subscriptions(topic) == []


async def test_deleting_a_subscription_discards_its_mail_and_leaves_a_neighbouring_group_alone(harness, queue):
    topic, group = inbox()
    neighbour = f"{group}-neighbour"
    await queue.ensure_subscription(topic, group)
    await queue.ensure_subscription(topic, neighbour)
    sent = await publish_all(queue, topic, [ev(i) for i in range(3)])
    assert await queue.delete_subscription(topic, group) is True
    assert await queue.backlog(topic, group) == 0
    assert await queue.backlog(topic, neighbour) == 3
    assert await queue.list_subscriptions(topic) == [SubscriptionRef(topic, neighbour)]
    col = Collector(harness)
    await queue.subscribe(topic, neighbour, col)
    await col.wait_for(3)
    assert [d.event.id for d in col.items] == [e.id for e in sent]
    await drained(harness, queue, topic, neighbour)
    assert await queue.dead_letters() == []


async def test_deleting_the_only_subscription_discards_its_mail_for_good(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    for i in range(2):
        await queue.publish(topic, ev(i))
    assert await queue.backlog(topic, group) == 2
    assert await queue.delete_subscription(topic, group) is True
    assert await queue.ensure_subscription(topic, group) is True
    assert await queue.backlog(topic, group) == 0, "a re-created subscription replayed mail the delete discarded"
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    await col.quiet(0)
    assert await queue.dead_letters() == []


async def test_a_publish_after_delete_subscription_is_not_retained_and_the_attachment_goes_with_it(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    await queue.publish(topic, ev(0))
    await col.wait_for(1)
    await drained(harness, queue, topic, group)
    assert await queue.delete_subscription(topic, group) is True
    await queue.publish(topic, ev(1))
    await col.quiet(1)
    assert await queue.backlog(topic, group) == 0
    assert await queue.list_subscriptions(topic) == []
    assert await queue.ensure_subscription(topic, group) is True
    assert await queue.backlog(topic, group) == 0, "the publish after the delete was retained"
    assert await queue.dead_letters() == []


# ---------------------------------------------------------------------------
# Identity and listeners


async def test_the_backend_names_itself_with_a_stable_lowercase_name(harness, queue):
    name = queue.name
    assert name == harness.name
    assert re.fullmatch(r"[a-z][a-z0-9_-]*", name), f"{name!r} is not a stable lowercase name"
    other = await harness.client("n2")
    assert other.name == name
    await queue.close()
    assert queue.name == name, "the name does not change with the client's life"


async def test_a_publish_listener_sees_every_publish_with_the_stamped_event(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    nobodys = inbox("nobody")[0]
    record = f"crewlet.events.{uniq('probe')}"
    seen = []

    async def listener(t, e):
        seen.append((t, e, await queue.backlog(topic, group)))

    queue.add_publish_listener(listener)
    sent = [ev(1), ev(2), ev(3)]
    await queue.publish(topic, sent[0])
    assert len(seen) == 1, "a listener runs inline: it has run when publish returns"
    assert seen[0][2] == 1, "a listener runs after the broker acknowledged the message"
    await queue.publish(nobodys, sent[1])
    await queue.publish(record, sent[2])
    assert [(t, e.id) for t, e, _ in seen] == [(topic, sent[0].id), (nobodys, sent[1].id), (record, sent[2].id)]
    for (_, e, _), original in zip(seen, sent):
        assert e.node == queue.node == "n1", "the listener is handed the event as the queue stamped it"
        assert e is not original and original.node == ""
        assert e.payload == original.payload and e.timestamp == original.timestamp


async def test_a_failing_listener_stops_nothing(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    heard = []

    async def broken(t, e):
        raise RuntimeError("telemetry is down")

    async def healthy(t, e):
        heard.append(e.id)

    queue.add_publish_listener(broken)
    queue.add_publish_listener(healthy)
    sent = [ev(1), ev(2)]
    for e in sent:
        await queue.publish(topic, e)  # does not raise
    assert heard == [e.id for e in sent], "a listener after a failing one still runs"
    await col.wait_for(2)
    assert [d.event.id for d in col.items] == [e.id for e in sent]
    await drained(harness, queue, topic, group)
