"""Conformance: core delivery (conformance.md § Core delivery), on every backend.

Design: event-system.md § Delivery Semantics, § Publish Listeners. Every case
runs against each backend through the ``harness`` / ``queue`` fixtures.
"""
from __future__ import annotations

import asyncio
import inspect
import re

import pytest

from crewlet.queue.contract import MAX_DELIVERIES, BatchOptions, Outcome, SubscriptionRef, Timings
from crewlet.queue.errors import NotLive
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


# ---------------------------------------------------------------------------
# Holds and pausing


async def test_a_held_pair_keeps_its_mail_while_other_topics_flow_and_flushes_in_order_on_release(harness, queue):
    (held_t, held_g), (free_t, free_g) = inbox("held"), inbox("free")
    held, free = Collector(harness), Collector(harness)
    await queue.subscribe(held_t, held_g, held)
    await queue.subscribe(free_t, free_g, free)
    await queue.hold(held_t, held_g, "sandbox")
    sent = await publish_all(queue, held_t, [ev(i) for i in range(3)])
    await queue.publish(free_t, ev("flows"))
    await free.wait_for(1)
    await held.quiet(0)
    await only(queue, {(held_t, held_g): 3, (free_t, free_g): 0})
    await queue.release(held_t, held_g, "sandbox")
    await held.wait_for(3)
    assert [d.event.id for d in held.items] == [e.id for e in sent]
    assert remaining(held) == [FIRST] * 3, "a held pair's mail keeps its delivery count intact"
    await drained(harness, queue, held_t, held_g)


async def test_holds_are_scoped_by_the_topic_group_pair_so_siblings_are_not_gated(harness, queue):
    topic, group = inbox()
    sibling_topic, _ = inbox("sibling")
    held = Collector(harness)
    sibling_group = Collector(harness)
    same_group_other_topic = Collector(harness)
    await queue.subscribe(topic, group, held)
    await queue.subscribe(topic, f"{group}-sibling", sibling_group)
    await queue.subscribe(sibling_topic, group, same_group_other_topic)
    await queue.hold(topic, group, "sandbox")
    await queue.publish(topic, ev("gated"))
    await queue.publish(sibling_topic, ev("other-topic"))
    await sibling_group.wait_for(1)
    await same_group_other_topic.wait_for(1)
    await held.quiet(0)
    await only(queue, {(topic, group): 1, (topic, f"{group}-sibling"): 0, (sibling_topic, group): 0})
    await queue.release(topic, group, "sandbox")
    (got,) = await held.wait_for(1)
    assert got.event.payload == {"i": "gated"} and got.remaining == FIRST


async def test_releasing_an_unheld_pair_or_key_is_a_no_op(harness, queue):
    topic, group = inbox()
    before = await state(queue, (topic, group))
    await queue.release(topic, group, "never-held")  # never attached, never held
    assert await state(queue, (topic, group)) == before, "a release must not create or change anything"
    col = Collector(harness)
    sub = await queue.subscribe(topic, group, col)
    await sub.hold("sandbox")
    await sub.release("some-other-key")  # not held: the gate stays
    await queue.publish(topic, ev(1))
    await col.quiet(0)
    await sub.release("sandbox")
    await col.wait_for(1)
    await sub.release("sandbox")  # a second release of the same key: still a no-op
    await queue.publish(topic, ev(2))
    await col.wait_for(2)
    assert col.payloads() == [1, 2]


async def test_pausing_all_delivery_still_accepts_publishes(harness, queue):
    (t1, g1), (t2, g2) = inbox("single"), inbox("batch")
    single, batch = Collector(harness), Collector(harness)
    await queue.subscribe(t1, g1, single)
    await queue.subscribe_batch(t2, g2, BatchOptions(), batch)
    await queue.pause_delivery()
    for i in range(2):
        await queue.publish(t1, ev(i))
        await queue.publish(t2, ev(i))
    await single.quiet(0)
    assert len(batch) == 0
    await only(queue, {(t1, g1): 2, (t2, g2): 2})
    await queue.resume_delivery()
    await single.wait_for(2)
    await eventually(lambda: sum(len(p.deliveries) for p in batch.items) == 2, harness.wait_s, "the batch")
    assert single.payloads() == [0, 1]
    assert [d.event.payload["i"] for p in batch.items for d in p.deliveries] == [0, 1]


# ---------------------------------------------------------------------------
# Handlers in flight


async def test_handlers_in_flight_can_be_counted_and_waited_for(harness, queue):
    gate = asyncio.Event()

    async def blocked(delivery):
        await gate.wait()

    (t1, g1), (t2, g2) = inbox("a"), inbox("b")
    await queue.subscribe(t1, g1, Collector(harness, blocked))
    await queue.subscribe(t2, g2, Collector(harness, blocked))
    assert queue.in_flight() == 0
    assert await queue.wait_idle(0) is True
    await queue.publish(t1, ev(1))
    await queue.publish(t2, ev(2))
    await eventually(lambda: queue.in_flight() == 2, harness.wait_s, "two handlers in flight")
    assert await queue.wait_idle(0.05) is False, "the deadline passes while handlers run"
    gate.set()
    assert await queue.wait_idle(harness.wait_s) is True
    assert queue.in_flight() == 0
    await drained(harness, queue, t1, g1)
    await drained(harness, queue, t2, g2)


