"""A fleet of `manage.py up` nodes on one nats-server and one PostgreSQL: handoff time and 1 vs N throughput.

    .venv/bin/python bench/fleet_bench.py [--nodes 3] [--deliveries 300] [--concurrency 8] [--seats 6]

Needs PostgreSQL (the CREWLET_PG_* variables, as bin/test sets them); the
databases it makes are named ``crewlet_bench_fleet*`` and dropped first.

Part 1, throughput: for 1 node and then for ``--nodes`` nodes (each its own
events database, one coordination database, ``stream.type: nats`` against a
nats-server this script starts), it waits until the seats' leases are spread,
then posts ``--deliveries`` signed Slack messages round-robin over the nodes'
HTTP ports (each to one of ``--seats`` agent seats, each its own conversation)
and reports accepted deliveries/s (202s over the posting time) and completed
turns/s (from the first post to the last ``agent_turn_completed`` any node
published, read off ``crewlet.events.>`` by this script's own client).

Part 2, handoff: two nodes; a seat held by the second node is given mail and
the node is stopped cleanly (SIGTERM), then a second time killed (SIGKILL).
It reports, for each, the time from the seat's lease being let go (the
``agent_terminated`` the stopping node publishes; for the kill, the kill
itself) to the survivor's ``agent_spawned`` for the seat and to the first
delivery the survivor handles for it (``agent_turn_started``).

On a 2-core machine N nodes share the same CPUs as 1, so part 1 says what the
coordination costs rather than how a fleet scales. Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import psycopg  # noqa: E402

from benchdb import conninfo  # noqa: E402
from webhook_bench import Up, post_slack, slack_body  # noqa: E402

DB = "crewlet_bench_fleet"
TTL_S = 5.0


def company_yaml(seats: int, delay_s: float) -> str:
    provider = f"{{kind: echo, delay_s: {delay_s}}}" if delay_s else "{kind: echo}"
    lines = [
        "org: bench-fleet",
        f"providers: {{llm: [{provider}]}}",
        "node: {max_concurrent: 4}",
        "surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: true}}",
        "seats:",
    ]
    lines += [f"  - {{handle: s{i}, kind: agent, identities: {{slack: U0S{i}}}}}" for i in range(1, seats + 1)]
    return "\n".join(lines) + "\n"


def fresh_databases(names: list[str]) -> None:
    with psycopg.connect(**conninfo("postgres"), autocommit=True) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')


def seat_holders() -> dict[str, str]:
    with psycopg.connect(**conninfo(DB)) as db:
        rows = db.execute("SELECT name, holder FROM crewlet_seat_lease WHERE holder <> '' AND expires_at > now()").fetchall()
    return dict(rows)


def wait(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


class Watch:
    """This script's own client on the broker: every event of crewlet.events.>, with when it arrived."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.events: list[tuple[float, Any]] = []
        self.url = url
        self.run(self._connect())

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _connect(self) -> None:
        from crewlet.queue.jetstream import JetStreamQueue

        self.queue = await JetStreamQueue.connect(self.url, node="bench")

        async def seen(_subject: str, event: Any) -> None:
            self.events.append((time.monotonic(), event))

        await self.queue.subscribe_stream("crewlet.events.>", seen)

    def of(self, etype: str, seat: str = "", node: str = "") -> list[tuple[float, Any]]:
        return [
            (t, e) for t, e in list(self.events)
            if e.type == etype and (not seat or getattr(e.data, "seat", "") == seat) and (not node or e.node == node)
        ]

    def close(self) -> None:
        self.run(self.queue.close())
        self.loop.call_soon_threadsafe(self.loop.stop)


class Node(Up):
    """One `up` of the fleet (``webhook_bench.Up`` with the fleet's databases, broker and company)."""

    def __init__(self, tmp: Path, name: str, broker_url: str, company: str, secret: str) -> None:
        super().__init__(tmp, name, 0.0)
        self.name = name
        self.company.write_text(company)
        self.secret = secret
        self.extra_env = {
            "CREWLET_DATABASE": "postgres",
            "CREWLET_PG_DBNAME": DB,
            "CREWLET_PG_EVENTS_DBNAME": f"{DB}_events_{name}",
            "CREWLET_STREAM_TYPE": "nats",
            "CREWLET_STREAM_URL": broker_url,
            "CREWLET_NODE_ID": name,
            "CREWLET_FLEET_LEASE_TTL_S": str(TTL_S),
            "CREWLET_STREAM_ACK_WAIT_S": "5",
            "CREWLET_LOG_LEVEL": "WARNING",
        }
        for key in ("CREWLET_PG_HOST", "CREWLET_PG_PORT", "CREWLET_PG_USER", "CREWLET_PG_PASSWORD"):
            if os.environ.get(key):
                self.extra_env[key] = os.environ[key]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def message(seat: str, n: int) -> bytes:
    """A channel message for ``seat``'s Slack user, its own conversation (its own channel)."""
    body = json.loads(slack_body(f"Ev{uuid.uuid4().hex[:12]}", f"C{n:06d}", f"1718000000.{n:06d}", f"<@U0S{seat[1:]}> job {n}"))
    body["authorizations"] = [{"user_id": f"U0S{seat[1:]}", "is_bot": False}]
    return json.dumps(body).encode()


