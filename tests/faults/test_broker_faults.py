"""The embedded broker killed or frozen under `up`: deliveries are refused with 503 or accepted, never lost or doubled.

What the code does when its nats-server child dies (the choice
docs/RELIABILITY.md documents): ``up`` keeps running and its supervisor
restarts the child on the same port, credential and file store; the queue
client reconnects and the mail the store kept is delivered. A frozen broker
(SIGSTOP) makes a publish time out, so the edge answers 503 and the sender
retries; once it resumes, everything flows again.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from tests.faults.conftest import Figures
from tests.faults.fault_support import Outcome, Sender, Up, company_yaml, record_exactly_once, wait_until
from tests.process_support import is_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ACK_WAIT_S = 5.0  # the least stream.ack_wait_s allows
TURN_S = 0.5
#: The freeze: longer than a publish's 5 s deadline (so a delivery during it meets
#: a timed-out publish), shorter than the client's stale-connection detection.
FREEZE_S = 10.0
#: After a broker kill, every accepted delivery has run within this of its acceptance.
BOUND_S = 45.0
#: After a freeze, every accepted delivery has run within this of its acceptance: the
#: freeze itself, then the backlog; the connection answers again as soon as the broker does.
FROZEN_BOUND_S = FREEZE_S + 20.0


def _record(
    figures: Figures, sender: Sender, outcome: Outcome, *, origin: float, recovery_s: float, note: str, bound_s: float = BOUND_S
) -> None:
    statuses = sorted({str(s) for d in sender.deliveries for s in d.statuses})
    delays = record_exactly_once(
        figures, sender, outcome, origin=origin, recovery_s=recovery_s, bound_s=bound_s, note=note, statuses=statuses
    )
    assert all(x <= bound_s for x in delays), f"ran later than {bound_s:g} s after acceptance: {sorted(delays)[-3:]}"
    assert len(sender.accepted) == len(sender.deliveries), [d.statuses for d in sender.deliveries if 202 not in d.statuses]


def _send_in_background(sender: Sender, count: int) -> threading.Thread:
    thread = threading.Thread(target=sender.send_new, args=(count,), kwargs={"retries": 120}, daemon=True)
    thread.start()
    return thread


def test_kill_9_of_the_broker_is_survived_by_up_which_restarts_it_on_the_same_store(tmp_path: Path, figures: Figures) -> None:
    company = company_yaml(providers=f"[{{kind: echo, delay_s: {TURN_S}}}]", max_concurrent=2)
    up = Up(tmp_path, company=company, env={"CREWLET_STREAM_ACK_WAIT_S": str(ACK_WAIT_S)})
    try:
        up.start()
        sender = Sender(up)
        thread = _send_in_background(sender, 30)
        wait_until(lambda: len(sender.accepted) >= 10, timeout_s=60, what="10 deliveries accepted before the kill")
        old = up.broker_pid
        killed_at = time.monotonic()
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: not is_running(old), timeout_s=10, what="the broker died")
        wait_until(lambda: up.healthz()[0] == 200 and up.broker_pid != old, timeout_s=60, what="healthz ok on a new broker")
        recovery_s = time.monotonic() - killed_at
        assert up.proc is not None and up.proc.poll() is None, "up must outlive its broker"
        thread.join(timeout=240)
        assert not thread.is_alive()
        outcome = sender.wait_all_ran(timeout_s=BOUND_S + 30)
        assert "embedded_broker_restarted" in up.log_text()
        _record(figures, sender, outcome, origin=0.0, recovery_s=recovery_s, note="up restarts its broker; delay from acceptance")
    finally:
        up.cleanup()


def test_a_broker_frozen_under_load_gets_503s_or_acceptances_and_nothing_is_lost_once_it_resumes(
    tmp_path: Path, figures: Figures
) -> None:
    company = company_yaml(providers=f"[{{kind: echo, delay_s: {TURN_S}}}]", max_concurrent=2)
    up = Up(tmp_path, company=company, env={"CREWLET_STREAM_ACK_WAIT_S": str(ACK_WAIT_S)})
    frozen = 0
    try:
        up.start()
        sender = Sender(up)
        before = sender.send_new(5)
        assert all(202 in d.statuses for d in before)
        frozen = up.broker_pid
        os.kill(frozen, signal.SIGSTOP)
        stopped_at = time.monotonic()
        thread = _send_in_background(sender, 10)
        try:
            wait_until(lambda: up.healthz()[0] == 503, timeout_s=FREEZE_S - 1, what="healthz says 503 during the freeze")
            health_seen_s: Optional[float] = time.monotonic() - stopped_at
        except AssertionError:
            health_seen_s = None
        wait_until(lambda: time.monotonic() - stopped_at >= FREEZE_S, timeout_s=FREEZE_S + 5, what="the freeze lasts its length")
        os.kill(frozen, signal.SIGCONT)
        resumed_at = time.monotonic()
        frozen = 0
        thread.join(timeout=240)
        assert not thread.is_alive()
        wait_until(lambda: up.healthz()[0] == 200, timeout_s=60, what="healthz ok after the resume")
        recovery_s = time.monotonic() - resumed_at
        outcome = sender.wait_all_ran(timeout_s=FROZEN_BOUND_S + 30)
        statuses = {s for d in sender.deliveries for s in d.statuses}
        assert statuses <= {202, 503}, f"a frozen broker must mean 503 (retry) or 202, nothing else: {statuses}"
        _record(
            figures, sender, outcome, origin=0.0, recovery_s=recovery_s, bound_s=FROZEN_BOUND_S,
            note=f"frozen {FREEZE_S:g}s; healthz 503 after {health_seen_s if health_seen_s is None else round(health_seen_s, 1)} s; delay from acceptance",
        )
        assert health_seen_s is not None, "/healthz said the broker was fine all through a freeze"
    finally:
        if frozen:
            os.kill(frozen, signal.SIGCONT)
        up.cleanup()
