"""A stall and a scheduled task's timeout through a real ``manage.py up``: each a guard breach, a failed turn, the seat's last_error.

The model is a local OpenAI-compatible server that accepts every request and
never answers (until the test lets it go); the provider's own deadline
(``timeout_s: 120``) is far off. Two schedules fire when ``up`` starts:

* sam's ``nightly`` names ``timeout: 1s`` — its turn ends at one second as
  ``turn.guard_breach`` ``scheduled_timeout``;
* stan's ``sweep`` keeps the default half hour, so it is the stall bound
  (``CREWLET_NODE_TURN_STALL_S=2``) that ends its turn: ``stall``.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Iterator

import contextlib
import pytest

from tests.up_support import UpProcess, up_env
from seats_support import loopback_http
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "turn-guards-up-operator-token-0123456789"


@contextlib.contextmanager
def stalling_model() -> Iterator[str]:
    """An OpenAI-compatible ``base_url`` whose every request is read and never answered while the block runs."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            release.wait(120)

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            release.set()


def company(base_url: str) -> str:
    return (
        "org: acme\n"
        f"providers:\n  llm:\n    - {{kind: openai, base_url: \"{base_url}\", model: local-7b, timeout_s: 120}}\n"
        "seats:\n"
        "  - {handle: sam, kind: agent, role: engineer}\n"
        "  - {handle: stan, kind: agent, role: engineer}\n"
        "schedules:\n"
        "  - {name: nightly, seat: sam, every: 1m, timeout: 1s, task: Summarise the night}\n"
        "  - {name: sweep, seat: stan, every: 1m, task: Triage new issues}\n"
    )


def live_seat(up: UpProcess, handle: str) -> dict[str, Any]:
    """The seat's live row, as the first frame of ``/ws/stream`` (the projection's snapshot) shows it."""
    from websockets.sync.client import connect

    with connect(up.url.replace("http://", "ws://") + "/ws/stream", additional_headers={"Authorization": f"Bearer {TOKEN}"}, open_timeout=30) as ws:
        snapshot = json.loads(ws.recv(timeout=30))
    return next(s for s in snapshot["seats"] if s["handle"] == handle)


def test_a_scheduled_task_past_its_timeout_and_a_turn_that_stalls_each_fail_as_a_guard_breach_the_seat_shows(tmp_path: Path) -> None:
    with stalling_model() as base_url:
        (tmp_path / "acme.yaml").write_text(company(base_url))
        env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_NODE_TURN_STALL_S="2")
        with UpProcess(tmp_path, "--data-dir", str(tmp_path / "data"), "--company", str(tmp_path / "acme.yaml"), node="t1", env=env) as up:
            for seat in ("sam", "stan"):
                wait_until(lambda: up.events("turn.guard_breach", seat), 120, f"{seat}'s guard breach")
            breaches = {seat: up.events("turn.guard_breach", seat)[0] for seat in ("sam", "stan")}
            done = {seat: up.events("agent_turn_completed", seat)[0] for seat in ("sam", "stan")}
            live = {seat: live_seat(up, seat) for seat in ("sam", "stan")}
            assert up.terminate() == 0, up.output()

    assert breaches["sam"]["guard"] == "scheduled_timeout"
    assert breaches["sam"]["detail"] == "the scheduled task nightly ran past its timeout of 1s"
    assert breaches["stan"]["guard"] == "stall"
    assert breaches["stan"]["detail"] == "no provider answer or tool result for 2s (node.turn_stall_s)"
    for seat, guard in (("sam", "scheduled_timeout"), ("stan", "stall")):
        assert done[seat]["failed"] and done[seat]["turn_id"] == breaches[seat]["turn_id"]
        assert done[seat]["error"].startswith(f"{guard}: ")
        assert live[seat]["last_error"].startswith(f"{guard}: ")
