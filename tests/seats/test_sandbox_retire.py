"""A removed seat's coding runs are ended before its mailboxes are deleted, 24 hours after it left the company."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from crewlet.base.db import in_store
from crewlet.queue import topics
from seats.mailboxes import ensure_control_mailbox
from seats.runtime import SeatRuntime
from seats.sandbox import runs
from seats.sandbox.coordinator import RETIRED
from seats_support import Recorder, company, holder, memory_queues

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

T0 = datetime(2025, 6, 2, 9, 0, tzinfo=timezone.utc)
ADA_ONLY = [{"handle": "ada", "kind": "agent"}, {"handle": "grace", "kind": "human"}]  # linus removed


async def test_a_removed_seats_runs_are_failed_once_its_day_is_up_and_its_control_mailbox_goes_with_its_inbox() -> None:
    now = [T0.timestamp()]
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runtime = SeatRuntime(q, holder(), run_scheduler=False, clock=lambda: now[0], absent_after_s=86400)
        await runtime.start()
        try:
            await ensure_control_mailbox(q, "linus")
            await in_store(runs.open_run)(
                run_id="run-linus1", seat="linus", task="port the tests", work_key="slack:D0LIN:1.0", launch={},
                turn_id="t-1", node="elsewhere",
            )
            await runtime.apply(company(seats=ADA_ONLY))
            now[0] += 86400 - 1
            assert (await runtime.sweep()).retired == []
            assert (await in_store(runs.get)("run-linus1")).status == runs.RUNNING  # type: ignore[union-attr]
            now[0] += 1
            report = await runtime.sweep()
            run = await in_store(runs.get)("run-linus1")
            remaining = set(await q.list_subscriptions(topics.agent_pattern("linus")))
        finally:
            await runtime.stop()

    assert report.retired == ["linus"] and remaining == set()
    assert run is not None and (run.status, run.outcome, run.result["error"], run.holds) == ("ended", "failed", RETIRED, False)
    [failed] = rec.of("sandbox_run_failed")
    assert (failed.data.run_id, failed.data.error, failed.id) == ("run-linus1", RETIRED, run.ending_id)
