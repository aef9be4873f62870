"""Event store: the publish listener's write rate and /api/events page latency, each against raw psycopg.

    .venv/bin/python bench/eventstore_bench.py [--rows 1000000] [--writes 20000] [--repeat 200] [--keep]

Runs against the PostgreSQL server bin/test sets up (the CREWLET_PG_* variables,
else the local socket as the current user), in two databases of its own,
``crewlet_bench`` (the event store) and ``crewlet_bench_default`` (the
coordination store: the operator token), created at start and dropped at the
end unless ``--keep``.

1. Writes: events per second written by the publish listener (``eventstore.attach``'s
   writer, awaited once per event as a publish awaits it) vs raw psycopg inserting
   the same rows one statement at a time, autocommit, on the same table.
2. Reads: over ``--rows`` seeded rows (COPY), the latency of the first and the
   100th page of ``GET /api/events`` through Django's WSGI handler in process
   (middleware, DRF, operator-token authentication, the per-node answer, JSON;
   Django's per-request connection handling kept, as ``up`` has it)
   vs the very SQL that request ran, with its parameters, captured from it and
   re-run on a raw psycopg connection; samples alternate between the two.

Every ratio is ours / raw for throughput and raw / ours for latency, so above 1
is better either way; the target is 0.7. Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import os
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import versus  # noqa: E402

versus.use_code()

import psycopg  # the baseline is raw psycopg on purpose

import benchdb

#: The bench's two databases (``--databases`` names them otherwise, so two runs on one server never share rows).
EVENTS_DB = "crewlet_bench"
DEFAULT_DB = "crewlet_bench_default"
TARGET = 0.7


def create_databases() -> None:
    for name in (EVENTS_DB, DEFAULT_DB):
        benchdb.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        benchdb.admin(f'CREATE DATABASE "{name}"')


def drop_databases() -> None:
    from django.db import connections

    connections.close_all()
    for name in (EVENTS_DB, DEFAULT_DB):
        benchdb.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django() -> None:
    benchdb.setup_django(DEFAULT_DB, EVENTS_DB)


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def _ratio(value: float) -> str:
    return f"{value:.2f}x ({'meets' if value >= TARGET else 'BELOW'} the {TARGET}x target)"


# -- 1. writes ----------------------------------------------------------------------------


def _write_events(n: int, start: datetime) -> list[Any]:
    """A turn's worth of mixed rows, repeated: what a busy node publishes."""
    from crewlet.events import new
    from crewlet.events.types import AgentPhaseCompleted, AgentTurnCompleted, AgentTurnStarted, AuxiliarySpend, EventBody, KnowledgeRead
    from crewlet.events.tracing import Trace

    rng = random.Random(7)
    out = []
    for i in range(n):
        trace = Trace(f"{rng.getrandbits(128) | 1:032x}", f"{rng.getrandbits(64) | 1:016x}")
        ts = start + timedelta(microseconds=i * 137)
        kind = i % 5
        seat = f"seat-{i % 20}"
        turn = f"turn-{i // 5}"
        if kind == 0:
            body: EventBody = AgentTurnStarted(seat=seat, turn_id=turn, trigger_type="task_assigned", conversation_key=f"jira:POC-{i % 300}")
        elif kind == 1:
            body = AgentPhaseCompleted(
                seat=seat, turn_id=turn, phase="plan", system_prompt="You are a careful engineer. " * 8,
                user_prompt="Fix the failing build on POC-7. " * 6, response="Done: the import was missing. " * 5,
                rounds=[{"stop_reason": "end", "input_tokens": 900, "output_tokens": 120}], input_tokens=900, output_tokens=120,
            )
        elif kind == 2:
            body = KnowledgeRead(seat=seat, turn_id=turn)
        elif kind == 3:
            body = AuxiliarySpend(seat=seat, turn_id=turn, stage="turn", calls=3, input_tokens=300, output_tokens=40)
        else:
            body = AgentTurnCompleted(seat=seat, turn_id=turn, input_tokens=1800, output_tokens=300, tool_calls=4)
        event = new(body, trace, event_id=f"w{i:09d}", timestamp=ts, source="bench")
        event.node = "bench-node"
        out.append(event)
    return out


def _truncate(conn: psycopg.Connection) -> None:
    conn.execute("TRUNCATE eventstore_event")
    conn.execute("CHECKPOINT")


