"""kill -9 of `up`, and a turn longer than its ack clock: every accepted delivery runs exactly once, within the bound.

The bounds are docs/RELIABILITY.md's: mail that was held (a paused seat) is
on the broker, unfetched, and runs as soon as the seat is resumed after the
restart; mail that was fetched when `up` died (a turn in flight, or waiting
for a concurrency slot) comes back when its ack clock (``stream.ack_wait_s``)
runs out, and runs once — in-progress signals keep a long turn's clock alive,
so the broker never hands out a delivery whose turn is still running. A clean
stop (SIGTERM) is tests/faults/test_sigterm_backlog.py's.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import Figures
from tests.faults.fault_support import Outcome, Sender, Up, company_yaml, record_exactly_once, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The ack clock of the cases (``stream.ack_wait_s``, the least it allows; 30 s by default): what a
#: crash costs fetched mail, and, in the progress case, shorter than a turn, so a turn whose
#: delivery kept no clock alive would be handed out again while it runs.
SHORT_ACK_WAIT_S = 5.0
#: How long the echo model thinks per turn in the in-flight cases.
TURN_S = 2.0
#: How long a turn of the progress case thinks: half as long again as the ack clock, so
#: the clock runs out mid-turn unless in-progress signals (every third of it) renew it.
LONG_TURN_S = 1.5 * SHORT_ACK_WAIT_S
#: Slack over a bound for a loaded 2-core machine (start-up, polling, the event writer).
SLACK_S = 10.0


def _figures(figures: Figures, sender: Sender, outcome: Outcome, **case: Any) -> None:
    restarted_turns = sum(max(outcome.started.get(d.key, 0) - 1, 0) for d in sender.accepted)
    record_exactly_once(figures, sender, outcome, restarted_turns=restarted_turns, **case)


def _turn_in_flight(up: Up, count: int) -> Sender:
    """``count`` deliveries accepted, and one of their turns running."""
    sender = Sender(up)
    sent = sender.send_new(count)
    assert all(202 in d.statuses for d in sent)
    wait_until(lambda: up.events(type="agent_turn_started"), timeout_s=30, what="a turn in flight")
    return sender


def test_kill_9_of_up_with_mail_held_for_a_paused_seat_loses_and_doubles_nothing_after_the_restart(
    tmp_path: Path, figures: Figures
) -> None:
    up = Up(tmp_path, company=company_yaml())
    try:
        up.start()
        sender = Sender(up)
        assert up.post_api("/api/seats/ada/pause", {"reason": "fault suite"})[0] == 200
        held = sender.send_new(12)
        assert all(202 in d.statuses for d in held), [d.statuses for d in held]
        wait_until(lambda: up.depths()["ada"] == 12, timeout_s=30, what="12 deliveries waiting in ada's inbox")
        assert sender.outcome().completed == {}  # held: nothing ran

        up.kill9()
        began = time.monotonic()
        up.start()
        recovery_s = time.monotonic() - began
        assert up.depths()["ada"] == 12  # the file store kept the held mail
        resumed_at = time.time()
        assert up.post_api("/api/seats/ada/resume", {})[0] == 200
        outcome = sender.wait_all_ran(timeout_s=SLACK_S + 30)
        _figures(figures, sender, outcome, bound_s=SLACK_S, origin=resumed_at, recovery_s=recovery_s, note="paused seat; delay from resume")
    finally:
        up.cleanup()


def test_kill_9_of_up_with_a_turn_in_flight_and_mail_waiting_runs_each_delivery_exactly_once_after_the_restart(
    tmp_path: Path, figures: Figures
) -> None:
    """Mail fetched by the dead process is back within one ack clock (shrunk to its least), not half an hour."""
    company = company_yaml(providers=f"[{{kind: echo, delay_s: {TURN_S}}}]", max_concurrent=1, coalesce_max_batch=20)
    up = Up(tmp_path, company=company, env={"CREWLET_STREAM_ACK_WAIT_S": str(SHORT_ACK_WAIT_S)})
    try:
        up.start()
        # One turn thinks for TURN_S on the only slot; the others wait for it, fetched or not.
        sender = _turn_in_flight(up, 4)
        up.kill9()
        began = time.monotonic()
        up.start()
        recovery_s = time.monotonic() - began
        restarted_at = time.time()
        # Serially, with one slot: 4 turns of TURN_S, after at most one ack clock.
        bound_s = SHORT_ACK_WAIT_S + 4 * TURN_S + SLACK_S
        outcome = sender.wait_all_ran(timeout_s=bound_s + 30)
        _figures(figures, sender, outcome, bound_s=bound_s, origin=restarted_at, recovery_s=recovery_s, note="turn in flight, 1 slot; delay from restart")
    finally:
        up.cleanup()


def test_a_turn_longer_than_the_ack_clock_runs_once_without_a_crash(tmp_path: Path, figures: Figures) -> None:
    """In-progress signals keep a running turn's delivery from being handed out again."""
    turn_s = LONG_TURN_S
    company = company_yaml(providers=f"[{{kind: echo, delay_s: {turn_s}}}]", max_concurrent=1, coalesce_max_batch=20)
    up = Up(tmp_path, company=company, env={"CREWLET_STREAM_ACK_WAIT_S": str(SHORT_ACK_WAIT_S)})
    try:
        up.start()
        sender = Sender(up)
        started_at = time.time()
        sent = sender.send_new(3)
        assert all(202 in d.statuses for d in sent)
        bound_s = 3 * turn_s + SLACK_S
        outcome = sender.wait_all_ran(timeout_s=bound_s + 30)
        _figures(figures, sender, outcome, bound_s=bound_s, origin=started_at, recovery_s=None, note=f"turns of {turn_s:g}s, ack clock {SHORT_ACK_WAIT_S:g}s")
        assert all(outcome.started.get(d.key) == 1 for d in sent), outcome.started
    finally:
        up.cleanup()
