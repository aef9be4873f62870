"""Conformance: holds, pausing, handlers in flight and closing (docs/design.md § Core delivery), on every backend.

Design: docs/design.md § Delivery semantics. A held (topic, group) keeps its
mail with its delivery count intact while other pairs flow; pausing still
accepts publishes; handlers in flight can be counted and waited for; a closed
client refuses every verb with the same error and leaves no state behind.
Every case runs against each backend through the ``harness`` / ``queue``
fixtures.
"""
from __future__ import annotations

import asyncio
import inspect

import pytest

from crewlet.queue.contract import BatchOptions, SubscriptionRef
from crewlet.queue.errors import NotLive
from crewlet.queue.queuetest.harness import (
    FIRST,
    Collector,
    drained,
    ev,
    eventually,
    inbox,
    only,
    publish_all,
    state,
    uniq,
)
from crewlet.queue.queuetest.test_core_delivery import remaining


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
