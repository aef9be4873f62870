"""A real company for the browser tests: `manage.py up` on a broker the test can reach too.

The test process starts a real nats-server (the embedded broker class) and runs
``manage.py up`` with ``stream.type: nats`` against it — the fleet shape of one
node — so the test holds its own JetStream client on the same broker: it can
dead-letter a message for real and watch a replay arrive, while the dashboard
under test is exactly the one `bin/up` serves (SQLite, Daphne, /ws/stream).
Headless Chromium is Debian's (bin/test installs it); Playwright drives it with
``executable_path`` and never downloads a browser.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, TypeVar

from tests.process_support import REPO_ROOT, ProcessOutput, descendants, is_running

T = TypeVar("T")

CHROMIUM = os.environ.get("CREWLET_CHROMIUM", "/usr/bin/chromium")
#: Flags for a root, screenless, offline machine (its closed network refuses Chromium's own connections).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Where each page's screenshot is kept (beside CI's junit report).
SCREENSHOTS = REPO_ROOT / "var" / "ci" / "screenshots"
STAFF_USER = "operator"
STAFF_PASSWORD = "browser-test-password-4711"
UP_READY_S = 120.0


class LoopThread:
    """An asyncio loop on its own thread, for the test's broker and queue client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="browser-test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout_s: float = 60.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return future.result(timeout=timeout_s)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapped() -> T:
            return fn()

        return self.run(wrapped())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class Company:
    """`manage.py up` serving the example company, and what the test needs to talk to it."""

    def __init__(self, tmp: Path, broker_url: str) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}  # SQLite, the defaults
        self.env.update(
            PYTHONUNBUFFERED="1",
            DJANGO_SETTINGS_MODULE="crewlet.settings",
            CREWLET_STREAM_TYPE="nats",
            CREWLET_STREAM_URL=broker_url,
            CREWLET_VAR_DIR=str(self.data_dir),
        )
        self.proc: Optional[subprocess.Popen[str]] = None
        self.out: Optional[ProcessOutput] = None
        self.url = ""
        self.children: dict[int, str] = {}

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "manage.py"), "up", "--addr", "127.0.0.1:0", "--node", "web1"],
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
        self.manage("createsuperuser", "--noinput", "--username", STAFF_USER, "--email", "op@example.com",
                    extra_env={"DJANGO_SUPERUSER_PASSWORD": STAFF_PASSWORD})
        self.children = descendants(self.proc.pid)

    def manage(self, *argv: str, extra_env: Optional[dict[str, str]] = None) -> str:
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), *argv],
            cwd=self.tmp, env={**self.env, **(extra_env or {})}, capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, f"manage.py {' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def post_json(self, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def stop(self) -> str:
        if self.proc is None:
            return ""
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid in self.children:
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
        return self.out.text() if self.out else ""


_message_ts = itertools.count(1)


def slack_message(event_id: str, text: str, user: str = "U0GRACE", to: str = "U0ADA") -> dict[str, Any]:
    """The README's Slack delivery: a direct message to ada from grace (a new message each time: its own ts)."""
    return {
        "type": "event_callback",
        "event_id": event_id,
        "event": {
            "type": "message",
            "channel": "D0ADA",
            "channel_type": "im",
            "user": user,
            "text": f"<@{to}> {text}",
            "ts": f"1718000000.{next(_message_ts):06d}",
        },
        "authorizations": [{"user_id": to, "is_bot": True}],
    }


def screenshot(page: Any, name: str) -> Path:
    """Keep a picture of the page as a test artifact."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
