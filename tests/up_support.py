"""``manage.py up`` as a child process: how every test that runs the real thing starts it, talks to it and stops it.

A test that exercises a route or a command the way it runs starts ``up`` on a
free port with its own data directory (SQLite and the embedded broker unless
its environment says otherwise), waits for the ready line, and must leave
nothing running behind it, whatever happens: :class:`UpProcess` does the
three, and is a context manager whose exit kills the process group and every
descendant seen at start (the broker ``up`` spawned among them).
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import urlencode
from pathlib import Path
from types import TracebackType
from typing import Any, Iterator, Mapping, Optional, TypeVar

from tests.process_support import REPO_ROOT, ProcessOutput, descendants, is_running
from waiting_support import wait_until

#: What ``up`` prints once it serves, followed by its URL.
READY_LINE = "Crewlet is up: "
#: How long ``up`` may take to be ready on a loaded machine (not a bound any test asserts).
UP_READY_S = 120.0
#: How long a request to the process under test may take before the test gives up on it.
REQUEST_TIMEOUT_S = 60.0

U = TypeVar("U", bound="UpProcess")


def openai_company(base_url: str, key_env: str, timeout_s: float) -> str:
    """A company file's opening: org ``acme`` and one OpenAI-compatible provider (model gpt-test) at ``base_url``."""
    return (
        "org: acme\nproviders:\n  llm:\n"
        f"    - {{kind: openai, base_url: \"{base_url}\", model: gpt-test, api_key_env: {key_env}, timeout_s: {timeout_s:g}}}\n"
    )


#: The company file's surfaces and seats where ada may ask linus (``a2a_ask``, four rounds a turn) and
#: grace, a person, writes to her on Slack (unverified): the tail of an up test's company after its providers.
ADA_ASKS_LINUS_ON_SLACK = """\
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}, tools: [a2a_ask], max_rounds: 4}
  - {handle: linus, kind: agent, role: reviewer, identities: {slack: U0LINUS}}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}
"""


def up_env(**extra: str) -> dict[str, str]:
    """The test's environment without any ``CREWLET_`` setting (SQLite, the defaults), unbuffered, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}
    env.update(PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="crewlet.settings")
    env.update(extra)
    return env


#: How the test reaches PostgreSQL (``bin/test`` sets them), which an ``up`` on PostgreSQL needs too.
PG_CLIENT_KEYS = ("CREWLET_PG_HOST", "CREWLET_PG_PORT", "CREWLET_PG_USER", "CREWLET_PG_PASSWORD")


def pg_client_env() -> dict[str, str]:
    """The test's own PostgreSQL connection settings (those set), for an ``up`` (``up_env`` leaves out every ``CREWLET_``)."""
    return {key: os.environ[key] for key in PG_CLIENT_KEYS if os.environ.get(key)}


