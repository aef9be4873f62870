"""A seat's memory: replaying N rows on acquire, and the memory block's cost per turn, against the stream read raw.

    .venv/bin/python bench/memory_bench.py [--rows 10000] [--turns 200] [--postgres]

One embedded nats-server; the node's store is SQLite files in a temporary
directory (``--postgres``: the ``memory_bench`` / ``memory_bench_events``
databases, which ``bin/test`` makes reachable). ``--rows`` rows of one seat
are published on CREWLET_MEMORY (a tenth of them written twice, a twentieth
then forgotten, so the stream holds current values and tombstones), then:

1. acquire: :meth:`seats.memory.holding.MemoryKeeper.acquire` — the one-pass
   replay through the queue and its materialization in the store — against
   raw nats-py reading the same subjects (an ack-none pull consumer at
   ``last_per_subject``, fetch 1000, JSON decoded), in the same run;
2. per turn: :func:`seats.memory.block.memory_block` against the store
   (the counterparty rows of the trigger's sender and the top search hits),
   against building the same block by reading every row straight from the
   stream each turn (the replay, then the person's row and a word match in
   Python) — what a seat without a materialized copy would pay.

Ratios are ours / raw for the replay (the materialization's cost on top of
the read), raw / ours for the block (what the copy saves per turn). Nothing
here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import nats  # the baseline is raw nats-py on purpose
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

SEAT = "ada"
WORDS = ["deploy", "release", "rollback", "incident", "review", "budget", "design", "runbook", "oncall", "canary"]


def setup(postgres: bool) -> None:
    if postgres:
        from benchdb import setup_django  # noqa: E402 - bench/, beside this file

        setup_django("memory_bench", "memory_bench_events")
        return
    os.environ["CREWLET_DATABASE"] = "sqlite"
    os.environ["CREWLET_VAR_DIR"] = tempfile.mkdtemp(prefix="memory-bench-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")
    os.environ.setdefault("CREWLET_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("migrate", database="events", verbosity=0)


async def publish_rows(queue, n: int) -> None:
    from seats.memory.rows import written

    async def one(i: int, **kw) -> None:
        table = "counterparty" if i % 50 == 0 else "notes"
        value = f"row {i}: the {WORDS[i % len(WORDS)]} of service {i % 97} is owned by team {i % 13}"
        await written(queue, SEAT, table, f"k{i}", value, written_by="turn", **kw)

    for start in range(0, n, 200):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 200, n))))
    await asyncio.gather(*(one(i) for i in range(0, n, 10)))
    from seats.memory.rows import written as forget

    await asyncio.gather(*(forget(queue, SEAT, "notes", f"k{i}", deleted=True, written_by="turn") for i in range(1, n, 20)))


async def raw_replay(url: str) -> list[dict]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            f"crewlet.memory.{SEAT}.>", durable=None, stream="CREWLET_MEMORY",
            config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE),
        )
        info = await sub.consumer_info()
        pending = int(info.num_pending or 0)
        out: list[dict] = []
        while len(out) < pending:
            msgs = await sub.fetch(min(1000, pending - len(out)), timeout=5)
            out.extend(json.loads(m.data) for m in msgs)
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def block_from_stream(queue, sender: str, query: str) -> list[tuple[str, str]]:
    """The same block read straight from the stream: the whole replay, then the person's row and word matches."""
    from seats.memory.rows import from_event
    from crewlet.queue import topics

    words = set(query.lower().split())
    rows = [w for w in (from_event(e) for _, e in await queue.read_last(topics.memory_pattern(SEAT))) if w and not w.deleted]
    person = [(w.table, w.key) for w in rows if w.table == "counterparty" and w.key == sender]
    hits = [(w.table, w.key) for w in rows if words & set(str(w.data).lower().replace(":", " ").split())][:3]
    return person + hits


async def main(n: int, turns: int) -> None:
    from crewlet.base.db import in_store
    from crewlet.base.db_router import EVENTS_ALIAS
    from crewlet.company.parse import parse_company
    from crewlet.events import Event
    from crewlet.queue import Timings
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue
    from seats.memory import store
    from seats.memory.block import memory_block
    from seats.memory.holding import MemoryKeeper
    from seats.turn_types import Trigger

    async with EmbeddedBroker(store_dir=None) as broker:
        queue = await JetStreamQueue.connect(broker.url, node="bench", timings=Timings())
        try:
            await queue.purge(f"crewlet.memory.{SEAT}.>")
            started = time.perf_counter()
            await publish_rows(queue, n)
            print(f"memory bench: {n} rows of one seat ({time.perf_counter() - started:.1f} s to publish), "
                  f"{os.environ['CREWLET_DATABASE']}, {os.cpu_count()} cores")
            ours, raw = [], []
            for _ in range(3):  # alternate, so drift on a noisy machine hits both sides
                keeper = MemoryKeeper(queue)
                t0 = time.perf_counter()
                rows = await keeper.acquire(SEAT)
                ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                raw_rows = await raw_replay(broker.url)
                raw.append(time.perf_counter() - t0)
            o, r = statistics.median(ours), statistics.median(raw)
            print(f"  acquire: replay + materialize {rows} live rows ({len(raw_rows)} messages): {o * 1e3:.0f} ms "
                  f"| raw nats-py read of the same subjects {r * 1e3:.0f} ms | {o / r:.2f}x the raw read")

            org = parse_company({"org": "acme", "providers": {"llm": [{"kind": "echo"}]},
                                 "seats": [{"handle": SEAT, "kind": "agent", "tools": ["memory"]}]})
            seat = org.seat_by_handle(SEAT)
            assert seat is not None
            block_ms, stream_ms, block_rows = [], [], 0
            for i in range(turns):
                sender, query = f"k{(i * 50) % n}", f"what about the {WORDS[i % len(WORDS)]} of service {i % 97}?"
                trigger = Trigger(events=[Event(type="external_notification", payload={"sender": sender, "body": query})])
                t0 = time.perf_counter()
                block = await memory_block(seat, trigger)
                block_ms.append((time.perf_counter() - t0) * 1e3)
                block_rows += block.rows
                if i < max(turns // 20, 5):  # the baseline reads the whole stream each time: sampled
                    t0 = time.perf_counter()
                    await block_from_stream(queue, sender, query)
                    stream_ms.append((time.perf_counter() - t0) * 1e3)
            b, s = statistics.median(block_ms), statistics.median(stream_ms)
            print(f"  memory block per turn (p50 of {turns}, {block_rows / turns:.1f} rows, "
                  f"{await in_store(store.count, alias=EVENTS_ALIAS)(SEAT)} rows held): {b:.2f} ms "
                  f"| read from the stream each turn (p50 of {len(stream_ms)}) {s:.1f} ms | {s / b:.0f}x faster")
        finally:
            await queue.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    setup(args.postgres)
    asyncio.run(main(args.rows, args.turns))
