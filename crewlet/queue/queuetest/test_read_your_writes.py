"""Reads right behind writes (docs/design.md § Backlog reads its own writes), on every backend.

A publish that returned has been stored, so a backlog read made right after it
counts it, from the client that wrote it and from any other, however busy the
broker is. On JetStream the busy broker is what exposes a consumer's running
count: its stream acknowledges a publish before it signals its consumers, and
the signals wait in a queue behind every message the stream stored before.
"""
from __future__ import annotations

import asyncio

from crewlet.queue.queuetest.harness import ev, inbox

#: Groups sharing one busy topic: every message stored on it is one signal per
#: group for the stream to hand out before it reaches the next message's.
BUSY_GROUPS = 200
#: Messages stored on the busy topic just before each round's writes (as fast as the backend takes them).
BURST = 20000
#: Clients writing the round's mail at once, three messages each.
PUBLISHERS = 4
PER_PUBLISHER = 3
ROUNDS = 2


async def test_a_backlog_read_right_after_concurrent_publishes_counts_every_one_on_a_busy_broker(harness, queue):
    busy, _ = inbox("busy")
    await asyncio.gather(*(queue.ensure_subscription(busy, f"busy-{i}") for i in range(BUSY_GROUPS)))
    publishers = [queue] + [await harness.client(f"p{n}") for n in range(1, PUBLISHERS)]
    reader = publishers[-1]
    expected = PUBLISHERS * PER_PUBLISHER
    seen = []
    for _ in range(ROUNDS):
        topic, group = inbox()
        await queue.ensure_subscription(topic, group)
        await harness.flood(queue, busy, BURST)
        await asyncio.gather(
            *(p.publish(topic, ev(i, by=n)) for n, p in enumerate(publishers) for i in range(PER_PUBLISHER))
        )
        seen.append((await queue.backlog(topic, group), await reader.backlog(topic, group)))
    assert seen == [(expected, expected)] * ROUNDS
