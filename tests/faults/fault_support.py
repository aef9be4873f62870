"""What every fault case shares: `manage.py up` as a process, signed deliveries, the API, the ledger of what was sent.

Each case runs ``manage.py up`` exactly as ``bin/up`` does (the embedded
nats-server with a file-backed store under ``--data-dir``, SQLite unless the
case says PostgreSQL), sends real signed Slack deliveries over HTTP on
127.0.0.1, injects its fault, and then reads the outcome back from the event
store through ``/api/``. Every delivery gets its own Slack DM channel, so its
turns carry its own ``conversation_key`` (``slack:<channel>``): the count of
completed turns per key is the count of times that delivery ran, whatever
trace a retry was given.

Durations are shrunk by injection only: the ``delivery.*`` engine settings
(``CREWLET_DELIVERY_*``), the example company's echo provider ``delay_s`` and
the company's coalescing knobs. Every wait is a bounded poll for a condition.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import http.client
import itertools
import json
import os
import signal
import socket
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar, cast

from tests import waiting_support
from tests.process_support import REPO_ROOT, descendants, is_running
from tests.up_support import UpProcess, up_env

T = TypeVar("T")

TOKEN = "fault-suite-operator-token-0123456789abcdef"
SECRETS = {
    "SLACK_SIGNING_SECRET": "fault-slack-signing-secret",
    "GITHUB_WEBHOOK_SECRET": "fault-github-secret",
    "JIRA_WEBHOOK_SECRET": "fault-jira-secret",
    "CONFLUENCE_WEBHOOK_SECRET": "fault-confluence-secret",
    "MATTERMOST_TOKEN": "fault-mattermost-token",
}
#: How long `up` may take to print its ready line on a loaded 2-core machine.
UP_READY_S = 90.0
#: How long one HTTP request may take before the sender gives up on that attempt.
REQUEST_TIMEOUT_S = 20.0
AGENT = "U0ADA"
#: Where each case's `up` log is kept (beside CI's junit report).
LOGS = REPO_ROOT / "var" / "ci" / "faults"

_channel_seq = itertools.count(1)


def identity(handle: str) -> str:
    """The Slack user id of agent seat ``handle`` in :func:`company_yaml` (ada's is :data:`AGENT`)."""
    return AGENT if handle == "ada" else f"U0{handle.upper()}"


def company_yaml(
    *,
    providers: str = "[{kind: echo}]",
    max_concurrent: int = 4,
    coalesce_max_batch: int = 1,
    agents: Sequence[str] = (),
) -> str:
    """The example company, every surface verified (secrets from :data:`SECRETS`), one delivery per turn.

    ``agents`` are more agent seats beside ada and linus, each reached by a DM to :func:`identity`.
    """
    more = "".join(
        f"  - {{handle: {h}, kind: agent, role: engineer, identities: {{slack: {identity(h)}}}}}\n" for h in agents
    )
    return f"""\
org: acme
providers:
  llm: {providers}
node: {{max_concurrent: {max_concurrent}}}
notification_coalesce_window_seconds: 0
notification_coalesce_max_batch: {coalesce_max_batch}
notification_rate_limit: 0
surfaces:
  slack: {{signing_secret_env: SLACK_SIGNING_SECRET, verify: true}}
  github: {{secret_env: GITHUB_WEBHOOK_SECRET, verify: true}}
  jira: {{secret_env: JIRA_WEBHOOK_SECRET, verify: true}}
  confluence: {{secret_env: CONFLUENCE_WEBHOOK_SECRET, verify: true}}
  mattermost: {{token_env: MATTERMOST_TOKEN, verify: true}}
seats:
  - {{handle: ada, kind: agent, role: engineer, display_name: Ada,
     identities: {{slack: U0ADA, mattermost: mmada, jira: "5b10ac8d82e05b22cc7d4ef5", github: ada-bot}}}}
  - {{handle: linus, kind: agent, role: reviewer, display_name: Linus,
     identities: {{slack: U0LINUS, mattermost: mmlinus, github: linus-bot}}}}
  - {{handle: grace, kind: human, role: lead, identities: {{slack: U0GRACE}}}}
{more}"""


#: What a check may raise while the process under test restarts: the wait asks again.
RESTARTING: tuple[type[Exception], ...] = (OSError, http.client.HTTPException, ValueError)


def wait_until(check: Callable[[], Optional[T]], *, timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """The tests' one thread-side wait, asking again through a restart of ``up`` (:data:`RESTARTING`)."""
    return cast(T, waiting_support.wait_until(check, timeout_s, what, interval_s, ignoring=RESTARTING))


# -- HTTP ---------------------------------------------------------------------------------------


def request(
    url: str,
    method: str = "GET",
    body: Optional[bytes] = None,
    headers: Optional[dict[str, str]] = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> tuple[int, bytes]:
    """One HTTP request on a fresh connection; (status, body). Connection errors raise OSError."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def sign_slack(body: bytes, *, secret: str = SECRETS["SLACK_SIGNING_SECRET"], stamp: Optional[str] = None) -> dict[str, str]:
    """The Slack v0 signing headers for ``body`` (notifications.sources.slack.verify)."""
    stamp = stamp if stamp is not None else str(int(time.time()))
    digest = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


def sign_hub(body: bytes, secret: str, header: str) -> dict[str, str]:
    """GitHub's ``X-Hub-Signature-256`` / Atlassian's ``X-Hub-Signature``: ``sha256=HMAC(secret, body)``."""
    return {"Content-Type": "application/json", header: "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}


def new_channel(prefix: str = "DF") -> str:
    """A fresh Slack DM channel id: its own conversation, so its turns are countable."""
    return f"{prefix}{os.getpid():X}{next(_channel_seq):06d}{uuid.uuid4().hex[:4].upper()}"


def slack_dm(
    channel: str, text: str = "please summarise the build", *, event_id: Optional[str] = None, agent: str = AGENT
) -> dict[str, Any]:
    """A Slack DM to the seat whose Slack id is ``agent`` (ada's by default) in ``channel``: one conversation per channel."""
    return {
        "type": "event_callback",
        "event_id": event_id or f"Ev{channel}",
        "event": {
            "type": "message",
            "channel": channel,
            "channel_type": "im",
            "user": "U0GRACE",
            "text": f"<@{agent}> {text}",
            "ts": f"{int(time.time())}.{next(_channel_seq):06d}",
        },
        "authorizations": [{"user_id": agent, "is_bot": True}],
    }


# -- the process ---------------------------------------------------------------------------------


class Up(UpProcess):
    """``manage.py up`` on one data directory (an :class:`UpProcess`): restart, kill -9, stop; its broker child.

    Its output is kept across restarts and written to :data:`LOGS` by :meth:`cleanup`.
    """

    def __init__(
        self,
        tmp: Path,
        *,
        company: str,
        env: Optional[dict[str, str]] = None,
        node: str = "fault1",
    ) -> None:
        self.data_dir = tmp / "data"
        self.company_file = tmp / "company.yaml"
        self.company_file.write_text(company)
        super().__init__(
            tmp, "--data-dir", str(self.data_dir), "--company", str(self.company_file), node=node, ready_s=UP_READY_S,
            env=up_env(**{"CREWLET_OPERATOR_TOKEN": TOKEN, "CREWLET_DATABASE": "sqlite", **SECRETS, **(env or {})}),
        )
        self.logs: list[str] = []

    # -- lifecycle --

    @property
    def broker_pid(self) -> int:
        """The embedded nats-server child running now."""
        assert self.proc is not None
        found = [pid for pid, name in descendants(self.proc.pid).items() if name == "nats-server" and is_running(pid)]
        assert len(found) == 1, f"expected one nats-server child, found {found}"
        return found[0]

    def kill9(self) -> None:
        """SIGKILL ``up`` itself (not its group): its broker must die with it by the parent-death signal."""
        assert self.proc is not None
        children = descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_until(lambda: not [p for p in children if is_running(p)], timeout_s=15, what=f"children of a killed up die: {children}")
        self._keep_log()

    def terminate(self, timeout_s: float = 90.0) -> int:
        """SIGTERM and wait, the children it has then remembered for :meth:`leftover_children`; the exit status."""
        assert self.proc is not None
        self.children = descendants(self.proc.pid)
        status = super().terminate(timeout_s)
        self._keep_log()
        return status

    def leftover_children(self) -> list[int]:
        return [pid for pid in self.children if is_running(pid)]

    def cleanup(self) -> None:
        """Kill what is still running, then keep the case's `up` log as a CI artifact."""
        running = self.proc is not None and self.proc.poll() is None
        self.kill()
        if running:
            self._keep_log()
        LOGS.mkdir(parents=True, exist_ok=True)
        (LOGS / f"{self.tmp.name}.log").write_text(self.log_text())

    def _keep_log(self) -> None:
        if self.out is not None:
            self.logs.append(self.out.text())
            self.out = None

    def log_text(self) -> str:
        return "\n".join([*self.logs, self.output_so_far()])

    # -- HTTP --

    def api(self, path: str, params: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode(params, doseq=True)}" if params else ""
        status, body = request(f"{self.url}{path}{query}", headers={"Authorization": f"Bearer {TOKEN}"})
        if status != 200:
            raise ValueError(f"GET {path}{query}: {status} {body[:300]!r}")
        return json.loads(body)

    def post_api(self, path: str, payload: Any) -> tuple[int, dict[str, Any]]:
        status, body = request(
            f"{self.url}{path}", "POST", json.dumps(payload).encode(),
            {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        return status, json.loads(body or b"{}")

    def healthz(self) -> tuple[int, dict[str, Any]]:
        status, body = request(f"{self.url}/healthz", timeout_s=10)
        return status, json.loads(body or b"{}")

    def events(self, **filters: Any) -> list[dict[str, Any]]:
        """Every /api/events row matching ``filters``, following next_cursor (bounded)."""
        rows: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 500, **filters}
        for _ in range(200):
            page = self.api("/api/events", params)
            rows.extend(page["events"])
            cursor = page.get("next_cursor")
            if not cursor:
                return rows
            params = {**params, "cursor": cursor}
        raise AssertionError("more than 100,000 event rows: the suite never sends that many")

    def metric(self, name: str) -> float:
        """The value of the unlabelled sample ``name`` on ``/metrics`` (0 when it is not there yet)."""
        status, body = request(f"{self.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        if status != 200:
            raise ValueError(f"GET /metrics: {status}")
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def depths(self) -> dict[str, Optional[int]]:
        return {s["handle"]: s["depth"] for s in self.api("/api/seats/")["seats"] if s["kind"] == "agent"}


# -- what was sent, and what ran ----------------------------------------------------------------


@dataclasses.dataclass
class Delivery:
    channel: str
    body: bytes
    attempts: int = 0
    statuses: list[Any] = dataclasses.field(default_factory=list)
    accepted_at: Optional[float] = None  # wall clock of the 202, to compare with event timestamps
    trace_id: str = ""  # the 202's
    delivery_id: str = ""  # the 202's: GET /api/deliveries/{delivery_id} follows it

    @property
    def key(self) -> str:
        return f"slack:{self.channel}"


@dataclasses.dataclass
class Outcome:
    """What the store says about a set of deliveries."""

    sent: int
    accepted: int
    completed: dict[str, int]
    started: dict[str, int]
    failed: dict[str, int]
    finished_at: dict[str, float]
    #: Each delivery's turn starts, in order (wall clock).
    started_at: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def runs(self, key: str) -> int:
        return self.completed.get(key, 0)


class Sender:
    """Signed Slack DMs to one `up`, each retried like a vendor does on 503 or a dropped connection."""

    def __init__(self, up: Up) -> None:
        self.up = up
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()

    def new(self, text: str = "please summarise the build", agent: str = AGENT) -> Delivery:
        channel = new_channel()
        delivery = Delivery(channel, json.dumps(slack_dm(channel, text, agent=agent)).encode())
        with self._lock:
            self.deliveries.append(delivery)
        return delivery

    def attempt(self, delivery: Delivery, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        """One POST (signed now, as a vendor's retry is); the status, or the connection error's name."""
        delivery.attempts += 1
        answer = b""
        try:
            status, answer = request(f"{self.up.url}/webhooks/slack", "POST", delivery.body, sign_slack(delivery.body), timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            status = type(exc).__name__
        delivery.statuses.append(status)
        if status == 202 and delivery.accepted_at is None:
            delivery.accepted_at = time.time()
            accepted = json.loads(answer or b"{}")
            delivery.trace_id = str(accepted.get("trace_id") or "")
            delivery.delivery_id = str(accepted.get("delivery_id") or "")
        return status

    def send(self, delivery: Delivery, *, retries: int = 40, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        """Send until 2xx/4xx (a vendor stops on those) or ``retries`` attempts; 0.25 s apart, as a retry policy."""
        status: Any = None
        for _ in range(retries):
            status = self.attempt(delivery, timeout_s)
            if isinstance(status, int) and status < 500:
                return status
            time.sleep(0.25)  # the sender's retry spacing (a vendor's backoff), not a wait for a condition
        return status

    def send_new(self, count: int, text: str = "please summarise the build", agent: str = AGENT, **kw: Any) -> list[Delivery]:
        out = []
        for _ in range(count):
            delivery = self.new(text, agent)
            self.send(delivery, **kw)
            out.append(delivery)
        return out

    @property
    def accepted(self) -> list[Delivery]:
        return [d for d in self.deliveries if 202 in d.statuses]

    def outcome(self, deliveries: Optional[Iterable[Delivery]] = None) -> Outcome:
        chosen = list(self.deliveries if deliveries is None else deliveries)
        keys = {d.key for d in chosen}
        completed: dict[str, int] = {}
        failed: dict[str, int] = {}
        finished_at: dict[str, float] = {}
        for row in self.up.events(type="agent_turn_completed"):
            key = row.get("conversation_key") or ""
            if key not in keys:
                continue
            if row.get("failed"):
                failed[key] = failed.get(key, 0) + 1
            else:
                completed[key] = completed.get(key, 0) + 1
                finished_at[key] = max(finished_at.get(key, 0.0), parse_ts(row["timestamp"]))
        started: dict[str, int] = {}
        started_at: dict[str, list[float]] = {}
        for row in self.up.events(type="agent_turn_started"):
            key = row.get("conversation_key") or ""
            if key in keys:
                started[key] = started.get(key, 0) + 1
                started_at.setdefault(key, []).append(parse_ts(row["timestamp"]))
        return Outcome(
            sent=len(chosen),
            accepted=sum(1 for d in chosen if 202 in d.statuses),
            completed=completed,
            started=started,
            failed=failed,
            finished_at=finished_at,
            started_at={key: sorted(times) for key, times in started_at.items()},
        )

    def wait_all_ran(self, timeout_s: float, deliveries: Optional[Iterable[Delivery]] = None) -> Outcome:
        """Wait until every accepted delivery has a completed turn and every agent inbox is empty.

        On timeout the outcome so far is returned: the case records its figures, then asserts.
        """
        chosen = [d for d in (self.deliveries if deliveries is None else deliveries) if 202 in d.statuses]

        def settled() -> Optional[Outcome]:
            outcome = self.outcome(chosen)
            if any(outcome.runs(d.key) < 1 for d in chosen):
                return None
            if any(depth != 0 for depth in self.up.depths().values()):
                return None
            return outcome

        try:
            return wait_until(settled, timeout_s=timeout_s, what=f"{len(chosen)} accepted deliveries each ran", interval_s=0.5)
        except AssertionError:
            return self.outcome(chosen)  # the caller records the figures, then fails on what is missing


def record_exactly_once(
    figures: Any, sender: Sender, outcome: Outcome, *, origin: float, recovery_s: Optional[float], bound_s: float,
    note: str, **more: Any,
) -> list[float]:
    """Record the case's figures (``more`` as extra columns), then fail on a delivery accepted and never run, or run twice.

    Returns each accepted delivery's delay from ``origin`` (or from its acceptance, if later) to its last run.
    """
    accepted = sender.accepted
    lost = [d.key for d in accepted if outcome.runs(d.key) == 0]
    doubled = [d.key for d in accepted if outcome.runs(d.key) > 1]
    delays = [outcome.finished_at[d.key] - max(origin, d.accepted_at or origin) for d in accepted if d.key in outcome.finished_at]
    figures.record(
        sent=len(sender.deliveries),
        accepted=len(accepted),
        lost=len(lost),
        duplicated=len(doubled),
        delayed=sum(1 for x in delays if x > bound_s),
        max_delay_s=max(delays, default=0.0),
        recovery_s=recovery_s,
        bound_s=bound_s,
        note=note,
        **more,
    )
    assert not lost, f"accepted and never run: {lost}"
    assert not doubled, f"ran more than once: {doubled}"
    return delays


def parse_ts(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