def bench_writes(n: int, rounds: int, publishers: int, chunk: int = 250) -> tuple[float, float, float, float]:
    """Rates, interleaved in chunks on one table so disk and table growth hit all alike.

    (raw one-row INSERTs, the writer awaited one event at a time, raw COPY of
    the chunk's rows in one statement, the writer awaited by ``publishers``
    concurrent publishers as a busy node's turns and webhook requests await it).
    """
    from crewlet.queue import topics
    from eventstore.rows import row_for
    from eventstore.writer import EventWriter, insert_sql

    events = _write_events(4 * n, datetime.now(timezone.utc) - timedelta(hours=1))
    topic = topics.event("bench")
    raw_sql = insert_sql()

    async def concurrently(writer: Any, mine: list[Any]) -> None:
        async def publisher(share: list[Any]) -> None:
            for event in share:
                await writer(topic, event)

        await asyncio.gather(*(publisher(mine[k::publishers]) for k in range(publishers)))

    async def one_round() -> tuple[float, float, float, float]:
        with psycopg.connect(**benchdb.conninfo(EVENTS_DB), autocommit=True) as raw:
            writer = EventWriter()
            await writer(topic, events[0])  # both sides connected before the clock starts
            raw.execute(raw_sql, row_for(topic, events[1]))
            raw_s = ours_s = copy_s = many_s = 0.0
            raw_n = ours_n = copy_n = many_n = 0
            cols = ", ".join(COLUMNS)
            gc.collect()
            try:
                for at in range(2, len(events) - 4 * chunk + 1, 4 * chunk):
                    # The raw side gets the very rows the listener would derive, derived beforehand.
                    rows = [row_for(topic, e) for e in events[at : at + chunk]]
                    t0 = time.perf_counter()
                    for row in rows:
                        raw.execute(raw_sql, row)
                    raw_s += time.perf_counter() - t0
                    raw_n += len(rows)

                    mine = events[at + chunk : at + 2 * chunk]
                    t0 = time.perf_counter()
                    for event in mine:
                        await writer(topic, event)
                    ours_s += time.perf_counter() - t0
                    ours_n += len(mine)

                    copied = [r for e in events[at + 2 * chunk : at + 3 * chunk] if (r := row_for(topic, e)) is not None]
                    t0 = time.perf_counter()
                    with raw.cursor().copy(f"COPY eventstore_event ({cols}) FROM STDIN") as copy:
                        for row in copied:
                            copy.write_row(row)
                    copy_s += time.perf_counter() - t0
                    copy_n += len(copied)

                    mine = events[at + 3 * chunk : at + 4 * chunk]
                    t0 = time.perf_counter()
                    await concurrently(writer, mine)
                    many_s += time.perf_counter() - t0
                    many_n += len(mine)
            finally:
                await writer.aclose()
            return raw_n / raw_s, ours_n / ours_s, copy_n / copy_s, many_n / many_s

    from eventstore.rows import COLUMNS

    rates: list[tuple[float, float, float, float]] = []
    with psycopg.connect(**benchdb.conninfo(EVENTS_DB), autocommit=True) as admin:
        for _ in range(rounds):
            _truncate(admin)
            rates.append(asyncio.run(one_round()))
            stored = admin.execute("SELECT count(*) FROM eventstore_event").fetchone()
            assert stored is not None and stored[0] == 2 + (len(events) - 2) // (4 * chunk) * 4 * chunk, stored
    raw_rate, ours_rate, copy_rate, many_rate = (statistics.median(r[k] for r in rates) for k in range(4))
    return raw_rate, ours_rate, copy_rate, many_rate


# -- 2. reads ---------------------------------------------------------------------------------


_CATEGORY_TYPES = [
    ("system", "agent_turn_started"),
    ("system", "agent_phase_completed"),
    ("system", "agent_turn_completed"),
    ("learning", "knowledge_read"),
    ("notification", "external_notification"),
    ("task", "task_assigned"),
    ("a2a", "a2a_message_sent"),
    ("webhook", "webhook:push"),
    ("system", "auxiliary_spend"),
    ("lifecycle", "operator_acted"),
]


