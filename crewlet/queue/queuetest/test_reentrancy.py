"""Re-entrancy: a handler's publish is a publish, never a nested delivery."""
from __future__ import annotations

import asyncio

from crewlet.queue.contract import BatchOptions
from crewlet.queue.queuetest.harness import Collector, drained, ev, eventually, inbox


async def test_a_handler_that_publishes_to_its_own_subscription_is_not_re_entered(harness, queue):
    topic, group = inbox()
    log: list[tuple[str, int]] = []
    depth = 0
    max_depth = 0

    async def handler(delivery):
        nonlocal depth, max_depth
        depth += 1
        max_depth = max(max_depth, depth)
        i = delivery.event.payload["i"]
        log.append(("enter", i))
        try:
            if i < 3:
                await queue.publish(topic, ev(i + 1))  # its own subscription
            log.append(("exit", i))
        finally:
            depth -= 1

    await queue.subscribe(topic, group, handler)
    await queue.publish(topic, ev(1))
    await eventually(lambda: ("exit", 3) in log, harness.wait_s, "the chain of three")
    assert log == [("enter", 1), ("exit", 1), ("enter", 2), ("exit", 2), ("enter", 3), ("exit", 3)]
    assert max_depth == 1
    await drained(harness, queue, topic, group)


async def test_a_batch_handler_that_publishes_to_its_own_subscription_is_not_re_entered(harness, queue):
    topic, group = inbox()
    log: list[tuple[str, list]] = []
    depth = 0
    max_depth = 0

    async def handler(partition):
        nonlocal depth, max_depth
        depth += 1
        max_depth = max(max_depth, depth)
        ids = [e.payload["i"] for e in partition.events]
        log.append(("enter", ids))
        try:
            if max(ids) < 3:
                await queue.publish(topic, ev(max(ids) + 1, k="k"))
            log.append(("exit", ids))
        finally:
            depth -= 1

    await queue.subscribe_batch(topic, group, BatchOptions(partition_key=lambda e: e.payload["k"]), handler)
    await queue.publish(topic, ev(1, k="k"))
    await eventually(lambda: log and log[-1] == ("exit", [3]), harness.wait_s, "the chain of three")
    assert log == [("enter", [1]), ("exit", [1]), ("enter", [2]), ("exit", [2]), ("enter", [3]), ("exit", [3])]
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
