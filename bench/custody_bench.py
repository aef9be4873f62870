"""Custody: what a stateless node's publish costs against a data node's, and what a read pays while a batch is in flight.

    .venv/bin/python bench/custody_bench.py [--events 4000] [--publishers 8] [--rows 20000] [--unsettled 500] [--repeat 200]

One embedded nats-server and one PostgreSQL event store (the bench's own
databases, created at start and dropped at the end):

1. Publishing: ``--publishers`` concurrent publishers each awaiting
   ``--events`` / publishers publishes, first on a data node (its publish
   listener writes the row: ``eventstore.writer``), then on a stateless node
   (its publish listener hands the row to the data node in custody batches:
   ``eventstore.custody``, the keeper writing into the same store). Ratio:
   custody / data node's own, events per second.
2. Reading: the median latency of one events page (``limit=100``) asked through
   the fleet read (``eventstore.fanout``) of a store of ``--rows`` rows, all
   settled, then with ``--unsettled`` of them in an unsettled custody batch (the
   read names them, asks ``kept`` and re-asks for exactly them). Ratio: settled
   / in flight, so above 1 would be the in-flight read being faster.

Nothing here asserts a time; both sides of each ratio run in the same process
one after the other.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import versus  # noqa: E402

versus.use_code()

import psycopg  # noqa: E402

import benchdb  # noqa: E402

EVENTS_DB = "crewlet_custody_bench"
DEFAULT_DB = "crewlet_custody_bench_default"


def _events(prefix: str, n: int, node: str) -> list[Any]:
    from crewlet.events import new
    from crewlet.events.tracing import Trace
    from crewlet.events.types import AgentTurnCompleted

    start = datetime.now(timezone.utc) - timedelta(hours=1)
    out = []
    for i in range(n):
        body = AgentTurnCompleted(seat=f"seat-{i % 20}", turn_id=f"{prefix}-turn-{i}", input_tokens=900, output_tokens=120, tool_calls=2)
        event = new(body, Trace(f"{i + 1:032x}", f"{i + 1:016x}"), event_id=f"{prefix}-{i:08d}", timestamp=start + timedelta(microseconds=i * 97))
        event.node = node
        out.append(event)
    return out


async def _publish_all(queue: Any, events: list[Any], publishers: int) -> float:
    """Events per second: ``publishers`` concurrent publishers, each awaiting its share one by one."""
    from crewlet.queue import topics

    async def one(share: list[Any]) -> None:
        for event in share:
            await queue.publish(topics.event(event.type), event)

    started = time.perf_counter()
    await asyncio.gather(*(one(events[i::publishers]) for i in range(publishers)))
    return len(events) / (time.perf_counter() - started)


def _rows_now() -> int:
    from django.db import connections

    with connections["events"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM eventstore_event")
        return int(cursor.fetchone()[0])


async def publishing(args: argparse.Namespace, broker_url: str) -> tuple[float, float]:
    from asgiref.sync import sync_to_async

    from crewlet.queue.jetstream import JetStreamQueue
    from eventstore.custody import CustodyKeeper, CustodyWriter
    from eventstore.writer import attach

    data = await JetStreamQueue.connect(broker_url, node="data", memory_storage=True)
    stateless = await JetStreamQueue.connect(broker_url, node="stateless", memory_storage=True)
    writer = attach(data)
    keeper = CustodyKeeper(data, "data", every_s=3600)
    await keeper.start()
    custody = CustodyWriter(stateless, "stateless", timeout_s=5, keepers=lambda _: ["data"])
    stateless.add_publish_listener(custody)
    try:
        own = await _publish_all(data, _events("own", args.events, "data"), args.publishers)
        handed = await _publish_all(stateless, _events("handed", args.events, "stateless"), args.publishers)
        assert await sync_to_async(_rows_now)() == 2 * args.events, "every row written once"
        return own, handed
    finally:
        await custody.aclose()
        await keeper.stop()
        await writer.aclose()
        await stateless.close()
        await data.close()


def _seed(rows: int) -> None:
    from eventstore.writer import insert_sql
    from eventstore.rows import row_for
    from crewlet.queue import topics
    from django.db import connections

    events = _events("seed", rows, "data")
    with connections["events"].cursor() as cursor:
        cursor.execute("DELETE FROM eventstore_event")
        cursor.executemany(insert_sql(), [row_for(topics.event(e.type), e) for e in events])
        cursor.execute("ANALYZE eventstore_event")  # as autovacuum would have by now


def _mark_unsettled(count: int) -> None:
    from django.db import connections

    with connections["events"].cursor() as cursor:
        cursor.execute(
            "UPDATE eventstore_event SET custody_batch = 'bench-batch' WHERE id IN "
            "(SELECT id FROM eventstore_event ORDER BY ts DESC, id DESC LIMIT %s)", [count],
        )
        cursor.execute("ANALYZE eventstore_event")


def reading(args: argparse.Namespace) -> tuple[float, float, int]:
    from eventstore import questions as qs
    from eventstore.fanout import FleetReads
    from eventstore.questions import NodeScope, Question

    _seed(args.rows)
    reader = FleetReads(NodeScope(node_id="data", retention_hours=720.0), roster=lambda: ["data"])

    def page_ms() -> float:
        question = Question(kind=qs.EVENTS, at=qs.instant(), limit=100)
        started = time.perf_counter()
        answer = reader.ask(question)
        elapsed = time.perf_counter() - started
        assert len(answer["events"]) == 100, "a full page"
        return elapsed * 1000.0

    for _ in range(10):
        page_ms()
    settled = statistics.median(page_ms() for _ in range(args.repeat))
    _mark_unsettled(args.unsettled)
    asked = reader.kept_asked
    in_flight = statistics.median(page_ms() for _ in range(args.repeat))
    return settled, in_flight, reader.kept_asked - asked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--unsettled", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    try:
        for name in (EVENTS_DB, DEFAULT_DB):
            benchdb.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            benchdb.admin(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        print(f"cannot reach PostgreSQL ({exc}); run bin/test once (it starts the server) or set CREWLET_PG_*")
        return 2
    try:
        benchdb.setup_django(DEFAULT_DB, EVENTS_DB)
        from crewlet.queue.broker import EmbeddedBroker

        async def run() -> tuple[float, float]:
            async with EmbeddedBroker(store_dir=None) as broker:
                return await publishing(args, broker.url)

        own, handed = asyncio.run(run())
        print(f"custody benchmark on PostgreSQL ({EVENTS_DB})")
        print(f"\n1. publishing: {args.events:,} events each way, {args.publishers} concurrent publishers")
        print(f"  data node (its writer)         : {own:10,.0f} events/s")
        print(f"  stateless node (custody)       : {handed:10,.0f} events/s")
        print(f"  ratio custody / data node      : {handed / own:.2f}x")
        settled, in_flight, asked = reading(args)
        print(f"\n2. reading: an events page of 100 over {args.rows:,} rows, median of {args.repeat}")
        print(f"  every row settled              : {settled:8.3f} ms")
        print(f"  {args.unsettled} rows unsettled (kept asked {asked} times): {in_flight:8.3f} ms")
        print(f"  ratio settled / in flight      : {settled / in_flight:.2f}x")
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        for name in (EVENTS_DB, DEFAULT_DB):
            benchdb.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
