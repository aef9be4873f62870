"""Seat dispatch: wakes per second through inbox -> ledger -> echo turn -> events, against raw consume.

    .venv/bin/python bench/dispatch_bench.py --wakes 500 [--seats 8] [--max-concurrent 4]

Assumes the PostgreSQL server ``bin/test`` starts (the CREWLET_PG_HOST/PORT/
USER/PASSWORD variables, else the local socket as the current user). It uses
two databases of its own, ``crewlet_bench_dispatch`` (the coordination store:
seat records, pauses, the completion ledger) and
``crewlet_bench_dispatch_events`` (the event store), created when missing and
migrated; they are kept between runs (every run's wakes carry fresh ids, and
the bench seats' ledger and pause rows are cleared at start).

Both figures come from the same run on the same embedded nats-server:

1. engine: ``--wakes`` wakes, each with its own partition key (none coalesce)
   and delivery id, are published spread over ``--seats`` agent seats whose
   mailboxes exist but whose loops are not attached yet; then the
   SeatRuntime starts and the clock runs until every wake's
   ``agent_turn_completed`` has been published. Each wake's path: the inbox
   loop's batch fetch, the duplicate check, the completion-ledger check and
   record (PostgreSQL), the concurrency gate, an echo turn with no delay, and
   the turn's events (started, phase started/completed, completed), each
   written to the event store (PostgreSQL) by the publish listener.
2. raw: the queue benchmark's raw nats-py consume (``fetch(1)`` + decode +
   ``ack``, ``bench/queue_bench.py``'s ``consume_raw``) of as many
   pre-published messages of the same stream.

The ratio engine / raw shows what the engine adds per wake. Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from typing import Any

# Run as a script, bench/ is the first path entry: versus puts the measured checkout before it.
import versus

versus.use_code()

import psycopg  # creating the bench databases

import benchdb

DEFAULT_DB = "crewlet_bench_dispatch"
EVENTS_DB = "crewlet_bench_dispatch_events"


def ensure_databases() -> None:
    with psycopg.connect(**benchdb.conninfo("postgres"), autocommit=True) as conn:
        for name in (DEFAULT_DB, EVENTS_DB):
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')


def setup_django() -> None:
    benchdb.setup_django(DEFAULT_DB, EVENTS_DB)


def bench_company(seats: int, max_concurrent: int) -> Any:
    from crewlet.company.parse import parse_company

    return parse_company(
        {
            "org": "bench",
            "providers": {"llm": [{"kind": "echo", "delay_s": 0}]},
            "node": {"max_concurrent": max_concurrent},
            "notification_coalesce_window_seconds": 0,
            "notification_coalesce_max_batch": 20,
            "seats": [{"handle": f"bench{i}", "kind": "agent", "role": "engineer"} for i in range(seats)],
            "schedules": [],
        }
    )


def wake(handle: str, i: int, run: str) -> Any:
    """An inbox wake as the notification service publishes one; its own partition key and delivery id."""
    from crewlet import events
    from crewlet.events.types import ExternalNotification
    from crewlet.events.tracing import Trace

    body = f"wake {i}: please look at POC-{i}"
    return events.new(
        ExternalNotification(seat=handle, sender="sam", body=body),
        Trace.root(),
        source="slack",
        extras={
            "partition_key": f"{run}:p{i}",
            "conversation_identity": f"slack:C0BENCH:{run}:{i}",
            "sender": "sam",
            "body": body,
            "delivery_id": f"{run}:d{i}",
        },
    )


def clear_rows(handles: list[str]) -> None:
    from seats.delivery_models import LedgerEntry, SeatPause

    LedgerEntry.objects.filter(seat__in=handles).delete()
    SeatPause.objects.filter(handle__in=handles).delete()


async def engine_rate(queue: Any, org: Any, wakes: int) -> tuple[float, float, int]:
    """(wakes/s from runtime start to the last turn completed, seconds to publish, events written)."""
    import eventstore
    from asgiref.sync import sync_to_async
    from crewlet.company.org import CompanyHolder
    from crewlet.queue import topics
    from seats.mailboxes import ensure_mailboxes
    from seats.runtime import SeatRuntime

    handles = [s.handle for s in org.agent_seats()]
    await sync_to_async(clear_rows)(handles)
    writer = eventstore.attach(queue)
    completed = 0
    published = 0
    done = asyncio.Event()

    async def count(topic: str, event: Any) -> None:
        nonlocal completed, published
        published += 1
        if event.type == "agent_turn_completed":
            completed += 1
            if completed >= wakes:
                done.set()

    queue.add_publish_listener(count)

    # The mailboxes first (as the runtime's start does), then the backlog, then the loops.
    await ensure_mailboxes(queue, org)
    run = uuid.uuid4().hex[:8]
    t_pub = time.perf_counter()
    for i in range(wakes):
        handle = handles[i % len(handles)]
        await queue.publish(topics.agent_inbox(handle), wake(handle, i, run))
    publish_s = time.perf_counter() - t_pub
    published = 0

    runtime = SeatRuntime(queue, CompanyHolder(org), node_id="bench", run_scheduler=False)
    t0 = time.perf_counter()
    await runtime.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=max(60.0, wakes * 0.2))
        elapsed = time.perf_counter() - t0
    finally:
        await runtime.stop()
        close = getattr(writer, "aclose", None)
        if close is not None:
            await close()
    return wakes / elapsed, publish_s, published


async def raw_rate(broker_url: str, queue: Any, messages: int) -> float:
    """queue_bench's raw nats-py consume (fetch 1, decode, ack) of ``messages`` pre-published ones."""
    from queue_bench import _raw_setup, consume_raw, publish_raw

    from crewlet.queue import topics
    from crewlet.queue.jetstream import durable_name

    topic, group = f"crewlet.agent.dispatchraw{uuid.uuid4().hex[:6]}.inbox", "g"
    stream = topics.AGENT_STREAM.name
    await queue.ensure_subscription(topic, group)
    nc, js = await _raw_setup(broker_url)
    try:
        await publish_raw(js, topic, messages, stream)
        return await consume_raw(js, stream, durable_name(topic, group), messages, 1)
    finally:
        await nc.close()
        await queue.delete_subscription(topic, group)  # else the seat sweep reports it as a stray mailbox


