"""Conformance: letting go of a subscription (docs/design.md § Attachment), on every backend.

Design: docs/design.md § Letting go of a subscription. Quiesce stops taking
new work while attached, unquiesce undoes it, detach closes this process's
consumers and keeps the durable subscription and its mail, and none of them
reaches across to another client on the same broker.
"""
from __future__ import annotations

import asyncio
from typing import Any

from crewlet.queue.contract import BatchOptions, Outcome, SubscriptionRef
from crewlet.queue.queuetest.harness import FIRST, Collector, attached, both_attached, drained, ev, inbox, only, publish_all, uniq


async def nothing_to_let_go_until_attached(harness, queue, verb: str):
    """The pair-level ``verb`` (detach or quiesce) reports False before this client attaches: never attached, and
    ensured but not attached here. Then an attachment: (topic, group, subscription)."""
    topic, group = inbox()
    let_go = getattr(queue, verb)
    assert await let_go(topic, group) is False, "never attached"
    await queue.ensure_subscription(topic, group)
    assert await let_go(topic, group) is False, "a subscription with no local attachment"
    return topic, group, await queue.subscribe(topic, group, Collector(harness))


# ---------------------------------------------------------------------------
# Detach


async def test_detach_stops_delivery_and_keeps_the_mail_which_replays_on_reattach(harness, queue):
    topic, group, col, sub = await attached(harness, queue)
    await queue.publish(topic, ev(0))
    await col.wait_for(1)
    await drained(harness, queue, topic, group)
    assert await sub.detach() is True
    kept = await publish_all(queue, topic, [ev(1), ev(2)])
    await col.quiet(1)
    assert await queue.backlog(topic, group) == 2
    assert await queue.list_subscriptions(topic) == [SubscriptionRef(topic, group)]
    assert await queue.dead_letters() == []
    again = Collector(harness)
    await queue.subscribe(topic, group, again)
    await again.wait_for(2)
    assert [d.event.id for d in again.items] == [e.id for e in kept]
    assert [d.remaining for d in again.items] == [FIRST, FIRST], "detached mail was never delivered"
    await again.quiet(2)
    assert len(col) == 1, "the detached attachment stays detached"


async def test_detach_reports_whether_there_was_anything_to_detach_and_is_idempotent(harness, queue):
    topic, group, sub = await nothing_to_let_go_until_attached(harness, queue, "detach")
    assert await sub.detach() is True
    assert await sub.detach() is False
    assert await queue.detach(topic, group) is False
    first = await queue.subscribe(topic, group, Collector(harness))
    second = await queue.subscribe(topic, group, Collector(harness))
    assert await queue.detach(topic, group) is True, "the pair-level detach closes every local attachment"
    assert await first.detach() is False and await second.detach() is False
    assert await queue.detach(topic, group) is False
    assert await queue.list_subscriptions(topic) == [SubscriptionRef(topic, group)]


