"""PostgreSQL restarted under load: `up` on its own private server loses and doubles nothing.

The server is this test's own (initdb + pg_ctl from the installed PostgreSQL,
its own port and socket directory in a temporary directory), so restarting it
disturbs no other test run on the machine's shared cluster.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Figures
from tests.faults.fault_postgres import PrivatePostgres
from tests.faults.fault_support import Sender, Up, company_yaml, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.postgres]

TURN_S = 0.3
BOUND_S = 45.0


def test_postgres_restarted_under_load_loses_and_doubles_no_accepted_delivery(
    tmp_path: Path, figures: Figures, postgres: PrivatePostgres
) -> None:
    company = company_yaml(providers=f"[{{kind: echo, delay_s: {TURN_S}}}]", max_concurrent=2)
    up = Up(tmp_path, company=company, env=postgres.env())
    try:
        up.start()
        sender = Sender(up)
        thread = threading.Thread(target=sender.send_new, args=(30,), kwargs={"retries": 120}, daemon=True)
        thread.start()
        wait_until(lambda: len(sender.accepted) >= 10, timeout_s=60, what="10 deliveries accepted before the restart")
        began = time.monotonic()
        postgres.restart()
        wait_until(lambda: up.api("/api/events", {"limit": 1}), timeout_s=60, what="the API reads the store again")
        recovery_s = time.monotonic() - began
        thread.join(timeout=240)
        assert not thread.is_alive()
        outcome = sender.wait_all_ran(timeout_s=BOUND_S + 30)
        accepted = sender.accepted
        lost = [d.key for d in accepted if outcome.runs(d.key) == 0]
        doubled = [d.key for d in accepted if outcome.runs(d.key) > 1]
        delays = [outcome.finished_at[d.key] - (d.accepted_at or 0.0) for d in accepted if d.key in outcome.finished_at]
        figures.record(
            sent=len(sender.deliveries), accepted=len(accepted), lost=len(lost), duplicated=len(doubled),
            delayed=sum(1 for x in delays if x > BOUND_S), max_delay_s=max(delays, default=0.0),
            recovery_s=recovery_s, bound_s=BOUND_S, note="private PostgreSQL, pg_ctl restart -m fast; delay from acceptance",
        )
        assert len(accepted) == len(sender.deliveries), [d.statuses for d in sender.deliveries if 202 not in d.statuses]
        assert not lost and not doubled, (lost, doubled)
    finally:
        up.cleanup()
