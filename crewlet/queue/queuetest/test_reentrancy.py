"""Re-entrancy: a handler's publish is a publish, never a nested delivery."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import pytest

from crewlet.queue.contract import BatchOptions
from crewlet.queue.queuetest.harness import Collector, drained, ev, eventually, inbox


@dataclass(frozen=True)
class Form:
    """How a handler is attached and what it is handed: one delivery, or a partition of a batch."""

    attach: Callable[[Any, str, str, Any], Awaitable[Any]]
    #: What the handler was handed, as the chain's log records it: a link number, or a partition's list of them.
    links: Callable[[Any], Any]
    #: The newest link among what it was handed.
    newest: Callable[[Any], int]
    #: The log entry for link ``n``.
    entry: Callable[[int], Any]
    payload: dict = field(default_factory=dict)


FORMS = {
    "one-delivery-at-a-time": Form(
        attach=lambda queue, topic, group, handler: queue.subscribe(topic, group, handler),
        links=lambda delivery: delivery.event.payload["i"],
        newest=lambda i: i,
        entry=lambda n: n,
    ),
    "a-batch-of-partitions": Form(
        attach=lambda queue, topic, group, handler: queue.subscribe_batch(
            topic, group, BatchOptions(partition_key=lambda e: e.payload["k"]), handler
        ),
        links=lambda partition: [e.payload["i"] for e in partition.events],
        newest=max,
        entry=lambda n: [n],
        payload={"k": "k"},
    ),
}


@pytest.mark.parametrize("form", list(FORMS.values()), ids=list(FORMS))
async def test_a_handler_that_publishes_to_its_own_subscription_is_not_re_entered(harness, queue, form):
    topic, group = inbox()
    log: list[tuple[str, Any]] = []
    depth = 0
    max_depth = 0

    async def handler(item):
        nonlocal depth, max_depth
        depth += 1
        max_depth = max(max_depth, depth)
        links = form.links(item)
        log.append(("enter", links))
        try:
            if form.newest(links) < 3:
                await queue.publish(topic, ev(form.newest(links) + 1, **form.payload))  # its own subscription
            log.append(("exit", links))
        finally:
            depth -= 1

    await form.attach(queue, topic, group, handler)
    await queue.publish(topic, ev(1, **form.payload))
    last = ("exit", form.entry(3))
    await eventually(lambda: log and log[-1] == last, harness.wait_s, "the chain of three")
    assert log == [(step, form.entry(n)) for n in (1, 2, 3) for step in ("enter", "exit")]
    assert max_depth == 1
    await drained(harness, queue, topic, group)


async def test_a_handlers_publish_returns_without_waiting_for_the_delivery_it_causes(harness, queue):
    source, source_group = inbox("source")
    target, target_group = inbox("target")
    gate = asyncio.Event()
    target_started = Collector(harness)
    source_done = Collector(harness)

    async def target_handler(delivery):
        await target_started(delivery)
        await gate.wait()  # the delivery the publish caused does not finish until the case says so

    async def source_handler(delivery):
        await queue.publish(target, ev("caused"))
        if delivery.event.payload["i"] == "first":
            await queue.publish(source, ev("own"))  # and to its own subscription
        await source_done(delivery)

    await queue.subscribe(target, target_group, target_handler)
    await queue.subscribe(source, source_group, source_handler)
    try:
        await queue.publish(source, ev("first"))
        await target_started.wait_for(1)
        # Both source deliveries finished while the deliveries they caused were still running.
        await source_done.wait_for(2)
        assert source_done.payloads() == ["first", "own"]
        assert not gate.is_set()
        assert queue.in_flight() == 1
    finally:
        gate.set()
    await target_started.wait_for(2)
    assert target_started.payloads() == ["caused", "caused"]
    await drained(harness, queue, source, source_group)
    await drained(harness, queue, target, target_group)
