"""Signed Slack deliveries through `manage.py up`: accept rate, POST->turn latency, coalescing bound.

    .venv/bin/python bench/webhook_bench.py [--deliveries 200] [--concurrency 8]

Part 1 starts `up` on a temp company (one agent seat `ada`, echo provider with
zero delay, Slack verification ON with a random signing secret) and posts K
signed Slack channel messages that mention <@U0ADA>, each in its own channel,
so each is its own partition and its own turn. It reports deliveries/s
accepted (202) and p50/p99 from the POST being sent to the matching
`agent_turn_started` row (matched by the trace_id the 202 carries), beside the
raw nats-py publish->fetch(1)->ack round trip. The unloaded samples (--idle) are
posted one at a time, each once the previous turn's end is in `up`'s log (no
API polling meanwhile, which would load the server being measured); the time
is still read from the stored row. `up` does not print its broker
URL (the credential is per boot), so the raw round trip is measured on a
SEPARATE EmbeddedBroker this script starts itself, in the same run.

Part 2 restarts `up` with an echo provider that takes --delay s per turn (default 5), posts a
root message in channel C_N, waits for its turn to start, then posts N replies
in the same thread (each mentioning ada, posted concurrently) while that turn\nruns (the output says whether they all landed before it completed), waits for the
backlog to drain and counts `agent_turn_started` rows of the conversation.
The bound is at most 2 turns (the running one + one coalesced follow-up).

The database is SQLite in the temp data dir (CREWLET_DATABASE unset), the
broker in memory (--store-dir ''): a laptop bench. Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import http.client
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import versus  # noqa: E402

CODE = versus.code_root()  # the checkout whose `manage.py up` is measured

SEAT_SLACK_ID = "U0ADA"
SENDER = "U0HUMAN1"
#: The log line `up` writes when a turn ends (with the turn's trace_id): what the unloaded samples wait for.
TURN_FINISHED_LOG = "event=agent_turn_finished"


# -- the company and the `up` process --------------------------------------------------


def company_yaml(org: str, delay_s: float) -> str:
    provider = "{kind: echo}" if not delay_s else f"{{kind: echo, delay_s: {delay_s}}}"
    return f"""org: {org}
providers:
  llm: [{provider}]
node: {{max_concurrent: 4}}
notification_coalesce_window_seconds: 0
notification_coalesce_max_batch: 100
notification_rate_limit: 0
surfaces:
  slack: {{signing_secret_env: SLACK_SIGNING_SECRET, verify: true}}
seats:
  - {{handle: ada, kind: agent, role: engineer, display_name: Ada, identities: {{slack: {SEAT_SLACK_ID}}}}}