class UpProcess:
    """``manage.py up --addr 127.0.0.1:0 <argv> --node <node>`` in ``tmp``, with ``env`` (default :func:`up_env`)."""

    def __init__(
        self, tmp: Path, *argv: str, node: str, env: Optional[Mapping[str, str]] = None, ready_s: float = UP_READY_S
    ) -> None:
        self.tmp = tmp
        self.argv = argv
        self.node = node
        self.env = dict(env) if env is not None else up_env()
        self.ready_s = ready_s
        self.proc: Optional[subprocess.Popen[str]] = None
        self.out: Optional[ProcessOutput] = None
        #: The ready line, and the URL it names (no trailing slash).
        self.ready = ""
        self.url = ""
        self.children: dict[int, str] = {}

    def start(self: U) -> U:
        """Start ``up`` and wait for its ready line; the processes it started by then are remembered."""
        argv = [sys.executable, str(REPO_ROOT / "manage.py"), "up", "--addr", "127.0.0.1:0", *self.argv, "--node", self.node]
        # Its own session, so the whole group can be killed; stderr merged, so the output is one ordered text.
        self.proc = subprocess.Popen(
            argv, cwd=self.tmp, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )
        self.out = ProcessOutput(self.proc)
        self.ready = self.out.wait_for(READY_LINE, timeout_s=self.ready_s)
        self.url = self.ready.split(READY_LINE, 1)[1].split(" ", 1)[0].rstrip("/")
        self.children = descendants(self.proc.pid)
        return self

    def __enter__(self: U) -> U:
        try:
            return self.start()
        except BaseException:
            self.kill()
            raise

    def __exit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.kill()

    def wait_for(self, needle: str, timeout_s: float = REQUEST_TIMEOUT_S) -> str:
        """The first output line containing ``needle``, once it is printed."""
        assert self.out is not None
        return self.out.wait_for(needle, timeout_s=timeout_s)

    def output(self) -> str:
        """Everything the process printed, once it has ended (its output closed)."""
        assert self.out is not None
        return self.out.text()

    def call(self, path: str, method: str = "GET", body: Optional[dict[str, Any]] = None) -> tuple[int, Any]:
        """``method path`` as the operator (the token ``up`` was started with), ``body`` sent as JSON; the status and
        the answer's JSON (None for an empty answer), an error status answered like any other."""
        token = self.env.get("CREWLET_OPERATOR_TOKEN", "")
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        return http_json(method, self.url + path, json.dumps(body).encode() if body is not None else None, headers)

    def api(self, path: str) -> Any:
        """``GET path`` (``/api/...``) as the operator, with the token ``up`` was started with; its JSON, asserting 200."""
        status, body = self.call(path)
        assert status == 200, body
        return body

    def events(self, etype: str, seat: str = "") -> list[dict[str, Any]]:
        """Every stored event of ``etype`` (about ``seat``, when given), oldest first, each as published (its wire form)."""
        rows = self.api(f"/api/events?type={etype}" + (f"&seat={seat}" if seat else ""))["events"]
        return [self.api(f"/api/events/{row['id']}")["event"]["wire"] for row in reversed(rows)]

    def readyz(self) -> dict[str, Any]:
        """The components ``/readyz`` reports, whichever its status."""
        _, body = http_json("GET", self.url + "/readyz")
        return dict(body["components"])

    def output_so_far(self) -> str:
        """What the process has printed so far, without waiting for it to end."""
        return "\n".join(list(self.out.lines)) if self.out else ""

    def manage(self, *argv: str, extra_env: Optional[dict[str, str]] = None) -> str:
        """Run another ``manage.py`` command against the same data; its stdout (it must succeed)."""
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), *argv],
            cwd=self.tmp, env={**self.env, **(extra_env or {})}, capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, f"manage.py {' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, and the exit status once ``up`` has stopped."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> str:
        """Stop ``up`` (SIGTERM; its process group killed if that does not end it in time), then what it left; its output."""
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            try:
                self.terminate()
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._kill_children()
        return self.out.text() if self.out else ""

    def kill(self) -> None:
        """SIGKILL the process group and every descendant seen at start: only what this test started."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._kill_children()
        self.proc.wait(timeout=10)

    def _kill_children(self) -> None:
        for pid in self.children:
            if is_running(pid):
                os.kill(pid, signal.SIGCONT)  # one a test froze gets its SIGKILL all the same
                os.kill(pid, signal.SIGKILL)


def serve(process: U) -> Iterator[U]:
    """For a fixture (``yield from serve(...)``): ``process`` started, then stopped; a traceback it printed fails the test."""
    try:
        yield process.start()
    finally:
        output = process.stop()
        assert "Traceback" not in output, output[-6000:]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def http_call(
    method: str,
    url: str,
    body: Optional[bytes] = None,
    headers: Optional[Mapping[str, str]] = None,
    *,
    redirects: bool = True,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> tuple[int, dict[str, str], bytes]:
    """One request: (status, headers, body), an error status answered like any other; ``redirects=False`` shows a 302."""
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    opener = urllib.request.build_opener(*(() if redirects else (_NoRedirect,)))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def http_json(
    method: str, url: str, body: Optional[bytes] = None, headers: Optional[Mapping[str, str]] = None, *, empty: Any = None
) -> tuple[int, Any]:
    """:func:`http_call` with the answer decoded as JSON (``empty`` for an empty body)."""
    status, _, raw = http_call(method, url, body, headers)
    return status, json.loads(raw) if raw else empty


def turn_completed(url: str, trace_id: str, token: str, timeout_s: float = REQUEST_TIMEOUT_S) -> list[str]:
    """The event types of ``trace_id`` once its turn completed, read from ``up``'s ``/api/events`` (``url`` ends in ``/``)."""

    def types() -> list[str]:
        status, body = http_json("GET", f"{url}api/events?trace_id={trace_id}", headers={"Authorization": f"Bearer {token}"}, empty={})
        assert status == 200, body
        found = [row["type"] for row in body["events"]]
        return found if "agent_turn_completed" in found else []

    return wait_until(types, timeout_s, f"agent_turn_completed in trace {trace_id}")


__all__ = [
    "READY_LINE", "REQUEST_TIMEOUT_S", "UP_READY_S", "UpProcess", "http_call", "http_json", "openai_company", "serve",
    "turn_completed", "up_env", "dashboard_page", "dashboard_pages",
]


def dashboard_page(up: UpProcess, path: str) -> str:
    """The dashboard page at ``path`` as a staff user sees it: one is created, signs in, and is sent on there."""
    return dashboard_pages(up, path)[0]


def dashboard_pages(up: UpProcess, first: str, *more: str) -> list[str]:
    """:func:`dashboard_page` at ``first``, then each of ``more`` in the same signed-in session (redirects followed)."""
    up.manage("createsuperuser", "--noinput", "--username", "op", "--email", "op@example.com",
              extra_env={"DJANGO_SUPERUSER_PASSWORD": "pw-0123456789"})
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with browser.open(up.url + "/login/", timeout=30) as response:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.read().decode())
    assert token is not None
    form = urlencode({"csrfmiddlewaretoken": token.group(1), "username": "op", "password": "pw-0123456789", "next": first})
    pages = []
    with browser.open(urllib.request.Request(up.url + "/login/", data=form.encode()), timeout=30) as response:
        pages.append(str(response.read().decode()))
    for path in more:
        with browser.open(up.url + path, timeout=30) as response:
            pages.append(str(response.read().decode()))
    return pages
