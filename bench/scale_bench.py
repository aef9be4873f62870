"""A company of 10, 1,000 and 5,000 agent seats on one `manage.py up`: what a seat costs at rest, at start and at stop.

    .venv/bin/python bench/scale_bench.py [--seats 10,1000,5000] [--idle-window 20] [--fleet 5000 [--fleet-nodes 3] [--replicas 3]]

Each size runs `up` as a new user would (SQLite in a temporary data dir, the
embedded broker with its file store there, an echo model, Slack verification
on) with a company of N agent seats ``s1``..``sN``, and measures:

* ready: from starting the process to its ``Crewlet is up`` line;
* RSS: the `up` process's resident set, and its nats-server child's, once idle;
* idle CPU: cores used by `up` and its broker together over ``--idle-window``
  seconds of nothing to do, after ``SETTLE_S`` of settling;
* delivery: one signed Slack message to the LAST seat, from the POST being
  sent to that seat's ``agent_turn_finished`` line in `up`'s log;
* stop: SIGTERM to the process's exit;
* attach (printed per size, not compared): from `up`'s ``seat_mailboxes_ensured``
  log line to its ``seat_runtime_started``, by the lines' own timestamps —
  the seats' leases taken, their memory replayed and their inboxes attached.

``--fleet N`` then runs N seats on ``--fleet-nodes`` `up`s of one fleet (one
PostgreSQL coordination database ``<CREWLET_PG_DBNAME>_scale_fleet`` and an
events database per node, dropped and made afresh; each node's embedded
broker clustered with the others at ``--replicas``) and measures the same,
plus the time until every seat's lease is held.

Every figure is printed beside its ratio to the first size (10 seats) of the
same invocation, and RSS per extra seat from the first size to each larger
one. Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fleet_bench import company_yaml, message  # noqa: E402
from webhook_bench import TURN_FINISHED_LOG, Up, post_slack  # noqa: E402

#: Seconds an idle `up` is left alone before its idle CPU is measured (start-up's stragglers end).
SETTLE_S = 5.0
_TICKS = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (its own threads, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Sized(Up):
    """`up` serving a company of ``seats`` agent seats, its broker storing in the data dir as by default."""

    def __init__(self, tmp: Path, seats: int, name: str = "") -> None:
        super().__init__(tmp, name or f"n{seats}", 0.0)
        self.seats = seats
        self.company.write_text(company_yaml(seats, 0.0))
        self.store_args = []

    def broker_pid(self) -> Optional[int]:
        assert self.proc is not None
        kids = children(self.proc.pid)
        return kids[0] if kids else None


def log_span(lines: list[str], first: str, last: str) -> float:
    """Seconds between the first line holding ``event=<first>`` and the last holding ``event=<last>`` (their ``ts=``)."""
    def at(line: str) -> datetime:
        return datetime.fromisoformat(line.split("ts=", 1)[1].split(" ", 1)[0])

    starts = [line for line in lines if f"event={first} " in line and "ts=" in line]
    ends = [line for line in lines if f"event={last} " in line and "ts=" in line]
    return (at(ends[-1]) - at(starts[0])).total_seconds() if starts and ends else float("nan")


def measure(tmp: Path, seats: int, window_s: float) -> dict[str, float]:
    up = Sized(tmp, seats)
    t0 = time.monotonic()
    up.start(timeout_s=900)
    ready = time.monotonic() - t0
    assert up.proc is not None
    broker = up.broker_pid()
    time.sleep(SETTLE_S)
    pids = [up.proc.pid] + ([broker] if broker else [])
    before = sum(cpu_s(p) for p in pids)
    w0 = time.monotonic()
    time.sleep(window_s)
    idle = (sum(cpu_s(p) for p in pids) - before) / (time.monotonic() - w0)
    rss_up = rss_mib(up.proc.pid)
    rss_broker = rss_mib(broker) if broker else float("nan")
    last = f"s{seats}"
    mark = len(up.lines)
    sent = time.monotonic()
    _, status, _ = post_slack(up, message(last, 1))
    done = up.wait_for_line(TURN_FINISHED_LOG, f"seat={last}", timeout_s=120, start=mark)
    delivery = time.monotonic() - sent if status == 202 and done else float("nan")
    t1 = time.monotonic()
    up.proc.send_signal(signal.SIGTERM)
    up.proc.wait(timeout=600)
    stop = time.monotonic() - t1
    return {"ready_s": ready, "rss_up_mib": rss_up, "rss_broker_mib": rss_broker, "idle_cores": idle,
            "delivery_s": delivery, "stop_s": stop, "attach_s": log_span(up.lines, "seat_mailboxes_ensured", "seat_runtime_started")}


def fleet_measure(tmp: Path, seats: int, nodes: int, replicas: int, window_s: float) -> dict[str, float]:
    """``nodes`` `up`s of one fleet (PostgreSQL, embedded brokers clustered at ``replicas``) serving ``seats`` seats.

    Ready is the last node's ready line; ``spread_s`` when every seat's lease
    is held by some node; the rest as :func:`measure`, summed over the nodes
    (RSS, idle CPU) or over the fleet (a delivery posted to the first node
    finishing on whichever node runs the last seat; SIGTERM to all, to the
    last exit).
    """
    sys.path.insert(0, str(REPO / "tests"))
    import psycopg
    import yaml

    from benchdb import conninfo
    from crewlet.company.loading import CLUSTER_SECRET_ENV
    from fleet_bench import fresh_databases
    # the same stream.cluster mapping and free route ports the tests' fleets use (imported here: bench is no test package)
    clusters: Any = importlib.import_module("tests.cluster_support")
    cluster_settings, free_ports = clusters.cluster_settings, clusters.free_ports

    base = os.environ.get("CREWLET_PG_DBNAME", "crewlet_bench") + "_scale_fleet"
    names = [f"f{i + 1}" for i in range(nodes)]
    fresh_databases([base, *[f"{base}_events_{n}" for n in names]])
    ports, secret = free_ports(nodes), os.urandom(16).hex()
    ups = []
    for i, name in enumerate(names):
        up = Sized(tmp / f"fleet{seats}", seats, name=name)
        settings = up.dir / "settings.yaml"
        settings.write_text(yaml.safe_dump({"stream": cluster_settings(i, ports, store_dir=up.dir / "stream", replicas=replicas)}))
        up.extra_env = {
            "CREWLET_SETTINGS_FILE": str(settings), CLUSTER_SECRET_ENV: secret, "CREWLET_NODE_ID": name,
            "CREWLET_DATABASE": "postgres", "CREWLET_PG_DBNAME": base, "CREWLET_PG_EVENTS_DBNAME": f"{base}_events_{name}",
            **{k: v for k, v in os.environ.items() if k in ("CREWLET_PG_HOST", "CREWLET_PG_PORT", "CREWLET_PG_USER", "CREWLET_PG_PASSWORD")},
        }
        ups.append(up)
    try:  # a node that fails to start leaves the others running: every node is stopped either way
        t0 = time.monotonic()
        with ThreadPoolExecutor(nodes) as pool:  # each start waits for a majority of the brokers
            list(pool.map(lambda u: u.start(timeout_s=1800), ups))
        ready = time.monotonic() - t0
        with psycopg.connect(**conninfo(base)) as db:
            def held() -> int:
                row = db.execute("SELECT count(*) FROM crewlet_seat_lease WHERE holder <> '' AND expires_at > now()").fetchone()
                return int(row[0]) if row else 0

            while held() < seats:
                gone = [up for up in ups if up.proc is None or up.proc.poll() is not None]
                if gone:
                    raise SystemExit(f"node {gone[0].dir.name} exited before every seat was held:\n" + "\n".join(gone[0].lines[-40:]))
                time.sleep(0.5)
        spread = time.monotonic() - t0
        time.sleep(SETTLE_S)
        pids = [p for up in ups if up.proc for p in (up.proc.pid, up.broker_pid()) if p]
        before = sum(cpu_s(p) for p in pids)
        w0 = time.monotonic()
        time.sleep(window_s)
        idle = (sum(cpu_s(p) for p in pids) - before) / (time.monotonic() - w0)
        rss_up = sum(rss_mib(up.proc.pid) for up in ups if up.proc)
        rss_broker = sum(rss_mib(b) for b in (up.broker_pid() for up in ups) if b)
        last = f"s{seats}"
        marks = [len(up.lines) for up in ups]
        sent = time.monotonic()
        _, status, _ = post_slack(ups[0], message(last, 1))
        delivery = float("nan")
        while status == 202 and time.monotonic() - sent < 120:
            if any(TURN_FINISHED_LOG in line and f"seat={last}" in line for up, m in zip(ups, marks) for line in up.lines[m:]):
                delivery = time.monotonic() - sent
                break
            time.sleep(0.02)
        t1 = time.monotonic()
        for up in ups:
            assert up.proc is not None
            up.proc.send_signal(signal.SIGTERM)
        for up in ups:
            assert up.proc is not None
            up.proc.wait(timeout=900)
        return {"ready_s": ready, "spread_s": spread, "rss_up_mib": rss_up, "rss_broker_mib": rss_broker,
                "idle_cores": idle, "delivery_s": delivery, "stop_s": time.monotonic() - t1}
    finally:
        for up in ups:
            up.stop()


def report(rows: dict[int, dict[str, float]]) -> None:
    base_n = min(rows)
    base = rows[base_n]
    print(f"\n{'seats':>6} {'ready s':>12} {'RSS up MiB':>16} {'RSS broker MiB':>16} {'idle cores':>16} "
          f"{'delivery s':>14} {'stop s':>12}")
    for n, r in sorted(rows.items()):
        def cell(key: str, fmt: str) -> str:
            ratio = r[key] / base[key] if base[key] else float("nan")
            return f"{format(r[key], fmt)} ({ratio:.2f}x)"
        print(f"{n:>6} {cell('ready_s', '.2f'):>12} {cell('rss_up_mib', '.0f'):>16} {cell('rss_broker_mib', '.0f'):>16} "
              f"{cell('idle_cores', '.4f'):>16} {cell('delivery_s', '.3f'):>14} {cell('stop_s', '.2f'):>12}")
    for n, r in sorted(rows.items()):
        if n == base_n:
            continue
        extra = n - base_n
        up_kib = (r["rss_up_mib"] - base["rss_up_mib"]) * 1024 / extra
        broker_kib = (r["rss_broker_mib"] - base["rss_broker_mib"]) * 1024 / extra
        print(f"RSS per extra seat, {base_n} -> {n}: up {up_kib:.1f} KiB, broker {broker_kib:.1f} KiB, "
              f"together {up_kib + broker_kib:.1f} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seats", default="10,1000,5000", help="company sizes, the first is the baseline")
    parser.add_argument("--idle-window", type=float, default=20.0, help="seconds idle CPU is measured over")
    parser.add_argument("--fleet", type=int, default=0,
                        help="seats of a fleet run after the sizes (0: none); needs PostgreSQL (CREWLET_PG_*)")
    parser.add_argument("--fleet-nodes", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=3, help="the fleet's stream.replicas")
    args = parser.parse_args()
    sizes = [int(s) for s in args.seats.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp_name:
        rows = {}
        for n in sizes:
            rows[n] = measure(Path(tmp_name), n, args.idle_window)
            print(f"{n} seats: " + ", ".join(f"{k} {v:.4g}" for k, v in rows[n].items()), flush=True)
        report(rows)
        if args.fleet:
            fleet = fleet_measure(Path(tmp_name), args.fleet, args.fleet_nodes, args.replicas, args.idle_window)
            base = rows[min(rows)]
            print(f"\nfleet of {args.fleet_nodes} nodes (R{args.replicas}), {args.fleet} seats, ratios to the "
                  f"{min(rows)}-seat node (RSS and idle CPU summed over the nodes):")
            for key, value in fleet.items():
                ratio = f" ({value / base[key]:.2f}x)" if key in base and base[key] else ""
                print(f"  {key} {value:.4g}{ratio}")


if __name__ == "__main__":
    main()
