"""What a clean stop hands back is redelivered at once by the broker that holds the consumer next, a restarted one included.

`up` stops its embedded broker with it, so the broker a restart starts has
only what the consumer's stored state says. An immediate Nak queues a message
for redelivery in the running broker's memory and leaves the stored state as
the fetch wrote it: after a restart the message waited out its whole ack clock
(every one of 148 handed back by a SIGTERM in the fault suite). A hand-back by
a consumer that is leaving records the delivery's clock as run out, which the
broker stores. Real nats-server with a file store; the ack clock is a minute
so that a message left to it cannot be mistaken for one handed back.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from crewlet.events import Event
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.contract import BatchOptions, Outcome, Partition, Timings
from crewlet.queue.jetstream import JetStreamQueue
from waiting_support import eventually

pytestmark = pytest.mark.integration  # a real nats-server, stopped and started on its store

ACK_WAIT_S = 60.0
#: Well inside the ack clock: a restarted broker loads the consumer and redelivers expired mail in 0.5-1.5 s.
PROMPT_S = 20.0
TOPIC, GROUP = topics.agent_inbox("ada"), "agent-ada"


def wake(n: int) -> Event:
    return Event(type="test_event", payload={"n": n, "key": f"k{n}"})


async def test_a_clean_stop_hands_back_what_it_fetched_so_that_the_restarted_broker_redelivers_it_at_once(
    tmp_path: Path,
) -> None:
    timings = Timings(ack_wait_s=ACK_WAIT_S)
    by_key = BatchOptions(partition_key=lambda ev: str(ev.payload["key"]), max_batch=10)
    async with EmbeddedBroker(store_dir=tmp_path / "store") as broker:
        first = await JetStreamQueue.connect(broker.url, memory_storage=False, timings=timings)
        running = asyncio.Event()
        never = asyncio.Event()

        async def stuck(partition: Partition) -> Outcome:
            running.set()
            await never.wait()  # the turn a stop cancels; the other partitions wait behind it
            return Outcome.ACK

        await first.ensure_subscription(TOPIC, GROUP)
        for n in (1, 2, 3):
            await first.publish(TOPIC, wake(n))
        await first.subscribe_batch(TOPIC, GROUP, by_key, stuck)
        await asyncio.wait_for(running.wait(), PROMPT_S)
        await first.pause_delivery()  # the engine's stop: fetching ends, what waits goes back at once
        await first.close(grace_s=0.0)  # and the running handler's mail as it is cancelled

        await broker.stop()  # `up`'s embedded broker stops with it
        await broker.start()
        second = await JetStreamQueue.connect(broker.url, memory_storage=False, timings=timings)
        seen: list[int] = []

        async def record(partition: Partition) -> Outcome:
            seen.extend(int(d.event.payload["n"]) for d in partition.deliveries)
            return Outcome.ACK

        try:
            await second.subscribe_batch(TOPIC, GROUP, by_key, record)
            await eventually(lambda: sorted(seen) == [1, 2, 3], PROMPT_S, "all three redelivered long before the ack clock")
        finally:
            await second.close()
