"""Queue throughput and latency through JetStreamQueue vs raw nats-py, same broker, same run.

    .venv/bin/python bench/queue_bench.py [--messages 5000] [--batch 20]

Every figure is printed beside the raw nats-py baseline measured in the same
run on the same embedded broker, and the ratio (ours / raw; for latency
raw / ours, so above 1 is better either way). Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nats  # the baseline is raw nats-py on purpose

from crewlet.events import Event
from crewlet.queue import BatchOptions, Timings
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.jetstream import JetStreamQueue

PAYLOAD_BYTES = 512
TIMINGS = Timings()


def _event(i: int) -> Event:
    return Event(type="bench", payload={"i": i, "pad": "x" * 320})


async def _raw_setup(url: str):
    nc = await nats.connect(url)
    return nc, nc.jetstream()


async def _ensure(queue, topic: str, group: str) -> None:
    await queue.ensure_subscription(topic, group)


async def publish_ours(queue, topic: str, n: int) -> float:
    events = [_event(i) for i in range(n)]
    t0 = time.perf_counter()
    for e in events:
        await queue.publish(topic, e)
    return n / (time.perf_counter() - t0)


async def publish_raw(js, topic: str, n: int, stream: str) -> float:
    data = [_event(i).to_json() for i in range(n)]
    t0 = time.perf_counter()
    for d in data:
        await js.publish(topic, d, stream=stream)
    return n / (time.perf_counter() - t0)


async def consume_ours(queue, topic: str, group: str, n: int, batch: int) -> float:
    done = asyncio.Event()
    seen = 0

    if batch == 1:

        async def handler(delivery):
            nonlocal seen
            seen += 1
            if seen >= n:
                done.set()

        t0 = time.perf_counter()
        sub = await queue.subscribe(topic, group, handler)
    else:

        async def handler(partition):
            nonlocal seen
            seen += len(partition.deliveries)
            if seen >= n:
                done.set()

        t0 = time.perf_counter()
        sub = await queue.subscribe_batch(topic, group, BatchOptions(max_batch=batch), handler)
    await done.wait()
    rate = n / (time.perf_counter() - t0)
    await sub.detach()
    return rate


async def consume_raw(js, stream: str, durable: str, n: int, batch: int) -> float:
    psub = await js.pull_subscribe_bind(durable, stream=stream)
    seen = 0
    t0 = time.perf_counter()
    while seen < n:
        try:
            msgs = await psub.fetch(batch, timeout=1.0)
        except nats.errors.TimeoutError:
            continue
        for m in msgs:
            Event.from_json(m.data)  # the same decode the queue does for its handler
            await m.ack()
            seen += 1
    rate = n / (time.perf_counter() - t0)
    await psub.unsubscribe()
    return rate


async def latency_ours(queue, topic: str, group: str, n: int) -> list[float]:
    arrived: asyncio.Queue[float] = asyncio.Queue()

    async def handler(delivery):
        arrived.put_nowait(time.perf_counter())

    sub = await queue.subscribe(topic, group, handler)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await queue.publish(topic, _event(i))
        out.append(await arrived.get() - t0)
    await sub.detach()
    return out


async def latency_raw(js, stream: str, durable: str, topic: str, n: int) -> list[float]:
    psub = await js.pull_subscribe_bind(durable, stream=stream)
    arrived: asyncio.Queue[float] = asyncio.Queue()
    stop = False

    async def pull():
        while not stop:
            try:
                msgs = await psub.fetch(1, timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            for m in msgs:
                Event.from_json(m.data)
                await m.ack()
                arrived.put_nowait(time.perf_counter())

    task = asyncio.create_task(pull())
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await js.publish(topic, _event(i).to_json(), stream=stream)
        out.append(await arrived.get() - t0)
    stop = True
    await task
    await psub.unsubscribe()
    return out


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def _line(name: str, ours: float, raw: float, unit: str, higher_is_better: bool = True) -> str:
    ratio = ours / raw if higher_is_better else raw / ours
    return f"{name:<34} ours {ours:>10.1f} {unit:<6} raw {raw:>10.1f} {unit:<6} ratio {ratio:.2f}x"


async def main(n: int, batch: int) -> None:
    from crewlet.queue import topics

    async with EmbeddedBroker(store_dir=None) as broker:
        queue = await JetStreamQueue.connect(broker.url, node="bench", timings=TIMINGS)
        nc, js = await _raw_setup(broker.url)
        stream = topics.AGENT_STREAM.name
        try:
            print(f"queue bench: {n} messages of ~{PAYLOAD_BYTES} B, embedded nats-server, {os.cpu_count()} cores")
            # Publish: alternate rounds so drift on a noisy machine hits both sides.
            ours_pub, raw_pub = [], []
            for r in range(2):
                t_o, t_r = f"crewlet.agent.benchpub{r}.inbox", f"crewlet.agent.benchraw{r}.inbox"
                await _ensure(queue, t_o, "g")
                await _ensure(queue, t_r, "g")
                ours_pub.append(await publish_ours(queue, t_o, n))
                raw_pub.append(await publish_raw(js, t_r, n, stream))
            print(_line("publish (await each)", statistics.median(ours_pub), statistics.median(raw_pub), "msg/s"))

            # Consume: the messages published above are the backlog.
            from crewlet.queue.jetstream import durable_name

            for b in (1, batch):
                label = "consume subscribe (fetch 1)" if b == 1 else f"consume subscribe_batch ({b})"
                r_o = await consume_ours(queue, f"crewlet.agent.benchpub{0 if b == 1 else 1}.inbox", "g", n, b)
                r_r = await consume_raw(js, stream, durable_name(f"crewlet.agent.benchraw{0 if b == 1 else 1}.inbox", "g"), n, b)
                print(_line(label, r_o, r_r, "msg/s"))

            lat_n = max(n // 10, 200)
            t_o, t_r = "crewlet.agent.benchlat.inbox", "crewlet.agent.benchlatraw.inbox"
            await _ensure(queue, t_o, "g")
            await _ensure(queue, t_r, "g")
            lo = await latency_ours(queue, t_o, "g", lat_n)
            lr = await latency_raw(js, stream, durable_name(t_r, "g"), t_r, lat_n)
            print(_line("publish->handler p50", _pct(lo, 0.5) * 1e3, _pct(lr, 0.5) * 1e3, "ms", higher_is_better=False))
            print(_line("publish->handler p99", _pct(lo, 0.99) * 1e3, _pct(lr, 0.99) * 1e3, "ms", higher_is_better=False))
        finally:
            await nc.close()
            await queue.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.batch))
