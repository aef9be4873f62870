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
import contextlib
import itertools
import json
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from crewlet.company.parse import EXAMPLE_COMPANY
from tests.process_support import REPO_ROOT
from tests.up_support import UP_READY_S, UpProcess, http_json, up_env

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
#: How long a page may take to show what a test waits for (a noisy 2-core machine).
WAIT_MS = 30_000
#: The browser's zone: UTC+05:30 all year, so a time shown in it differs from UTC in hours and minutes.
BROWSER_ZONE = "Asia/Kolkata"
STAFF_USER = "operator"
STAFF_PASSWORD = "browser-test-password-4711"


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


#: The example company with token budgets the browser tests' echo turns (a thousand tokens or so each) stay well under,
#: yet near enough that each capped window's bar (the company's day, ada's day) is drawn wider than nothing.
BUDGETS = "budget: {tokens_per_day: 5000000}\n"
ADA_BUDGET = ("{handle: ada, kind: agent, role: engineer,", "{handle: ada, kind: agent, role: engineer, budget: {tokens_per_day: 2000000},")
#: How often the company reports its budgets' windows (``budget_meters``): soon after each turn, in a test.
METERS_EVERY_S = "0.5"


def budgeted_company() -> str:
    """The example company's file with :data:`BUDGETS` and ada's own ceiling."""
    text = EXAMPLE_COMPANY.read_text()
    assert ADA_BUDGET[0] in text, "the example company's ada is not where this test puts her budget"
    return BUDGETS + text.replace(*ADA_BUDGET)


class Company(UpProcess):
    """`manage.py up` serving the example company (``company_text`` instead, when given), and what the test needs to talk to it."""

    def __init__(self, tmp: Path, broker_url: str, company_text: str = "") -> None:
        self.data_dir = tmp / "data"
        env = up_env(CREWLET_STREAM_TYPE="nats", CREWLET_STREAM_URL=broker_url, CREWLET_VAR_DIR=str(self.data_dir))
        argv: tuple[str, ...] = ()
        if company_text:
            env["CREWLET_NODE_BUDGET_METERS_EVERY_S"] = METERS_EVERY_S
            (tmp / "company.yaml").write_text(company_text)
            argv = ("--company", str(tmp / "company.yaml"))
        super().__init__(tmp, *argv, node="web1", env=env, ready_s=UP_READY_S)

    def start(self) -> "Company":
        super().start()
        self.manage("createsuperuser", "--noinput", "--username", STAFF_USER, "--email", "op@example.com",
                    extra_env={"DJANGO_SUPERUSER_PASSWORD": STAFF_PASSWORD})
        return self

    def post_json(self, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return http_json("POST", self.url + path, json.dumps(payload).encode(), {"Content-Type": "application/json"}, empty={})


@contextlib.contextmanager
def company_on_broker(tmp: Path, **env: str) -> Iterator[tuple[LoopThread, Any, Company]]:
    """A broker on a loop thread of its own and the example company's `up` on it, ``env`` added to up's.

    On leaving, up is stopped, then the broker; up must have stopped cleanly (its output is the assertion's message).
    """
    from crewlet.queue.broker import EmbeddedBroker

    loop = LoopThread()
    broker = EmbeddedBroker(store_dir=tmp / "jetstream")
    loop.run(broker.start())
    company = Company(tmp, broker.url)
    company.env.update(env)
    try:
        company.start()
        yield loop, broker, company
    finally:
        output = company.stop()
        loop.run(broker.stop())
        loop.close()
    assert "clean=true" in output, output[-4000:]


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


def sign_in(page: Any, company: Company, path: str = "/") -> None:
    """Open ``path``, be sent to sign in, sign in as the staff user and land on ``path``."""
    import re

    from playwright.sync_api import expect

    page.goto(company.url + path)
    expect(page).to_have_url(re.compile(r"/login/\?next="))  # the dashboard's sign-in, or the admin's
    page.fill("input[name=username]", STAFF_USER)
    page.fill("input[name=password]", STAFF_PASSWORD)
    page.click("main form [type=submit], #login-form [type=submit]")
    expect(page).to_have_url(company.url + path)


def live(page: Any) -> None:
    """The page's socket delivered its snapshot."""
    from playwright.sync_api import expect

    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
