"""Fleet reads: the first page of /api/events answered by one node vs by three, over the same rows in total.

    python bench/eventfan_bench.py [--rows 60000] [--repeat 300] [--keep]

Runs against the PostgreSQL server bin/test sets up (the CREWLET_PG_*
variables, else the local socket as the current user), in databases of its
own created at start and dropped at the end unless ``--keep``: a coordination
store, one event store holding every row (the lone node), and three event
stores holding a third of the rows each (the fleet). The broker is a real
nats-server (the embedded one).

Each sample is ``GET /api/events?limit=100`` through Django's WSGI handler in
process, asked of the lone node and of the fleet's first node alternately, so
both see the same machine. The fleet's node reads its own store on the
request thread while the engine's loop (a thread here, as under ``up``)
scatters the question to the other two and gathers their pages; the figure
beside it is the slower of the other two nodes' own reads of the same page
(what the fleet read waits for at least). Nodes b and c run in processes of
their own, as a fleet's nodes do; node a, the asker, is this process.
Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import psycopg  # seeding by COPY, creating and dropping the databases

import benchdb
from eventstore_bench import _CATEGORY_TYPES, _wsgi_client

DEFAULT_DB = "crewlet_fanbench_default"
SOLO_DB = "crewlet_fanbench_solo"
NODES = ("a", "b", "c")
NODE_DB = {node: f"crewlet_fanbench_{node}" for node in NODES}
ALL_DBS = (DEFAULT_DB, SOLO_DB, *NODE_DB.values())


def _node_stores() -> None:
    """An alias per fleet node (``node_<id>``) with the store's table, beside the lone node's ``events``."""
    from django.conf import settings
    from django.db import connections

    from eventstore.models import EventRow

    for node, name in NODE_DB.items():
        config = {**connections["events"].settings_dict, "NAME": name}
        settings.DATABASES[f"node_{node}"] = connections.settings[f"node_{node}"] = config
        with connections[f"node_{node}"].schema_editor() as editor:
            editor.create_model(EventRow)


def _copy(dbname: str, rows: list[str]) -> None:
    from eventstore.rows import COLUMNS

    with psycopg.connect(**benchdb.conninfo(dbname), autocommit=True) as conn:
        with conn.cursor().copy(f"COPY eventstore_event ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            copy.write("".join(rows))
        conn.execute("VACUUM ANALYZE eventstore_event")


def seed(n: int, now: datetime) -> None:
    """``n`` rows over the last day, every row to the lone store and to one fleet store by turn (its ``node``)."""
    span_us = 86_400_000_000
    base = now - timedelta(microseconds=span_us)
    shares: dict[str, list[str]] = {node: [] for node in NODES}
    every: list[str] = []
    for i in range(n):
        node = NODES[i % len(NODES)]
        ts = (base + timedelta(microseconds=(i - (i % 40 == 1)) * (span_us // n))).strftime("%Y-%m-%d %H:%M:%S.%f+00")
        category, label = _CATEGORY_TYPES[i % len(_CATEGORY_TYPES)]
        eid = f"{i:08d}-{node}"
        cells = (eid, ts, label, category, node, "bench", f"{i:032x}", f"{i:016x}", "", f"seat-{i % 40}", "", "", "",
                 "", "", "", "0", "", "f", "0", "0", "bench", f"seat-{i % 40} did {label}", '{"pad": "' + "x" * 300 + '"}')
        line = "\t".join(cells) + "\n"
        every.append(line)
        shares[node].append(line)
    _copy(SOLO_DB, every)
    for node, lines in shares.items():
        _copy(NODE_DB[node], lines)


class Loop:
    """The engine's loop in a thread: the broker, a queue per fleet node and each node's fleet reads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-engine-loop", daemon=True)
        self.thread.start()
        self.stack: list[Callable[[], Any]] = []

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        for stop in reversed(self.stack):
            self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def serve_node(node: str) -> None:
    """A fleet node in a process of its own (``--serve``): its store served until stdin closes."""
    os.environ.update(
        CREWLET_DATABASE="postgres", CREWLET_PG_DBNAME=DEFAULT_DB, CREWLET_PG_EVENTS_DBNAME=NODE_DB[node],
        DJANGO_SETTINGS_MODULE="crewlet.settings",
    )
    os.environ.setdefault("CREWLET_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from crewlet.queue.jetstream import JetStreamQueue
    from eventstore.fanout import FleetReads
    from eventstore.questions import NodeScope

    async def run() -> None:
        queue = await JetStreamQueue.connect(os.environ["BENCH_BROKER_URL"], node=node, memory_storage=True)
        reader = FleetReads(NodeScope(node), roster=lambda: list(NODES), queue=queue)
        await reader.start()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await reader.stop()
        await queue.close()

    asyncio.run(run())


def fleet(loop: Loop) -> list[Any]:
    """Node a in this process (the asker); b and c each in a process of its own, as nodes are."""
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue
    from eventstore.fanout import FleetReads
    from eventstore.questions import NodeScope

    broker = EmbeddedBroker(store_dir=None)
    loop.run(broker.start())
    loop.stack.append(broker.stop)
    for node in NODES[1:]:
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", node], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "BENCH_BROKER_URL": broker.url},
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready", f"node {node} did not start"

        async def stop(proc: "subprocess.Popen[str]" = child) -> None:
            assert proc.stdin is not None
            proc.stdin.close()
            await asyncio.get_running_loop().run_in_executor(None, proc.wait)

        loop.stack.append(stop)
    queue = loop.run(JetStreamQueue.connect(broker.url, node="a", memory_storage=True))
    loop.stack.append(queue.close)
    reader = FleetReads(NodeScope("a", using="node_a"), roster=lambda: list(NODES), queue=queue, loop=loop.loop)
    loop.run(reader.start())
    loop.stack.append(reader.stop)
    return [reader, *(FleetReads(NodeScope(n, using=f"node_{n}"), roster=lambda: list(NODES)) for n in NODES[1:])]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


def bench(repeat: int, readers: list[Any], loop: Loop) -> None:
    from eventstore import api
    from eventstore import questions as qs
    from eventstore.fanout import FleetReads
    from eventstore.questions import NodeScope, Question

    from crewlet.base.tokens import OperatorToken

    _, token = OperatorToken.mint(f"bench-{time.monotonic_ns()}")
    get = _wsgi_client(token)
    alone = FleetReads(NodeScope("solo"), roster=lambda: ["solo"])
    asking: list[Any] = [alone]
    api.fleet = lambda: asking[0]  # the process's fleet reads, as the engine hands them out

    def page(reader: Any) -> bytes:
        asking[0] = reader
        status, body = get("/api/events?limit=100")
        assert status.startswith("200"), (status, body[:300])
        return body

    import orjson

    one, three = orjson.loads(page(alone)), orjson.loads(page(readers[0]))
    same = [r["id"] for r in one["events"]] == [r["id"] for r in three["events"]]
    print(f"  first pages list the same rows: {same}; fleet coverage complete: {three['coverage']['complete']}")
    from eventstore.fanout import wire

    bare_label = "b and c's ask/serve round trip, no read"
    samples: dict[str, list[float]] = {
        "1 node": [], "3 nodes": [], "slowest other node's own read": [], "the scatter alone (b and c, over the broker)": [],
        bare_label: [],
    }
    at = qs.instant()
    question = Question(kind=qs.EVENTS, at=at, limit=100)
    # A question in another protocol version is answered on the node's loop at once, reading nothing: the
    # same hops as the scatter (asker's loop, broker, node's loop, back) without the read thread and the read.
    bare = wire.encode_request(dataclasses.replace(question, version=question.version + 1), "a", list(NODES[1:]))
    for _ in range(min(30, repeat)):
        page(alone), page(readers[0])
    for _ in range(repeat):
        for label, reader in (("1 node", alone), ("3 nodes", readers[0])):
            t0 = time.perf_counter()
            page(reader)
            samples[label].append(time.perf_counter() - t0)
        own = []
        for reader in readers[1:]:
            t0 = time.perf_counter()
            qs.answer_events(question, at, reader.scope)
            own.append(time.perf_counter() - t0)
        samples["slowest other node's own read"].append(max(own))
        request = wire.encode_request(question, "a", list(NODES[1:]))
        t0 = time.perf_counter()
        loop.run(readers[0]._gather(request, list(NODES[1:])))
        samples["the scatter alone (b and c, over the broker)"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loop.run(readers[0]._gather(bare, list(NODES[1:])))
        samples[bare_label].append(time.perf_counter() - t0)
    print(f"  {'':46} {'p50 ms':>8} {'p99 ms':>8}")
    for label, values in samples.items():
        print(f"  {label:46} {_pct(values, 0.5):8.2f} {_pct(values, 0.99):8.2f}")
    print(f"  load average while it ran: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=60_000, help="rows in total: all on the lone node, a third on each fleet node")
    parser.add_argument("--repeat", type=int, default=300, help="timed requests per figure")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    parser.add_argument("--serve", choices=NODES[1:], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_node(args.serve)
        return 0
    try:
        for name in ALL_DBS:
            benchdb.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            benchdb.admin(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        print(f"cannot reach PostgreSQL ({exc}); run bin/test once (it starts the server) or set CREWLET_PG_*")
        return 2
    loop = None
    try:
        benchdb.setup_django(DEFAULT_DB, SOLO_DB)
        _node_stores()
        seed(args.rows, datetime.now(timezone.utc) - timedelta(minutes=1))
        loop = Loop()
        readers = fleet(loop)
        print(f"fleet read benchmark: GET /api/events?limit=100, first page, {args.rows:,} rows in total, {args.repeat} samples each")
        bench(args.repeat, readers, loop)
        return 0
    finally:
        if loop is not None:
            loop.close()
        if not args.keep:
            from django.db import connections

            connections.close_all()
            for name in ALL_DBS:
                benchdb.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
