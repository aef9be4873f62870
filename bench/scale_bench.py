"""A company of 10, 1,000 and 5,000 agent seats on one `manage.py up`: what a seat costs at rest, at start and at stop.

    .venv/bin/python bench/scale_bench.py [--seats 10,1000,5000] [--idle-window 20]

Each size runs `up` as a new user would (SQLite in a temporary data dir, the
embedded broker with its file store there, an echo model, Slack verification
on) with a company of N agent seats ``s1``..``sN``, and measures:

* ready: from starting the process to its ``Crewlet is up`` line;
* RSS: the `up` process's resident set, and its nats-server child's, once idle;
* idle CPU: cores used by `up` and its broker together over ``--idle-window``
  seconds of nothing to do, after ``SETTLE_S`` of settling;
* delivery: one signed Slack message to the LAST seat, from the POST being
  sent to that seat's ``agent_turn_finished`` line in `up`'s log;
* stop: SIGTERM to the process's exit.

Every figure is printed beside its ratio to the first size (10 seats) of the
same invocation, and RSS per extra seat from the first size to each larger
one. Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

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

    def __init__(self, tmp: Path, seats: int) -> None:
        super().__init__(tmp, f"n{seats}", 0.0)
        self.seats = seats
        self.company.write_text(company_yaml(seats, 0.0))
        self.store_args = []

    def broker_pid(self) -> Optional[int]:
        assert self.proc is not None
        kids = children(self.proc.pid)
        return kids[0] if kids else None


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
            "delivery_s": delivery, "stop_s": stop}


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
    args = parser.parse_args()
    sizes = [int(s) for s in args.seats.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp_name:
        rows = {}
        for n in sizes:
            rows[n] = measure(Path(tmp_name), n, args.idle_window)
            print(f"{n} seats: " + ", ".join(f"{k} {v:.4g}" for k, v in rows[n].items()), flush=True)
        report(rows)


if __name__ == "__main__":
    main()
