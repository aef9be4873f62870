"""A poison delivery: exactly 25 deliveries, one dead letter, replayable once; its neighbours run untouched.

The poison is a message the model provider fails on every time: the company's
provider is an OpenAI-compatible server on 127.0.0.1 (this test's own) that
answers 500 to any prompt carrying the marker while the fault is on. The
redelivery spacing is shrunk through ``CREWLET_DELIVERY_BACKOFF_*`` so the
whole budget runs in seconds through the same code as production.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from crewlet.queue.contract import MAX_DELIVERIES
from tests.faults.conftest import Figures
from tests.faults.fault_support import Sender, Up, company_yaml, wait_until
from tests.faults.fault_vendor import Said, Vendor

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MARKER = "POISON-PILL"


class Poisoned:
    """The fault vendor's answers: a 500 to any prompt carrying the marker while ``poisoned``, else an answer."""

    def __init__(self) -> None:
        self.poisoned = True
        self.vendor = Vendor(self.answer)

    def answer(self, prompt: str) -> Said:
        if MARKER in prompt and self.poisoned:
            return Said(status=500, error="the model fell over")
        return Said()

    @property
    def poison_calls(self) -> int:
        return len(self.vendor.calls_with(MARKER))


@pytest.fixture
def model() -> Iterator[Poisoned]:
    fake = Poisoned()
    yield fake
    fake.vendor.close()


def test_a_poison_delivery_is_delivered_exactly_25_times_dead_lettered_once_and_replayable_once(
    tmp_path: Path, figures: Figures, model: Poisoned
) -> None:
    # No retries inside a round: each delivery is one model call, so the calls count the deliveries.
    company = company_yaml(
        providers=f"[{{kind: openai, base_url: '{model.vendor.base_url}', model: fake, timeout_s: 10, retry: {{attempts: 0}}}}]"
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
        # Where the delivery is: on the dead-letter stream, its last attempt a failed turn, every failed attempt
        # but the last handed back as a retry naming the delivery it spent (the last became the dead letter).
        followed = up.api(f"/api/deliveries/{poison.delivery_id}")["delivery"]
        (seat,) = followed["seats"]
        assert (followed["state"], seat["state"], seat["dead_letter"]["deliveries"]) == ("dead_lettered", "dead_lettered", MAX_DELIVERIES)
        assert seat["turn"]["outcome"] == "failed" and seat["waiting"] is None
        retries = [e for e in followed["events"] if e["type"] == "message_retry_scheduled"]
        assert len(retries) == MAX_DELIVERIES - 1, [e["type"] for e in followed["events"]]

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