async def test_a_drain_racing_new_handlers_never_counts_below_zero(harness, queue):
    pairs = [inbox(f"race{k}") for k in range(3)]
    samples: list[int] = []
    failed_once: set[str] = set()

    async def work(delivery):
        samples.append(queue.in_flight())
        await asyncio.sleep(0)
        if delivery.event.payload["i"] % 3 == 0 and delivery.event.id not in failed_once:
            failed_once.add(delivery.event.id)
            raise RuntimeError("transient")  # a raising handler must count down too
        samples.append(queue.in_flight())

    cols = [Collector(harness, work) for _ in pairs]
    for (topic, group), col in zip(pairs, cols):
        await queue.subscribe(topic, group, col)
    stop = asyncio.Event()

    async def drainer():
        while not stop.is_set():
            samples.append(queue.in_flight())
            await queue.wait_idle(0)
            samples.append(queue.in_flight())
            await asyncio.sleep(0)

    racing = asyncio.create_task(drainer())
    try:
        n = 10
        for i in range(n):
            for topic, _ in pairs:
                await queue.publish(topic, ev(i))
        expected = len(pairs) * (n + len([i for i in range(n) if i % 3 == 0]))
        await eventually(lambda: sum(len(c) for c in cols) >= expected, harness.wait_s, f"{expected} deliveries")
        assert await queue.wait_idle(harness.wait_s) is True
    finally:
        stop.set()
        await racing
    assert min(samples) >= 0
    assert max(samples) <= len(pairs), "one handler at a time per attachment"
    assert queue.in_flight() == 0
    for topic, group in pairs:
        await drained(harness, queue, topic, group)


# ---------------------------------------------------------------------------
# Closing


async def test_closing_twice_is_fine(harness, queue):
    topic, group = inbox()
    await queue.subscribe(topic, group, Collector(harness))
    await queue.close()
    await queue.close()
    with pytest.raises(NotLive):
        await queue.publish(topic, ev(1))


async def test_a_closed_client_refuses_every_verb_with_the_same_not_live_error(harness, queue):
    topic, group = inbox()
    sub = await queue.subscribe(topic, group, Collector(harness))
    await queue.close()

    async def noop(*_):
        return None

    async def answer(_):
        return b""

    verbs = {
        "publish": lambda: queue.publish(topic, ev(1)),
        "add_publish_listener": lambda: queue.add_publish_listener(noop),
        "ensure_subscription": lambda: queue.ensure_subscription(topic, group),
        "delete_subscription": lambda: queue.delete_subscription(topic, group),
        "list_subscriptions": lambda: queue.list_subscriptions(">"),
        "subscribe": lambda: queue.subscribe(topic, group, noop),
        "subscribe_batch": lambda: queue.subscribe_batch(topic, group, BatchOptions(), noop),
        "subscribe_stream": lambda: queue.subscribe_stream("crewlet.events.>", noop),
        "ask": lambda: queue.ask("crewlet.fleet.read", b"q", 1, 0.05),
        "serve": lambda: queue.serve("crewlet.fleet.read", answer),
        "backlog": lambda: queue.backlog(topic, group),
        "dead_letters": lambda: queue.dead_letters(),
        "replay_dead_letter": lambda: queue.replay_dead_letter("1"),
        "quiesce": lambda: queue.quiesce(topic, group),
        "unquiesce": lambda: queue.unquiesce(topic, group),
        "detach": lambda: queue.detach(topic, group),
        "hold": lambda: queue.hold(topic, group, "k"),
        "release": lambda: queue.release(topic, group, "k"),
        "pause_delivery": lambda: queue.pause_delivery(),
        "resume_delivery": lambda: queue.resume_delivery(),
        "subscription.quiesce": lambda: sub.quiesce(),
        "subscription.unquiesce": lambda: sub.unquiesce(),
        "subscription.detach": lambda: sub.detach(),
        "subscription.hold": lambda: sub.hold("k"),
        "subscription.release": lambda: sub.release("k"),
    }
    messages = {}
    for name, call in verbs.items():
        try:
            result = call()
            if inspect.isawaitable(result):
                await result
        except NotLive as e:
            messages[name] = str(e)
        else:
            pytest.fail(f"{name} on a closed client did not raise NotLive")
    assert len(set(messages.values())) == 1, f"one 'not live' error for every verb: {messages}"


async def test_a_closed_client_leaves_no_state_behind(harness, queue):
    topic, group = inbox()
    broadcast_topic = f"crewlet.events.{uniq('closed')}"
    subject = f"crewlet.fleet.{uniq('ask')}"
    other = await harness.client("n2")
    consumed, streamed = Collector(harness), Collector(harness)
    await queue.subscribe(topic, group, consumed)
    await queue.hold(topic, group, "sandbox")
    await queue.subscribe_stream(broadcast_topic, streamed.stream_handler)

    async def answer(_):
        return b"from-a-closed-client"

    await queue.serve(subject, answer)
    await queue.close()

    await other.publish(topic, ev("mail"))
    await other.publish(broadcast_topic, ev("live"))
    assert await other.ask(subject, b"anyone?", 1, harness.quiet_s) == [], "a closed client still answers"
    await consumed.quiet(0)
    assert len(streamed) == 0, "a closed client's broadcast still dispatches"
    assert await other.backlog(topic, group) == 1, "the mailbox is the broker's: it outlives the client"
    assert await other.list_subscriptions(topic) == [SubscriptionRef(topic, group)]
    col = Collector(harness)
    await other.subscribe(topic, group, col)  # the closed client's hold gates nobody
    (got,) = await col.wait_for(1)
    assert got.event.payload == {"i": "mail"} and got.remaining == FIRST
    assert await other.dead_letters() == []


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
