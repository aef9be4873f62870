"""What a coding run's next holder does with a reply its last node recorded but never gave the job.

The seat runtime on the in-memory twin, its jobs in a real bubblewrap
sandbox. A run's row is written as a node leaves it when it stopped after
recording a person's reply and before its job took it (``answered``, the
reply on the row). The seat's next holder starts the run again and gives
the job that reply when it asks again; with the run's attempts spent, the
run fails as lost and the reply goes back to the seat's inbox through the
row's outbox, worked as the ordinary message it is.
"""
from __future__ import annotations

import contextlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from crewlet.base.db import in_store
from crewlet.company.org import CompanyHolder
from crewlet.company.parse import parse_company
from seats.ledger import record
from seats.runtime import SeatRuntime
from seats.sandbox import runs
from seats.sandbox.answers import K_HANDED_BACK_FROM
from seats.sandbox.coordinator import LOST
from seats_support import Recorder, memory_queues, wake
from waiting_support import eventually

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

ASKS = 'echo "CREWLET-QUESTION: which branch?"\nread branch\necho "building on $branch"\n'
CONVERSATION = "slack:D0ADA:1718000000.000001"


def org(tmp: Path, max_attempts: int) -> CompanyHolder:
    (tmp / "job.sh").write_text(ASKS)
    return CompanyHolder(parse_company({
        "org": "acme",
        "providers": {"llm": [{"kind": "echo"}]},
        "sandbox": {"command": ["/bin/sh", str(tmp / "job.sh")], "read_only_paths": [str(tmp)], "max_attempts": max_attempts},
        "seats": [{"handle": "ada", "kind": "agent", "tools": ["sandbox_run"]}],
    }))


async def answered_run(attempt: int) -> dict[str, Any]:
    """A run its node left answered: the reply recorded on the row, no job of it anywhere."""
    reply = wake("ada", "use main", conversation=CONVERSATION, sender="grace")
    answer = {"text": "use main", "route": "chat", "answered_by": "grace", "answered_by_seat": "", "event": reply.to_dict()}
    await in_store(runs.open_run)(
        run_id="run-00000000000000a1", seat="ada", task="build", work_key=CONVERSATION, launch={}, turn_id="t-1", node="gone",
    )
    await in_store(lambda: runs.SandboxRun.objects.filter(run_id="run-00000000000000a1").update(
        status=runs.ANSWERED, answer=answer, attempt=attempt,
    ))()
    return answer


@contextlib.asynccontextmanager
async def running(holder: CompanyHolder, tmp: Path) -> AsyncIterator[tuple[SeatRuntime, Recorder]]:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runtime = SeatRuntime(q, holder, run_scheduler=False, sandbox_dir=tmp / "runs")
        await runtime.start()
        try:
            yield runtime, rec
        finally:
            await runtime.stop()


async def test_the_next_holder_starts_the_run_again_and_gives_its_job_the_reply_its_last_node_recorded(tmp_path: Path) -> None:
    await answered_run(attempt=1)
    async with running(org(tmp_path, max_attempts=2), tmp_path) as (runtime, rec):
        await eventually(lambda: rec.of("sandbox_run_completed"), 30, "the run completed")
        await eventually(lambda: runtime.sandbox.runs.get("ada") == {}, 30, "the run settled")
        row = await in_store(runs.get)("run-00000000000000a1")

    [answered] = once(rec, "sandbox_run_answered")
    [completed] = once(rec, "sandbox_run_completed")  # on the control subject and on its event topic: one event
    assert (answered.data.outcome, answered.data.route, answered.data.answered_by) == ("resumed", "chat", "grace")
    assert "building on use main" in completed.data.result and completed.data.outcome == "succeeded"
    assert row is not None and (row.attempt, row.status, row.woken_at is not None, row.outbox) == (2, "ended", True, None)
    assert [e.payload["attempt"] for e in once(rec, "sandbox_run_started")] == [2]


async def test_with_its_attempts_spent_the_run_fails_as_lost_and_the_reply_goes_back_to_the_inbox_as_ordinary_mail(
    tmp_path: Path,
) -> None:
    await answered_run(attempt=1)
    async with running(org(tmp_path, max_attempts=1), tmp_path) as (_, rec):
        await eventually(lambda: any("grace: use main" in p for p in prompts(rec)), 30, "the reply worked as a message")
        row = await in_store(runs.get)("run-00000000000000a1")

    [failed] = once(rec, "sandbox_run_failed")
    assert failed.data.error == LOST.format(attempts=1)
    assert row is not None and (row.status, row.outbox, failed.id) == ("ended", None, row.ending_id)
    assert any("failed: lost with its node" in p for p in prompts(rec))  # the seat was told, in a turn of its own
    inbox = [e for topic, e in rec.seen if topic == "crewlet.agent.ada.inbox"]
    assert [e.payload.get(K_HANDED_BACK_FROM) for e in inbox] == ["run-00000000000000a1"]


def once(rec: Recorder, etype: str) -> list[Any]:
    """The events of ``etype`` published, each once (a run's events go out on two subjects under one id)."""
    return list({e.id: e for e in rec.of(etype)}.values())


def prompts(rec: Recorder) -> list[str]:
    return [p.data.user_prompt for p in rec.of("agent_phase_completed")]


async def test_an_ending_whose_turn_wrote_before_its_node_stopped_is_settled_by_the_next_holder_without_a_second_turn(
    tmp_path: Path,
) -> None:
    await answered_run(attempt=1)
    ended = await in_store(runs.ended)("run-00000000000000a1", runs.OUTCOME_SUCCEEDED, {"exit_code": 0}, datetime.now(timezone.utc))
    await in_store(record)("ada", "turn-on-the-dead-node", [(f"event:{ended.ending_id}", ended.ending_id)])
    async with running(org(tmp_path, max_attempts=2), tmp_path) as (runtime, rec):
        await eventually(lambda: runtime.sandbox.runs.get("ada") == {}, 30, "the run settled")
        await eventually(lambda: rec.of("agent_turn_completed"), 30, "the handed-back reply's turn")
        row = await in_store(runs.get)("run-00000000000000a1")

    assert row is not None and row.woken_at is not None and row.outbox is None
    # Its turn had written: it is not run again; the one turn is the reply's, handed back as mail.
    assert [t.data.trigger_type for t in rec.of("agent_turn_started")] == ["external_notification"]
    inbox = [e for topic, e in rec.seen if topic == "crewlet.agent.ada.inbox"]
    assert [e.payload.get(K_HANDED_BACK_FROM) for e in inbox] == ["run-00000000000000a1"]  # the untaken reply, as mail