def start_fleet(tmp: Path, names: list[str], broker_url: str, company: str, secret: str) -> list[Node]:
    fresh_databases([DB, *[f"{DB}_events_{n}" for n in names]])
    nodes = []
    for name in names:  # one at a time: each migrates the shared store as it starts
        node = Node(tmp, name, broker_url, company, secret)
        node.start()
        nodes.append(node)
    return nodes


def throughput(tmp: Path, broker_url: str, count: int, deliveries: int, concurrency: int, seats: int) -> tuple[float, float]:
    secret = secrets.token_hex(16)
    names = [f"t{count}n{i}" for i in range(1, count + 1)]
    nodes = start_fleet(tmp / f"t{count}", names, broker_url, company_yaml(seats, 0.0), secret)
    watch = Watch(broker_url)
    try:
        share = seats // count
        wait(lambda: len(seat_holders()) == seats and min(list(seat_holders().values()).count(n) for n in names) >= share,
             120, "the seats spread over the nodes")
        jobs = [(nodes[i % count], f"s{i % seats + 1}", i) for i in range(deliveries)]
        began = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            statuses = list(pool.map(lambda job: post_slack(job[0], message(job[1], job[2]))[1], jobs))
        posted_s = time.monotonic() - began
        accepted = statuses.count(202)
        wait(lambda: len(watch.of("agent_turn_completed")) >= accepted, 300, "every accepted delivery's turn")
        done_s = max(t for t, _ in watch.of("agent_turn_completed")) - began
        return accepted / posted_s, len(watch.of("agent_turn_completed")) / done_s
    finally:
        watch.close()
        for node in nodes:
            node.stop()


def handoff(tmp: Path, broker_url: str, seats: int) -> dict[str, tuple[float, float]]:
    secret = secrets.token_hex(16)
    nodes = start_fleet(tmp / "handoff", ["h1", "h2", "h3"], broker_url, company_yaml(seats, 1.0), secret)
    watch = Watch(broker_url)
    out: dict[str, tuple[float, float]] = {}
    try:
        for how, victim in (("clean stop", nodes[1]), ("kill -9", nodes[2])):
            seat = wait(lambda: sorted(s for s, n in seat_holders().items() if n == victim.name), 120, "a seat on the victim")[0]
            before = len(watch.of("agent_turn_started", seat))
            post_slack(nodes[0], message(seat, 900000 + len(out)))
            wait(lambda: len(watch.of("agent_turn_started", seat)) > before, 60, "the victim working the seat")
            post_slack(nodes[0], message(seat, 910000 + len(out)))  # mail waiting for the next holder
            if how == "clean stop":
                victim.stop()
                let_go = wait(lambda: watch.of("agent_terminated", seat, victim.name), 60, "the victim's release")[-1][0]
            else:
                let_go = time.monotonic()
                victim.kill()
            spawned = wait(lambda: [t for t, e in watch.of("agent_spawned", seat) if t > let_go], 120, "the new holder")[0]
            handled = wait(lambda: [t for t, e in watch.of("agent_turn_started", seat) if t > let_go and e.node != victim.name],
                           120, "the next delivery on the new holder")[0]
            out[how] = (spawned - let_go, handled - let_go)
        return out
    finally:
        watch.close()
        for node in nodes:
            node.stop()


def start_broker(tmp: Path) -> tuple[Any, asyncio.AbstractEventLoop]:
    from crewlet.queue.broker import EmbeddedBroker

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    broker = EmbeddedBroker(store_dir=tmp / "jetstream")
    asyncio.run_coroutine_threadsafe(broker.start(), loop).result(60)
    return broker, loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--deliveries", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seats", type=int, default=6)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp_name:
        tmp = Path(tmp_name)
        broker, loop = start_broker(tmp)
        try:
            rows = {n: throughput(tmp, broker.url, n, args.deliveries, args.concurrency, args.seats) for n in (1, args.nodes)}
            print(f"\nthroughput, {args.deliveries} signed Slack deliveries over {args.seats} seats, concurrency {args.concurrency}")
            print(f"{'nodes':>6} {'accepted/s':>11} {'turns/s':>9}")
            for n, (accepted, turns) in rows.items():
                print(f"{n:>6} {accepted:>11.1f} {turns:>9.1f}")
            moves = handoff(tmp, broker.url, args.seats)
            print(f"\nhandoff (fleet.lease_ttl_s={TTL_S:.0f}, placement sweep every {TTL_S / 3:.2f} s)")
            print(f"{'how':>11} {'-> acquired':>12} {'-> next delivery handled':>25}")
            for how, (acquired, handled) in moves.items():
                print(f"{how:>11} {acquired:>11.2f}s {handled:>24.2f}s")
        finally:
            asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(60)
            loop.call_soon_threadsafe(loop.stop)


if __name__ == "__main__":
    main()