def seed(n: int, now: datetime) -> None:
    """``n`` rows over the last 29 days via COPY; every 50th row shares its microsecond with the next."""
    from eventstore.rows import COLUMNS

    rng = random.Random(11)
    span_us = 29 * 86_400_000_000
    step = span_us // n
    base = now - timedelta(microseconds=span_us)
    pad = "x" * 300
    buf = io.StringIO()
    t0 = time.perf_counter()
    with psycopg.connect(**benchdb.conninfo(EVENTS_DB), autocommit=True) as conn:
        with conn.cursor().copy(f"COPY eventstore_event ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for i in range(n):
                us = (i - (i % 50 == 1)) * step  # pairs sharing one microsecond
                ts = (base + timedelta(microseconds=us)).strftime("%Y-%m-%d %H:%M:%S.%f+00")
                category, label = _CATEGORY_TYPES[i % len(_CATEGORY_TYPES)]
                seat = f"seat-{i % 40}"
                turn = f"turn-{i // 8}" if category == "system" else ""
                conv = f"jira:POC-{i % 997}" if turn else ""
                trace_id = f"{rng.getrandbits(128) | 1:032x}"
                span_id = f"{rng.getrandbits(64) | 1:016x}"
                eid = f"{rng.getrandbits(128):032x}"
                body = json.dumps({"id": eid, "type": label, "timestamp": ts, "seat": seat, "pad": pad}, separators=(",", ":"))
                values = (
                    eid, ts, label, category, f"node-{i % 3}", "bench", trace_id, span_id, "", seat, turn, conv, "",
                    "", "", "", "0", "", "t" if i % 97 == 0 else "f", "0", "0", seat, f"{seat} did {label}", body,
                )
                buf.write("\t".join(values))
                buf.write("\n")
                if buf.tell() > 4_000_000:
                    copy.write(buf.getvalue())
                    buf = io.StringIO()
            copy.write(buf.getvalue())
        conn.execute("VACUUM ANALYZE eventstore_event")
    print(f"  seeded {n:,} rows in {time.perf_counter() - t0:.1f} s")


def _time_pair(ours: Callable[[], Any], raw: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Median latencies of two calls, alternated sample by sample so both see the same machine."""
    for _ in range(min(20, repeat)):
        ours()  # warm: plans prepared, caches, connections
        raw()
    ours_s: list[float] = []
    raw_s: list[float] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ours()
        t1 = time.perf_counter()
        raw()
        t2 = time.perf_counter()
        ours_s.append(t1 - t0)
        raw_s.append(t2 - t1)
    return _median_ms(ours_s), _median_ms(raw_s)


def _wsgi_client(token: str) -> Callable[[str], tuple[str, bytes]]:
    """GET through Django's WSGI handler, as a WSGI server calls it (no test client in between).

    Django's own connection handling is kept: a request thread's database
    connections end with its request (the settings keep none open, and under
    ASGI, as ``up`` serves, every request runs in a context of its own that
    never sees the previous one's). Whatever a page reads on the request
    thread is therefore read over a new connection, as in ``up``.
    """
    from django.core.handlers.wsgi import WSGIHandler

    handler = WSGIHandler()

    def get(url: str) -> tuple[str, bytes]:
        path, _, query = url.partition("?")
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": "localhost",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "localhost",
            "HTTP_AUTHORIZATION": f"Bearer {token}",
            "wsgi.input": io.BytesIO(b""),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
        }
        status: list[str] = []
        body = b"".join(handler(environ, lambda s, headers, exc_info=None: status.append(s)))
        return status[0], body

    return get


def alone_in_its_fleet() -> None:
    """Answer reads as a solo ``up`` does: its own node lease is the roster, read per request, and no other node is asked.

    A process without an engine refuses every history read (it cannot ask
    the fleet), so the benchmark hands the API the reader an engine of one
    node would: the same roster query and the same own-store read, with no
    broker, since a fleet of one scatters to nobody.
    """
    from crewlet.fleet import PROTOCOL_VERSION, leases
    from eventstore import api, fanout, here

    node = here.node_scope().node_id
    leases.acquire(leases.NODE, node, node, 3600.0, protocol=PROTOCOL_VERSION)
    reader = fanout.FleetReads(here.node_scope(), roster=fanout.live_roster)  # one for the process, as an engine holds one
    api.fleet = lambda: reader


class ReadRefused(RuntimeError):
    """The API refused the page (a process with no engine answers no fleet read)."""


def bench_reads(repeat: int, pages: int, params: str) -> list[tuple[str, float, float]]:
    from crewlet.base.tokens import OperatorToken
    from eventstore.questions import NodeScope, answers

    _, token = OperatorToken.mint(f"bench-{time.monotonic_ns()}")
    http_get = _wsgi_client(token)
    alone_in_its_fleet()

    def api_get(cursor: str = "") -> dict[str, Any]:
        status, body = http_get(f"/api/events?limit=100{params}" + (f"&cursor={cursor}" if cursor else ""))
        if not status.startswith("200"):
            raise ReadRefused(f"{status}: {body[:300].decode('utf-8', 'replace')}")
        return json.loads(body)

    # The cursor of page `pages`, walked as a reader would.
    cursor = ""
    for _ in range(pages - 1):
        cursor = api_get(cursor)["next_cursor"]
        assert cursor

    results = []
    raw = psycopg.connect(**benchdb.conninfo(EVENTS_DB), autocommit=True)
    try:
        for label, page_cursor in (("first page", ""), (f"page {pages}", cursor)):
            captured: list[tuple[str, Any]] = []
            # The page's statement is run by whichever thread reads the store (a
            # fleet reader's read thread), so it is captured where every answer
            # runs its SQL rather than on this thread's connection.
            fetch = answers.fetch

            def capture(scope: NodeScope, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                captured.append((sql, params))
                return fetch(scope, sql, params)

            answers.fetch = capture
            try:
                body = api_get(page_cursor)
            finally:
                answers.fetch = fetch
            assert len(body["events"]) == 100
            ((query, query_params),) = captured  # the one statement the page ran

            def raw_page(sql: str = query, args: Any = query_params) -> None:
                rows = raw.execute(sql, args).fetchall()
                assert len(rows) == 101

            def api_page(c: str = page_cursor) -> None:
                status, _ = http_get(f"/api/events?limit=100{params}" + (f"&cursor={c}" if c else ""))
                assert status.startswith("200")

            ours, baseline = _time_pair(api_page, raw_page, repeat)
            results.append((label, ours, baseline))
    finally:
        raw.close()
    return results


def main() -> int:
    global EVENTS_DB, DEFAULT_DB
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000, help="rows seeded for the read benchmark (1000000 for a million-row store)")
    parser.add_argument("--writes", type=int, default=20_000, help="events written per write round (0: no write rounds)")
    parser.add_argument("--rounds", type=int, default=3, help="write rounds (medians are reported)")
    parser.add_argument("--repeat", type=int, default=200, help="timed requests per read figure")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    parser.add_argument("--publishers", type=int, default=16, help="concurrent publishers awaiting the writer, for the COPY comparison")
    parser.add_argument("--versus", metavar="DIR", help="first run the same benchmark against the checkout DIR (today's main) and print both")
    parser.add_argument(
        "--databases", metavar="NAME", default="crewlet_bench",
        help=f"the event store's database name; the coordination store's is NAME_default (default crewlet_bench)",
    )
    args = parser.parse_args()
    EVENTS_DB, DEFAULT_DB = args.databases, f"{args.databases}_default"
    today = versus.other(__file__, sys.argv[1:], args.versus) if args.versus else None
    summary: dict[str, str] = {}

    try:
        create_databases()
    except psycopg.OperationalError as exc:
        print(f"cannot reach PostgreSQL ({exc}); run bin/test once (it starts the server) or set CREWLET_PG_*")
        return 2
    try:
        setup_django()
        print(f"event store benchmark on PostgreSQL ({EVENTS_DB}); ratios: target >= {TARGET}x")

        print(f"\n1. writes: {args.writes:,} events each way x {args.rounds} rounds")
        if args.writes:
            raw_rate, ours_rate, copy_rate, many_rate = bench_writes(args.writes, args.rounds, args.publishers)
            print(f"  raw psycopg INSERT, one at a time : {raw_rate:10,.0f} rows/s")
            print(f"  publish listener (EventWriter)    : {ours_rate:10,.0f} events/s (one publisher, each awaited)")
            print(f"  ratio listener / raw              : {_ratio(ours_rate / raw_rate)}")
            print(f"  raw psycopg COPY, 250 rows a statement : {copy_rate:10,.0f} rows/s")
            print(f"  publish listener, {args.publishers} concurrent publishers: {many_rate:10,.0f} events/s")
            print(f"  ratio listener / COPY             : {many_rate / copy_rate:.2f}x (target 0.5x)")
            summary["event-store writer vs one-row INSERT (one publisher)"] = f"{ours_rate / raw_rate:.2f}x ({ours_rate:,.0f}/s)"
            summary[f"event-store writer ({args.publishers} publishers) vs COPY"] = f"{many_rate / copy_rate:.2f}x ({many_rate:,.0f}/s)"

        with psycopg.connect(**benchdb.conninfo(EVENTS_DB), autocommit=True) as conn:
            conn.execute("TRUNCATE eventstore_event")
        print(f"\n2. reads: GET /api/events?limit=100 over {args.rows:,} rows, median of {args.repeat} requests")
        if args.rows:
            seed(args.rows, datetime.now(timezone.utc) - timedelta(minutes=1))
        for title, params in (("unfiltered", ""), ("category=system", "&category=system")) if args.rows else ():
            try:
                pages = bench_reads(args.repeat, 100, params)
            except ReadRefused as exc:
                print(f"  {title}: not measured, the API refused the page in this process: {exc}")
                summary[f"/api/events {title}, {args.rows:,} rows, vs raw SQL"] = "not measured (refused in process)"
                continue
            for label, ours, baseline in pages:
                print(f"  {title:15} {label:10}: api {ours:7.3f} ms   raw SQL {baseline:7.3f} ms   ratio raw / api {_ratio(baseline / ours)}")
                summary[f"/api/events {title} {label}, {args.rows:,} rows, vs raw SQL"] = f"{baseline / ours:.2f}x ({ours:.2f} ms)"
        versus.emit(summary)
        versus.side_by_side(today, summary, args.versus or "")
        return 0
    finally:
        if not args.keep:
            drop_databases()


if __name__ == "__main__":
    sys.exit(main())