async def test_a_detach_inside_a_handler_stops_the_next_delivery(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    await publish_all(queue, topic, [ev(i) for i in range(3)])
    subscribed = asyncio.Event()
    handle: dict[str, Any] = {}

    async def let_go(delivery):
        await subscribed.wait()
        handle.setdefault("detached", []).append(await handle["sub"].detach())

    col = Collector(harness, let_go)
    handle["sub"] = await queue.subscribe(topic, group, col)
    subscribed.set()
    await col.wait_for(1)
    await col.quiet(1)
    assert col.payloads() == [0]
    assert handle["detached"] == [True]
    await drained(harness, queue, topic, group, 2)  # the handled one settled; the rest wait
    await only(queue, {(topic, group): 2})
    again = Collector(harness)
    await queue.subscribe(topic, group, again)
    await again.wait_for(2)
    assert again.payloads() == [1, 2]
    assert [d.remaining for d in again.items] == [FIRST, FIRST], "what was not dispatched paid nothing"


async def test_detach_removes_batch_subscriptions_too(harness, queue):
    topic, group = inbox()
    batch = Collector(harness)
    sub = await queue.subscribe_batch(topic, group, BatchOptions(), batch)
    await queue.publish(topic, ev(0))
    await batch.wait_for(1)
    await drained(harness, queue, topic, group)
    assert await queue.detach(topic, group) is True
    assert await sub.detach() is False
    await queue.publish(topic, ev(1))
    await batch.quiet(1)
    await only(queue, {(topic, group): 1})


async def test_detach_releases_this_attachments_holds(harness, queue):
    topic, group = inbox()
    sub = await queue.subscribe(topic, group, Collector(harness))
    await sub.hold("sandbox")
    await queue.hold(topic, group, "budget")
    assert await sub.detach() is True
    await queue.publish(topic, ev("waited"))
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    (got,) = await col.wait_for(1)
    assert got.event.payload == {"i": "waited"} and got.remaining == FIRST


# ---------------------------------------------------------------------------
# Quiesce / unquiesce


async def test_quiesce_reports_whether_an_attachment_existed(harness, queue):
    topic, group, sub = await nothing_to_let_go_until_attached(harness, queue, "quiesce")
    assert await sub.quiesce() is True
    assert await queue.quiesce(topic, group) is True
    assert await sub.detach() is True
    assert await sub.quiesce() is False
    assert await queue.quiesce(topic, group) is False


async def test_unquiesce_delivers_what_waited_and_reports_true_then_false(harness, queue):
    topic, group, col, sub = await attached(harness, queue)
    assert await sub.unquiesce() is False, "not quiesced"
    assert await sub.quiesce() is True
    sent = await publish_all(queue, topic, [ev(0), ev(1)])
    await col.quiet(0)
    await only(queue, {(topic, group): 2})
    assert await sub.unquiesce() is True
    assert await sub.unquiesce() is False
    await col.wait_for(2)
    assert [d.event.id for d in col.items] == [e.id for e in sent]
    assert [d.remaining for d in col.items] == [FIRST, FIRST]
    # the pair-level verbs say the same
    assert await queue.quiesce(topic, group) is True
    await queue.publish(topic, ev(2))
    await col.quiet(2)
    assert await queue.unquiesce(topic, group) is True
    assert await queue.unquiesce(topic, group) is False
    await col.wait_for(3)
    assert col.payloads() == [0, 1, 2]


async def test_unquiesce_leaves_holds_alone(harness, queue):
    topic, group, col, sub = await attached(harness, queue)
    await sub.hold("sandbox")
    assert await sub.quiesce() is True
    await queue.publish(topic, ev(1))
    assert await sub.unquiesce() is True
    await col.quiet(0)
    await only(queue, {(topic, group): 1})
    await sub.release("sandbox")
    await col.wait_for(1)


async def test_reattaching_clears_a_stale_quiesce(harness, queue):
    topic, group = inbox()
    sub = await queue.subscribe(topic, group, Collector(harness))
    assert await queue.quiesce(topic, group) is True
    assert await sub.detach() is True
    await queue.publish(topic, ev("after-quiesce"))
    col = Collector(harness)
    fresh = await queue.subscribe(topic, group, col)
    await col.wait_for(1)
    assert await fresh.unquiesce() is False, "the new attachment was never quiesced"


async def test_reattaching_after_a_deferral_clears_the_quiesce_it_took(harness, queue):
    topic, group, deferring, sub = await attached(harness, queue, lambda d: Outcome.DEFER)
    sent = ev("handed-off")
    await queue.publish(topic, sent)
    await deferring.wait_for(1)
    await deferring.quiet(1)
    await only(queue, {(topic, group): 1})
    assert await sub.detach() is True
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    (got,) = await col.wait_for(1)
    assert got.event.id == sent.id and got.remaining == FIRST - 1


# ---------------------------------------------------------------------------
# Two clients on one broker


async def test_one_clients_detach_leaves_the_other_attached(harness, queue):
    other, mine, theirs, topic, group = await both_attached(harness, queue)
    assert await queue.detach(topic, group) is True
    sent = await publish_all(queue, topic, [ev(i) for i in range(3)])
    await theirs.wait_for(3)
    assert [d.event.id for d in theirs.items] == [e.id for e in sent]
    await theirs.quiet(3)
    assert len(mine) == 0
    assert await other.detach(topic, group) is True, "the other client's attachment was untouched"


async def test_one_clients_hold_leaves_the_other_ungated(harness, queue):
    other, mine, theirs, topic, group = await both_attached(harness, queue)
    await queue.hold(topic, group, "sandbox")
    sent = await publish_all(queue, topic, [ev(i) for i in range(3)])
    await theirs.wait_for(3)
    assert [d.event.id for d in theirs.items] == [e.id for e in sent]
    await theirs.quiet(3)
    assert len(mine) == 0, "the holding client fetched while held"
    await drained(harness, queue, topic, group)


async def test_one_clients_close_leaves_the_other_attached(harness, queue):
    other, mine, theirs, topic, group = await both_attached(harness, queue)
    await queue.hold(topic, group, "sandbox")
    await queue.close()
    sent = await publish_all(other, topic, [ev(i) for i in range(3)])
    await theirs.wait_for(3)
    assert [d.event.id for d in theirs.items] == [e.id for e in sent]
    assert len(mine) == 0
    await drained(harness, other, topic, group)


async def test_a_client_can_delete_a_subscription_it_never_consumed(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    await queue.publish(topic, ev("doomed"))
    other = await harness.client("n2")
    assert await other.delete_subscription(topic, group) is True
    assert await queue.backlog(topic, group) == 0
    assert await queue.list_subscriptions(topic) == []
    assert await other.delete_subscription(topic, group) is False


async def test_a_broadcast_subscriber_sees_the_other_clients_publish(harness, queue):
    topic = f"crewlet.events.{uniq('seen')}"
    other = await harness.client("n2")
    streamed = Collector(harness)
    await other.subscribe_stream(topic, streamed.stream_handler)
    sent = ev("across")
    await queue.publish(topic, sent)
    ((subject, got),) = await streamed.wait_for(1)
    assert subject == topic and got.id == sent.id and got.node == "n1"
    await streamed.quiet(1)
