"""A poison delivery: exactly 25 deliveries, one dead letter, replayable once; its neighbours run untouched.

The poison is a message the model provider fails on every time: the company's
provider is an OpenAI-compatible server on 127.0.0.1 (this test's own) that
answers 500 to any prompt carrying the marker while the fault is on. The
redelivery spacing is shrunk through ``CREWLET_DELIVERY_BACKOFF_*`` so the
whole budget runs in seconds through the same code as production.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from crewlet.queue.contract import MAX_DELIVERIES
from tests.faults.conftest import Figures
from tests.faults.fault_support import Sender, Up, company_yaml, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MARKER = "POISON-PILL"


class FakeModel:
    """An OpenAI-compatible chat endpoint that fails on the marker while ``poisoned``."""

    def __init__(self) -> None:
        self.poisoned = True
        self.poison_calls = 0
        self.calls = 0
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with model._lock:
                    model.calls += 1
                    fail = MARKER.encode() in body and model.poisoned
                    if MARKER.encode() in body:
                        model.poison_calls += 1
                if fail:
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b'{"error": "the model fell over"}')
                    return
                answer = json.dumps({
                    "model": "fake",
                    "choices": [{"message": {"content": "done"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def model() -> Iterator[FakeModel]:
    fake = FakeModel()
    yield fake
    fake.close()


def test_a_poison_delivery_is_delivered_exactly_25_times_dead_lettered_once_and_replayable_once(
    tmp_path: Path, figures: Figures, model: FakeModel
) -> None:
    # No retries inside a round: each delivery is one model call, so the calls count the deliveries.
    company = company_yaml(
        providers=f"[{{kind: openai, base_url: '{model.base_url}', model: fake, timeout_s: 10, retry: {{attempts: 0}}}}]"
    )
    up = Up(tmp_path, company=company, env={"CREWLET_DELIVERY_BACKOFF_BASE_S": "0.05", "CREWLET_DELIVERY_BACKOFF_CAP_S": "0.2"})
    try:
        up.start()
        sender = Sender(up)
        poison = sender.new(f"{MARKER} please")
        assert sender.send(poison) == 202
        good = sender.send_new(5)
        assert all(202 in d.statuses for d in good)

        started = time.monotonic()
        letters = wait_until(
            lambda: up.api("/api/dead-letters")["dead_letters"], timeout_s=120, what="the poison reaches the dead-letter stream"
        )
        budget_s = time.monotonic() - started
        assert len(letters) == 1, letters
        letter = letters[0]
        assert letter["deliveries"] == MAX_DELIVERIES and letter["seat"] == "ada", letter
        outcome = sender.wait_all_ran(timeout_s=60, deliveries=good)
        assert all(outcome.runs(d.key) == 1 for d in good), outcome.completed
        assert sender.outcome([poison]).failed.get(poison.key) == MAX_DELIVERIES
        assert model.poison_calls == MAX_DELIVERIES

        model.poisoned = False
        status, answer = up.post_api("/operator/act", {"tool": "dead_letter_replay", "args": {"ref": letter["ref"]}, "request_id": "fault-1"})
        assert status == 200 and answer["outcome"] == "replayed", answer
        status, again = up.post_api("/operator/act", {"tool": "dead_letter_replay", "args": {"ref": letter["ref"]}, "request_id": "fault-2"})
        assert status == 404 and again["error"] == "gone", (status, again)
        after = sender.wait_all_ran(timeout_s=60, deliveries=[poison])
        assert after.runs(poison.key) == 1
        assert up.api("/api/dead-letters")["dead_letters"] == []
        figures.record(
            sent=len(sender.deliveries),
            accepted=len(sender.accepted),
            lost=0,
            duplicated=sum(1 for d in sender.accepted if after.runs(d.key) > 1 or outcome.runs(d.key) > 1),
            delayed=0,
            max_delay_s=None,
            recovery_s=budget_s,
            bound_s=None,
            note=f"{letter['deliveries']} deliveries, 1 dead letter, replayed once (2nd replay 404); recovery = whole budget at 0.05-0.2 s spacing",
        )
    finally:
        up.cleanup()