async def main(wakes: int, seats: int, max_concurrent: int) -> dict[str, str]:
    from crewlet.queue import Timings
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue

    org = bench_company(seats, max_concurrent)
    async with EmbeddedBroker(store_dir=None) as broker:
        queue = await JetStreamQueue.connect(
            broker.url, node="bench", timings=Timings(), memory_storage=broker.memory_storage
        )
        try:
            print(
                f"dispatch bench: {wakes} wakes over {seats} agent seats, echo (delay 0), max_concurrent "
                f"{max_concurrent}, embedded nats-server + PostgreSQL, {os.cpu_count()} cores"
            )
            raw = await raw_rate(broker.url, queue, wakes)
            ours, publish_s, events_written = await engine_rate(queue, org, wakes)
        finally:
            await queue.close()
    print(f"{'raw nats-py consume (fetch 1 + ack)':<40} {raw:>10.1f} msg/s")
    print(f"{'engine: wake -> ledger -> turn -> events':<40} {ours:>10.1f} wakes/s  ({events_written} events published)")
    print(f"{'ratio engine / raw':<40} {ours / raw:>10.3f}x  (each wake costs {1 / ours * 1e3 - 1 / raw * 1e3:.2f} ms more)")
    print(f"(publishing the {wakes} wakes beforehand took {publish_s:.2f} s; not counted)")
    return {"dispatch (wake -> ledger -> echo turn -> events) vs raw fetch(1)+ack": f"{ours / raw:.3f}x ({ours:,.0f} wakes/s)"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakes", type=int, default=500)
    parser.add_argument("--seats", type=int, default=8)
    parser.add_argument("--max-concurrent", type=int, default=4)
    parser.add_argument("--versus", metavar="DIR", help="first run the same benchmark against the checkout DIR (today's main) and print both")
    args = parser.parse_args()
    today = versus.other(__file__, sys.argv[1:], args.versus) if args.versus else None
    ensure_databases()
    setup_django()
    summary = asyncio.run(main(args.wakes, args.seats, args.max_concurrent))
    versus.emit(summary)
    versus.side_by_side(today, summary, args.versus or "")