"""


class Up:
    """`manage.py up` as a subprocess, its output collected by a reader thread."""

    def __init__(self, tmp: Path, name: str, delay_s: float, database: str = "sqlite") -> None:
        self.dir = tmp / name
        self.dir.mkdir(parents=True)
        self.company = self.dir / "company.yaml"
        self.company.write_text(company_yaml(f"bench-{name}", delay_s))
        self.secret = secrets.token_hex(16)
        self.token = secrets.token_hex(24)
        self.lines: list[str] = []
        self._line_added = threading.Condition()
        #: Settings this run adds to the environment (a fleet bench's databases and broker).
        self.extra_env: dict[str, str] = {}
        self.ready = threading.Event()
        self.url = ""
        self.proc: Optional[subprocess.Popen[str]] = None
        self.database = database
        #: The broker's store: in memory by default; a bench of `up` as a new user runs it sets ``[]`` (the data dir's).
        self.store_args = ["--store-dir", ""]

    def start(self, timeout_s: float = 120.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}  # SQLite, defaults
        env.update(
            PYTHONUNBUFFERED="1",
            DJANGO_SETTINGS_MODULE="crewlet.settings",
            CREWLET_OPERATOR_TOKEN=self.token,
            SLACK_SIGNING_SECRET=self.secret,
        )
        env.update(self.extra_env)
        if self.database == "postgres":
            env.update(pg_env(self.dir.name))
        cmd = [
            sys.executable, str(CODE / "manage.py"), "up", "--addr", "127.0.0.1:0",
            "--data-dir", str(self.dir / "data"), *self.store_args, "--company", str(self.company),
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=self.dir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(1.0):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("`up` did not print its ready line:\n" + "\n".join(self.lines[-40:]))

    def _read(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            with self._line_added:
                self.lines.append(line)
                self._line_added.notify_all()
            if "Crewlet is up: " in line and not self.ready.is_set():
                self.url = line.split("Crewlet is up: ", 1)[1].split(" ", 1)[0]
                self.ready.set()

    def stop(self) -> Optional[int]:
        if not self.proc:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
                return None
        return self.proc.returncode

    @property
    def hostport(self) -> tuple[str, int]:
        u = urllib.parse.urlsplit(self.url)
        return u.hostname or "127.0.0.1", u.port or 80

    def rss_mb(self) -> float:
        """The `up` process's resident set (VmRSS), MiB; its nats-server child is not counted."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def wait_for_line(self, *needles: str, timeout_s: float, start: int = 0) -> bool:
        """True once a line at index ``start`` or later of `up`'s output holds every one of ``needles``."""
        deadline = time.monotonic() + timeout_s
        seen = start
        with self._line_added:
            while True:
                if any(all(n in line for n in needles) for line in self.lines[seen:]):
                    return True
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or not self._line_added.wait(left):
                    return False

    def count(self, needle: str) -> int:
        return sum(1 for line in list(self.lines) if needle in line)


