"""What an attacker and an operator meet first at ``manage.py up``'s web server, each through a real ``up``.

Body limits enforced while reading, header timeouts, the sign-in throttle,
credentials kept out of the logs, ``/ws/stream``'s re-checks and Origin rule,
the admin's static files, ``/healthz``'s broker round trip and the production
settings ``check --deploy`` asks for.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from tests.test_skeleton import REPO_ROOT, ProcessOutput, _descendants, _running

pytestmark = pytest.mark.integration

UP_READY_S = 90.0
#: A condition the test waits for is expected well within this.
WAIT_S = 30.0


class Up:
    """``manage.py up`` on a free port with a fresh data dir (SQLite, the example company) and ``env``."""

    def __init__(self, tmp: Path, **env: str) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}
        self.env.update(PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="crewlet.settings", CREWLET_VAR_DIR=str(self.data_dir))
        self.env.update(env)
        self.proc: Optional[subprocess.Popen[str]] = None
        self.out: Optional[ProcessOutput] = None
        self.url = ""
        self.host = ""
        self.port = 0
        self.children: dict[int, str] = {}

    def start(self) -> "Up":
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "manage.py"), "up", "--addr", "127.0.0.1:0", "--node", "hw1"],
            cwd=self.tmp,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.out = ProcessOutput(self.proc)
        ready = self.out.wait_for("Crewlet is up: ", timeout_s=UP_READY_S)
        self.url = ready.split("Crewlet is up: ", 1)[1].split(" ", 1)[0].rstrip("/")
        hostport = self.url.split("://", 1)[1]
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        self.children = _descendants(self.proc.pid)
        return self

    def manage(self, *argv: str, extra_env: Optional[dict[str, str]] = None) -> str:
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), *argv],
            cwd=self.tmp, env={**self.env, **(extra_env or {})}, capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, f"manage.py {' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def request(
        self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[dict[str, str]] = None
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(req, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def rss_kib(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self) -> str:
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for pid in self.children:
            if _running(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        return self.out.text() if self.out else ""


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    started: list[Up] = []

    def start(**env: str) -> Up:
        up = Up(tmp_path / f"up{len(started)}", **env)
        up.tmp.mkdir()
        started.append(up)
        return up.start()

    yield start
    for up in started:
        up.stop()


def wait_until(condition: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> Any:
    """Poll ``condition`` until it is truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.05)


# -- credentials never reach a log line ------------------------------------------------------------


JIRA_SECRET = "jira-query-secret-7f3a9c"
BEARER = "bearer-token-value-51d2e8"
SESSION = "sessioncookie0value9b7"
SIGNATURE = "sha256=deadbeefsignature4c1"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("log_format", ["kv", "json"])
def test_a_query_secret_header_token_cookie_or_signature_never_reaches_up_s_log_in_either_format(
    start_up: Callable[..., Up], log_format: str
) -> None:
    up = start_up(CREWLET_LOG_FORMAT=log_format)
    status, _, _ = up.request(
        "POST",
        f"/webhooks/jira?secret={JIRA_SECRET}",
        body=b"{not json",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {BEARER}",
            "Cookie": f"sessionid={SESSION}",
            "X-Hub-Signature": SIGNATURE,
        },
    )
    assert status == 400
    status, _, _ = up.request("GET", f"/api/events?token={BEARER}", headers={"Authorization": f"Bearer {BEARER}"})
    assert status == 401
    up.out.wait_for("Unauthorized", timeout_s=WAIT_S)  # type: ignore[union-attr]
    text = up.stop()
    for secret in (JIRA_SECRET, BEARER, SESSION, SIGNATURE, "deadbeefsignature"):
        assert secret not in text
    request_lines = [line for line in text.splitlines() if "Bad Request" in line and "/webhooks/jira" in line]
    assert request_lines, text  # django.request did log the refusal...
    assert "secret=[redacted]" in request_lines[0]  # ...with the request, its secret blanked
    if log_format == "json":
        assert json.loads(request_lines[0])["logger"] == "django.request"


def test_both_formatters_blank_credential_fields_headers_url_passwords_and_tracebacks() -> None:
    import logging

    from crewlet.logfmt import JsonFormatter, KeyValueFormatter, RedactSecrets

    try:
        raise ValueError(f"cannot reach nats://crewlet:{BEARER}@127.0.0.1:4222 with Authorization: Bearer {BEARER}")
    except ValueError:
        exc_info = sys.exc_info()
    for formatter in (KeyValueFormatter(), JsonFormatter()):
        record = logging.LogRecord("crewlet.test", logging.WARNING, __file__, 1, "delivery_refused", None, exc_info)
        record.signing_secret = JIRA_SECRET
        record.headers = {"X-Slack-Signature": SIGNATURE, "Cookie": f"sessionid={SESSION}", "user-agent": "Slackbot"}
        record.scope_headers = [(b"authorization", f"Token {BEARER}".encode()), (b"host", b"localhost")]
        record.url = f"/webhooks/confluence?page=1&secret={JIRA_SECRET}"
        record.token_name = "env:CREWLET_OPERATOR_TOKEN"  # a token's name is not a token
        assert RedactSecrets().filter(record)
        line = formatter.format(record)
        for secret in (JIRA_SECRET, BEARER, SESSION, "deadbeefsignature"):
            assert secret not in line
        assert "Slackbot" in line and "page=1" in line and "env:CREWLET_OPERATOR_TOKEN" in line
        assert "ValueError" in line and "127.0.0.1:4222" in line
