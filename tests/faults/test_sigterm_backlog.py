"""SIGTERM with a backlog fetched over several seats: every fetched delivery is handed back at once, none left to the ack clock.

Six agent seats each hold a drain of 25 DMs (their inboxes paused while the
150 are sent, then resumed, so each seat fetches its 25 in one drain), two
turns run at a time and the rest wait at the node's gate or behind their
seat's running partition. Then `up` gets SIGTERM. A clean stop hands back at
once everything fetched that no turn is working on; what it kept would come
back only when its ack clock runs out. `up` stops its embedded broker with it,
so "handed back" has to survive the broker's restart: an immediate Nak lives
only in the broker's memory, and before the stop used a Nak the broker stores
(crewlet.queue.jetstream.message.NAK_EXPIRED) all 148 waited out their clock.
The model is a local vendor that thinks 2 s a call before the stop and answers
at once after it, so after the restart the handed-back backlog runs in seconds
and a delivery left to the ack clock stands apart from it: it cannot start
before its clock (set to 120 s here; its last in-progress signal was at most a
third of that before the stop) runs out.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.faults.conftest import Figures
from tests.faults.fault_support import Outcome, Sender, Up, company_yaml, identity, record_exactly_once, wait_until
from tests.faults.fault_vendor import KEY, KEY_ENV, Said, Vendor

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SEATS = ("ada", "linus", "w1", "w2", "w3", "w4")
PER_SEAT = 25
#: The simulated model's think time before the stop: long enough that the backlog is still fetched and waiting.
THINK_S = 2.0
#: The ack clock of this case: a delivery the stop kept cannot start again before it runs out
#: (its last in-progress signal was at most a third of it before the stop).
ACK_WAIT_S = 120.0
#: The handed-back backlog, every turn answered at once, runs within this of the stop on a loaded 2-core machine.
HANDED_BACK_BOUND_S = 45.0


class Thinking:
    """Every call thinks ``think_s`` before its answer; the case sets it to 0 at the stop."""

    think_s = THINK_S

    def __call__(self, prompt: str) -> Said:
        return Said(think_s=self.think_s)


@pytest.fixture
def vendor() -> Iterator[tuple[Vendor, Thinking]]:
    thinking = Thinking()
    model = Vendor(thinking)
    yield model, thinking
    model.close()


def first_start_after(outcome: Outcome, key: str, moment: float) -> float | None:
    return next((t for t in outcome.started_at.get(key, []) if t >= moment), None)


def test_sigterm_with_150_deliveries_fetched_over_six_seats_hands_every_one_back_at_once(
    tmp_path: Path, figures: Figures, vendor: tuple[Vendor, Thinking]
) -> None:
    model, thinking = vendor
    company = company_yaml(providers=model.provider(), max_concurrent=2, coalesce_max_batch=30, agents=SEATS[2:])
    up = Up(tmp_path, company=company, env={KEY_ENV: KEY, "CREWLET_STREAM_ACK_WAIT_S": str(ACK_WAIT_S)})
    try:
        up.start()
        sender = Sender(up)
        for seat in SEATS:
            assert up.post_api(f"/api/seats/{seat}/pause", {"reason": "fault suite: gather a drain"})[0] == 200
        for _ in range(PER_SEAT):
            for seat in SEATS:
                assert sender.send(sender.new(agent=identity(seat))) == 202
        wait_until(lambda: all(d == PER_SEAT for d in up.depths().values()), timeout_s=60, what="25 DMs in each inbox")
        for seat in SEATS:
            assert up.post_api(f"/api/seats/{seat}/resume", {})[0] == 200
        # Both of the node's slots busy: every seat has been resumed, and each fetches its drain at once.
        wait_until(lambda: len(up.events(type="agent_turn_started")) >= 2, timeout_s=60, what="two turns running")

        thinking.think_s = 0.0  # calls made from now on answer at once
        stop_began = time.time()
        status = up.terminate()
        stopped_at = time.time()
        assert status == 0, up.log_text()[-3000:]
        assert "clean=true" in up.log_text()
        wait_until(lambda: not up.leftover_children() or None, timeout_s=10, what="no child outlives up")

        began = time.monotonic()
        up.start()
        recovery_s = time.monotonic() - began
        outcome = sender.wait_all_ran(timeout_s=HANDED_BACK_BOUND_S)
        if any(outcome.runs(d.key) == 0 for d in sender.accepted):  # left to the ack clock: wait it out to count them
            outcome = sender.wait_all_ran(timeout_s=ACK_WAIT_S + 30)

        held = [d for d in sender.accepted if not any(t <= stop_began for t in outcome.started_at.get(d.key, []))]
        starts = {d.key: first_start_after(outcome, d.key, stopped_at) for d in held}
        waited = [k for k, t in starts.items() if t is not None and t - stopped_at >= ACK_WAIT_S / 2]
        log = up.log_text()
        delays = record_exactly_once(
            figures, sender, outcome, origin=stopped_at, recovery_s=recovery_s, bound_s=HANDED_BACK_BOUND_S,
            note=(f"{len(held)} fetched or waiting at SIGTERM over {len(SEATS)} seats, 2 slots; "
                  f"{len(waited)} left to the {ACK_WAIT_S:g}s ack clock; delay from the stop"),
            held_at_stop=len(held), waited_ack_clock=len(waited),
            hand_back_failures=log.count("queue_hand_back_failed") + log.count("queue_hand_back_on_stop_failed"),
        )
        assert len(held) >= 100, f"only {len(held)} deliveries were waiting at the stop"
        assert not waited, f"{len(waited)} of {len(held)} fetched deliveries waited for the ack clock: {waited}"
        assert max(delays) <= HANDED_BACK_BOUND_S, max(delays)
        assert up.terminate() == 0
    finally:
        up.cleanup()