def pg_env(name: str) -> dict[str, str]:
    """CREWLET_* for `up` on PostgreSQL, in two fresh bench databases of its own (dropped and created here)."""
    import psycopg

    import benchdb

    names = (f"crewlet_bench_webhook_{name}", f"crewlet_bench_webhook_{name}_events")
    with psycopg.connect(**benchdb.conninfo("postgres"), autocommit=True) as conn:
        for db in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{db}"')
    env = {"CREWLET_DATABASE": "postgres", "CREWLET_PG_DBNAME": names[0], "CREWLET_PG_EVENTS_DBNAME": names[1]}
    for key in ("CREWLET_PG_HOST", "CREWLET_PG_PORT", "CREWLET_PG_USER", "CREWLET_PG_PASSWORD"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


# -- HTTP -----------------------------------------------------------------------------


class Client:
    """A keep-alive http.client connection (one per thread)."""

    def __init__(self, up: Up) -> None:
        self.up = up
        self.conn = http.client.HTTPConnection(*up.hostport, timeout=30)

    def request(self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[dict] = None) -> tuple[int, bytes]:
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(*self.up.hostport, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def api(self, path: str, **params: Any) -> dict[str, Any]:
        q = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        status, body = self.request("GET", f"{path}?{q}" if q else path, headers={"Authorization": f"Bearer {self.up.token}"})
        if status != 200:
            raise RuntimeError(f"GET {path}?{q}: {status} {body[:300]!r}")
        return json.loads(body)


_local = threading.local()


def _client(up: Up) -> Client:
    c = getattr(_local, "client", None)
    if c is None or c.up is not up:
        c = _local.client = Client(up)
    return c


def slack_body(event_id: str, channel: str, ts: str, text: str, thread_ts: Optional[str] = None) -> bytes:
    event: dict[str, Any] = {
        "type": "message", "channel": channel, "channel_type": "channel", "user": SENDER, "text": text, "ts": ts,
        "event_ts": ts,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    payload = {
        "token": "x", "team_id": "T0BENCH", "api_app_id": "A0BENCH", "type": "event_callback",
        "event_id": event_id, "event_time": int(time.time()), "event": event,
        "authorizations": [{"user_id": SEAT_SLACK_ID, "is_bot": False}],
    }
    return json.dumps(payload).encode()


def post_slack(up: Up, body: bytes) -> tuple[float, int, dict[str, Any]]:
    """(wall-clock send time, status, response json) for one signed delivery."""
    stamp = str(int(time.time()))
    sig = "v0=" + hmac.new(up.secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    headers = {"Content-Type": "application/json", "X-Slack-Signature": sig, "X-Slack-Request-Timestamp": stamp}
    sent = time.time()
    status, raw = _client(up).request("POST", "/webhooks/slack", body=body, headers=headers)
    try:
        data = json.loads(raw)
    except ValueError:
        data = {"raw": raw[:200].decode("utf-8", "replace")}
    return sent, status, data


# -- reading events -------------------------------------------------------------------

TIME_KEYS = ("ts", "occurred_at", "time", "timestamp")  # the row's `ts` (the event's own instant)


def event_time(row: dict[str, Any]) -> Optional[float]:
    for key in TIME_KEYS:
        v = row.get(key)
        if isinstance(v, (int, float)):
            return float(v) / (1e6 if v > 1e14 else 1e3 if v > 1e11 else 1)
        if isinstance(v, str) and v:
            try:
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def all_events(up: Up, **filters: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        page = _client(up).api("/api/events", limit=500, cursor=cursor, **filters)
        rows += page.get("events") or []
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return rows


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


# -- the raw broker round trip --------------------------------------------------------


async def raw_round_trip(n: int) -> list[float]:
    """publish -> fetch(1) -> ack on a separate embedded broker (raw nats-py), seconds."""
    import nats

    from crewlet.queue.broker import EmbeddedBroker

    async with EmbeddedBroker(store_dir=None) as broker:
        nc = await nats.connect(broker.url)
        js = nc.jetstream()
        await js.add_stream(name="BENCHRT", subjects=["bench.rt"])
        psub = await js.pull_subscribe("bench.rt", durable="rt", stream="BENCHRT")
        data = json.dumps({"pad": "x" * 400}).encode()
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            await js.publish("bench.rt", data, stream="BENCHRT")
            msgs = await psub.fetch(1, timeout=5)
            await msgs[0].ack()
            out.append(time.perf_counter() - t0)
        await nc.close()
        return out


async def raw_publish_rate(n: int) -> float:
    """Awaited raw nats-py ``js.publish`` of ``n`` messages one at a time on a separate embedded broker, msg/s."""
    import nats

    from crewlet.queue.broker import EmbeddedBroker

    async with EmbeddedBroker(store_dir=None) as broker:
        nc = await nats.connect(broker.url)
        js = nc.jetstream()
        await js.add_stream(name="BENCHPUB", subjects=["bench.pub"])
        data = json.dumps({"pad": "x" * 400}).encode()
        t0 = time.perf_counter()
        for _ in range(n):
            await js.publish("bench.pub", data, stream="BENCHPUB")
        rate = n / (time.perf_counter() - t0)
        await nc.close()
        return rate


# -- part 1 ---------------------------------------------------------------------------


def part1(
    tmp: Path, k: int, concurrency: int, raw: list[float], idle_n: int, raw_pub: float, memory_n: int, database: str,
    summary: dict[str, str],
) -> None:
    up = Up(tmp, f"p1{database}", delay_s=0.0, database=database)
    t0 = time.monotonic()
    up.start()
    print(f"part 1: `up` ready in {time.monotonic() - t0:.1f}s at {up.url}")
    try:
        run = secrets.token_hex(3)
        bodies = [
            slack_body(f"Ev{run}{i:06d}", f"C{run.upper()}{i:05d}", f"{1700000000 + i}.000100", f"<@{SEAT_SLACK_ID}> ping {i}")
            for i in range(k)
        ]
        # warm the path (not counted): one delivery through to its turn
        _, st, _ = post_slack(up, slack_body(f"Ev{run}warm", f"C{run.upper()}WARM", "1690000000.000100", f"<@{SEAT_SLACK_ID}> warm"))
        _wait(lambda: len(all_events(up, type="agent_turn_started")) >= 1, 30)
        idle_rss = up.rss_mb()
        print(f"  `up` resident memory, idle (example company, one warm delivery): {idle_rss:.1f} MiB")
        with ThreadPoolExecutor(concurrency) as pool:
            t_start = time.perf_counter()
            results = list(pool.map(lambda b: post_slack(up, b), bodies))
            elapsed = time.perf_counter() - t_start
        statuses: dict[int, int] = {}
        for _, st, _ in results:
            statuses[st] = statuses.get(st, 0) + 1
        accepted = [(sent, data) for sent, st, data in results if st == 202]
        print(f"  posted {k} signed deliveries, {concurrency} keep-alive connections: statuses {statuses}")
        rate = len(accepted) / elapsed
        print(f"  accepted: {rate:,.1f} deliveries/s ({len(accepted)} x 202 in {elapsed:.2f}s)")
        print(f"  raw awaited publish (separate EmbeddedBroker): {raw_pub:,.0f} msg/s; ratio accepted / raw {rate / raw_pub:.3f}x")
        print(f"  burst of {k}: every 202 returned within {elapsed:.2f} s of the burst's start")
        summary[f"webhooks accepted/s vs raw publish ({database})"] = f"{rate / raw_pub:.3f}x ({rate:,.0f}/s)"
        summary[f"burst of {k}: every 202 within ({database})"] = f"{elapsed:.2f} s"
        sent_by_trace = {d.get("trace_id"): sent for sent, d in accepted if d.get("trace_id")}

        started: dict[str, float] = {}
        deadline = time.monotonic() + max(60.0, k * 0.5)
        sample: Optional[dict[str, Any]] = None
        while time.monotonic() < deadline:
            rows = all_events(up, type="agent_turn_started", seat="ada")
            for row in rows:
                sample = sample or row
                tid = row.get("trace_id")
                t = event_time(row)
                if isinstance(tid, str) and tid in sent_by_trace and t is not None:
                    started[tid] = min(t, started.get(tid, t))
            if len(started) >= len(sent_by_trace):
                break
            time.sleep(0.5)
        if sample is not None and event_time(sample) is None:
            print(f"  !! cannot find a timestamp in an event row; keys: {sorted(sample)}")
        lat = [started[t] - sent_by_trace[t] for t in started]
        unmatched = len(sent_by_trace) - len(started)
        print(f"  turns started matched by trace_id: {len(started)}/{len(sent_by_trace)}" + (f" ({unmatched} missing at deadline)" if unmatched else ""))
        if not started and sample is not None:
            print(f"  !! no trace_id match; a turn row: {json.dumps(sample)[:600]}")
        if lat:
            rp50, rp99 = _pct(raw, 0.5) * 1e3, _pct(raw, 0.99) * 1e3
            p50, p99 = _pct(lat, 0.5) * 1e3, _pct(lat, 0.99) * 1e3
            print(f"  POST->agent_turn_started  p50 {p50:9.2f} ms  p99 {p99:9.2f} ms  (max {max(lat) * 1e3:.1f} ms, min {min(lat) * 1e3:.1f} ms)")
            print(f"  raw broker round trip     p50 {rp50:9.3f} ms  p99 {rp99:9.3f} ms  (publish->fetch(1)->ack, separate EmbeddedBroker, same run)")
            print(f"  ratio (ours / raw)        p50 {p50 / rp50:9.1f}x     p99 {p99 / rp99:9.1f}x")
            print("  note: the burst figure includes queueing behind the burst (all K posted at once); event times are the server's clock, same machine")
        # unloaded: one delivery at a time, each waited for, so no queueing behind a burst. The wait is for
        # `up`'s own log line of the turn's end, not an API poll every few ms: a poll is a request the server
        # answers on the same loop and CPUs as the delivery it measures. The time is still the stored row's.
        idle = []
        for i in range(idle_n):
            mark = len(up.lines)
            sent, st, data = post_slack(up, slack_body(f"Ev{run}i{i:05d}", f"C{run.upper()}I{i:05d}", f"{1720000000 + i}.000100", f"<@{SEAT_SLACK_ID}> idle {i}"))
            tid = data.get("trace_id")
            if st != 202 or not tid:
                continue
            got: list[float] = []

            def seen() -> bool:
                rows = _client(up).api("/api/events", type="agent_turn_started", trace_id=tid).get("events") or []
                got[:] = [t for t in (event_time(r) for r in rows) if t is not None]
                return bool(got)

            up.wait_for_line(TURN_FINISHED_LOG, f"trace_id={tid}", timeout_s=10, start=mark)
            if _wait(seen, 10, 0.05):
                idle.append(min(got) - sent)
        if idle and raw:
            rp50, rp99 = _pct(raw, 0.5) * 1e3, _pct(raw, 0.99) * 1e3
            p50, p99 = _pct(idle, 0.5) * 1e3, _pct(idle, 0.99) * 1e3
            print(f"  unloaded, one at a time (n={len(idle)}): POST->agent_turn_started p50 {p50:.2f} ms  p99 {p99:.2f} ms  "
                  f"ratio to raw p50 {p50 / rp50:.1f}x p99 {p99 / rp99:.1f}x")
            summary[f"POST->agent_turn_started p50 unloaded vs raw ({database})"] = f"{p50 / rp50:.1f}x ({p50:.1f} ms)"
        if memory_n:
            memory(up, run, memory_n, concurrency, idle_rss, database, summary)
    finally:
        rc = up.stop()
        print(f"  `up` stopped (exit {rc})")


def memory(up: Up, run: str, n: int, concurrency: int, idle_rss: float, database: str, summary: dict[str, str]) -> None:
    """RSS after ``n`` more deliveries, each its own turn, measured once the last one's turn has completed."""
    last = [""]

    def post(i: int) -> None:
        _, st, data = post_slack(up, slack_body(f"Ev{run}m{i:06d}", f"C{run.upper()}M{i % 500:05d}", f"{1730000000 + i}.000100", f"<@{SEAT_SLACK_ID}> m {i}"))
        if st == 202 and i == n - 1:
            last[0] = data.get("trace_id", "")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(post, range(n)))
    posted_s = time.perf_counter() - t0
    tid = last[0]
    done = _wait(lambda: bool(_client(up).api("/api/events", type="agent_turn_completed", trace_id=tid).get("events")), max(120.0, n * 0.1), 0.5)
    after = up.rss_mb()
    print(f"  `up` resident memory after {n} more deliveries ({posted_s:.1f} s to post; last turn {'completed' if done else 'NOT completed at deadline'}): "
          f"{after:.1f} MiB = {after / idle_rss:.2f}x idle ({idle_rss:.1f} MiB)")
    summary[f"`up` RSS idle / after {n} deliveries ({database})"] = f"{idle_rss:.0f} / {after:.0f} MiB ({after / idle_rss:.2f}x)"


def _wait(cond, timeout_s: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return False


# -- part 2 ---------------------------------------------------------------------------


def part2(tmp: Path, ns: list[int], delay_s: float, concurrency: int) -> None:
    up = Up(tmp, "p2", delay_s=delay_s)
    up.start()
    print(f"part 2: coalescing bound, echo provider delay_s={delay_s}, coalesce window 0, max batch 100; `up` at {up.url}")
    try:
        run = secrets.token_hex(3)
        for n in ns:
            channel = f"C{run.upper()}N{n}"
            root = f"{1710000000 + n}.000100"
            key = f"slack:{channel}:{root}"
            _, st, data = post_slack(up, slack_body(f"Ev{run}r{n}", channel, root, f"<@{SEAT_SLACK_ID}> root for N={n}"))
            if st != 202:
                print(f"  N={n}: root refused {st} {data}")
                continue
            if not _wait(lambda: len(all_events(up, type="agent_turn_started", conversation_key=key)) >= 1, 30, 0.05):
                print(f"  N={n}: the root's turn never started (conversation_key={key})")
                continue
            t_root = time.monotonic()
            replies = [
                slack_body(f"Ev{run}r{n}x{i}", channel, f"{1710000000 + n}.{i + 200:06d}", f"<@{SEAT_SLACK_ID}> reply {i}", thread_ts=root)
                for i in range(n)
            ]
            with ThreadPoolExecutor(concurrency) as pool:
                posted = list(pool.map(lambda b: post_slack(up, b), replies))
            last_accept = time.time()
            codes: dict[int, int] = {}
            for _, st, _ in posted:
                codes[st] = codes.get(st, 0) + 1
            posted_in = time.monotonic() - t_root

            # drain: started == completed, and stable for 3 s (no further turn appears)
            last = None
            stable_since = time.monotonic()
            deadline = time.monotonic() + 60 + 2 * delay_s * (n + 1)
            while time.monotonic() < deadline:
                s = len(all_events(up, type="agent_turn_started", conversation_key=key))
                c = len(all_events(up, type="agent_turn_completed", conversation_key=key))
                if (s, c) != last:
                    last, stable_since = (s, c), time.monotonic()
                if s == c and s >= 1 and time.monotonic() - stable_since > max(3.0, 2 * delay_s):
                    break
                time.sleep(0.2)
            turns, done = last or (0, 0)
            completed = sorted(t for t in (event_time(r) for r in all_events(up, type="agent_turn_completed", conversation_key=key)) if t)
            during = "yes" if completed and last_accept < completed[0] else "NO (the root turn ended first; the bound does not apply)"
            verdict = "ok" if turns <= 2 else "EXCEEDED"
            print(
                f"  N={n:<3}: turns={turns} (completed {done})  (bound 2: {verdict})  "
                f"replies {codes} posted in {posted_in * 1e3:.0f} ms; all accepted before the root turn completed: {during}"
            )
    finally:
        rc = up.stop()
        print(f"  `up` stopped (exit {rc})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deliveries", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--idle", type=int, default=50, help="sequential (unloaded) deliveries for the POST->turn latency")
    ap.add_argument("--raw-samples", type=int, default=500)
    ap.add_argument("--delay", type=float, default=5.0, help="echo delay_s for part 2 (long enough that all N replies land while the root turn runs)")
    ap.add_argument("--ns", default="5,20,100")
    ap.add_argument("--skip-part1", action="store_true")
    ap.add_argument("--skip-part2", action="store_true")
    ap.add_argument("--memory", type=int, default=10_000, help="deliveries after which `up`'s resident memory is read again (0: skip)")
    ap.add_argument("--raw-publishes", type=int, default=5000)
    ap.add_argument("--database", default="sqlite", help="comma-separated: sqlite, postgres (needs the server bin/test starts)")
    ap.add_argument("--versus", metavar="DIR", help="first run the same benchmark against the checkout DIR (today's main) and print both")
    args = ap.parse_args()
    today = versus.other(__file__, sys.argv[1:], args.versus) if args.versus else None
    summary: dict[str, str] = {}
    print(f"webhook bench: {os.cpu_count()} cores; SQLite in a temp data dir, broker in memory (a laptop bench)")
    print(f"code measured: {CODE}")
    raw = asyncio.run(raw_round_trip(args.raw_samples))
    raw_pub = asyncio.run(raw_publish_rate(args.raw_publishes))
    print(f"raw awaited publish: {raw_pub:,.0f} msg/s (n={args.raw_publishes})")
    print(f"raw broker round trip (separate EmbeddedBroker started by this bench; `up` does not print its broker URL): "
          f"p50 {_pct(raw, 0.5) * 1e3:.3f} ms  p99 {_pct(raw, 0.99) * 1e3:.3f} ms  n={len(raw)}")
    with tempfile.TemporaryDirectory(prefix="crewlet-webhook-bench-") as tmp:
        if not args.skip_part1:
            for database in args.database.split(","):
                part1(Path(tmp), args.deliveries, args.concurrency, raw, args.idle, raw_pub, args.memory, database, summary)
        if not args.skip_part2:
            part2(Path(tmp), [int(x) for x in args.ns.split(",") if x], args.delay, args.concurrency)
    versus.emit(summary)
    versus.side_by_side(today, summary, args.versus or "")


if __name__ == "__main__":
    main()
