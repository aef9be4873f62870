"""The completion ledger is written before a turn's first call that can change the world, and what a failure then means.

A turn that failed having only read (``readOnlyHint: true``) is a failed
delivery: NAK'd, redelivered, worked again. One that failed after a write is
abandoned: acked, with ``turn_trigger_skipped`` and its fixed phrase, and the
seat's ``last_error`` says so. Run on a real seat runtime over the memory
twin, with the ledger in the test database.
"""
from __future__ import annotations

from typing import Any, Optional

import pytest
from asgiref.sync import sync_to_async

from crewlet.company.org import CompanyHolder, Organization
from crewlet.events.types import STOP_REFUSAL, STOP_TOOL_USE
from crewlet.events.types.phrases import TRIGGER_ABANDONED, TRIGGER_SKIP_REASONS
from eventstore.projection import LiveProjection
from seats.abandon import abandoned_reason
from seats.delivery_models import LedgerEntry
from seats.provider_base import Completion, ModelRequest, ProviderError
from seats.tools.base import ToolCall
from seats.turn_types import ERR_CRASHED, OUTCOME_COMPLETED, OUTCOME_FAILED, TurnResult
from seats.turns import TurnRunner
from seats_support import Recorder, company, drained, eventually, memory_queues, running, send, wake
from turn_support import NotesToolbox

DB = pytest.mark.django_db(transaction=True, databases=["default", "events"])
BREAK = ProviderError("bad_request", "HTTP 400: the model cannot go on")


class Scripted:
    """One model for the whole company, answering each call with the next step: a tool call, a failure or an answer."""

    key = "scripted"

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.calls = 0

    async def complete(self, request: ModelRequest) -> Completion:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Completion):
            return step
        return Completion(text="", calls=(ToolCall(id=f"c{self.calls}", name=step, arguments={"text": "x"}),), stop_reason=STOP_TOOL_USE)

    async def aclose(self) -> None:
        return None


@sync_to_async
def ledger(seat: str) -> dict[str, str]:
    return dict(LedgerEntry.objects.filter(seat=seat).values_list("trigger", "turn_id"))


class Shown(LiveProjection):
    """The live projection, fed every event published, remembering each ``last_error`` ada's row has shown."""

    def __init__(self, org: Organization) -> None:
        super().__init__(lambda: org)
        self.errors: list[str] = []

    async def project(self, topic: str, event: Any) -> None:
        self.apply(topic, event)
        error = (self.seat("ada") or {}).get("last_error", "")
        if error and error not in self.errors:
            self.errors.append(error)


async def work(model: Scripted, until: Any, org: Optional[Organization] = None) -> tuple[Recorder, NotesToolbox, dict[str, str], Shown]:
    """Wake ada once on a running seat whose model is ``model``; once ``until(rec)`` holds and the mailbox is empty."""
    org = org or company(seats=[{"handle": "ada", "kind": "agent", "role": "engineer"}])
    tools = NotesToolbox()
    live = Shown(org)
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        project = live.project

        q.add_publish_listener(project)
        runner = TurnRunner(q, CompanyHolder(org), provider_factory=lambda _config: model, toolbox=tools)
        async with running(q, org, runner=runner, toolbox=tools):
            await send(q, "ada", wake("ada", "what did I note?", delivery_id="D-1"))
            await eventually(lambda: until(rec), what="the turns ran")
            await drained(q, "ada")
        return rec, tools, await ledger("ada"), live


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_a_turn_that_failed_having_only_read_is_redelivered_and_the_persons_request_worked_again() -> None:
    model = Scripted("notes__read", BREAK, Completion(text="you noted nothing"))
    rec, tools, worked, live = await work(model, lambda rec: any(not e.data.failed for e in rec.of("agent_turn_completed")))
    first, second = rec.of("agent_turn_completed", seat="ada")
    assert (first.data.failed, second.data.failed) == (True, False)
    assert [c.name for _, c in tools.calls] == ["notes__read"] and tools.notes == []
    assert rec.of("turn_trigger_skipped") == []
    assert worked == {"delivery:slack:D-1": second.data.turn_id}  # the read wrote no row: the second turn's is the one
    assert live.errors == ["HTTP 400: the model cannot go on"]  # the failed turn's error, shown until a turn worked
    assert live.seat("ada")["last_error"] == ""  # a turn of it has worked since


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_a_turn_that_failed_after_a_write_is_abandoned_with_its_phrase_and_never_worked_again() -> None:
    model = Scripted("notes__read", "notes__write", BREAK, Completion(text="done"))
    rec, tools, worked, live = await work(model, lambda rec: rec.of("turn_trigger_skipped"))
    [started] = rec.of("agent_turn_started", seat="ada")
    [done] = rec.of("agent_turn_completed", seat="ada")
    assert done.data.failed and model.calls == 3 and tools.notes == ["x"]
    [skip] = rec.of("turn_trigger_skipped", seat="ada")
    assert (skip.data.reason, skip.data.turn_id) == ("wrote outside the engine before breaking", started.data.turn_id)
    assert skip.data.detail.startswith(f"turn {started.data.turn_id} ended llm_unavailable: ")
    assert worked == {"delivery:slack:D-1": started.data.turn_id}  # written before the write ran
    assert live.seat("ada")["last_error"].startswith("wrote outside the engine before breaking: turn ")


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_a_model_that_declines_completes_its_turn_and_its_trigger_is_skipped_as_model_declined() -> None:
    refusal = Completion(text="I will not", stop_reason=STOP_REFUSAL, refusal={"category": "", "explanation": "I will not"})
    rec, _, worked, live = await work(Scripted(refusal), lambda rec: rec.of("turn_trigger_skipped"))
    [done] = rec.of("agent_turn_completed", seat="ada")
    [skip] = rec.of("turn_trigger_skipped", seat="ada")
    assert not done.data.failed and skip.data.reason == "model declined" and skip.data.turn_id == done.data.turn_id
    assert worked == {"delivery:slack:D-1": done.data.turn_id}
    assert live.seat("ada")["last_error"].startswith("model declined: ")


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_max_rounds_of_reads_is_a_guard_breach_the_seat_shows_and_the_delivery_is_worked_again() -> None:
    org = company(seats=[{"handle": "ada", "kind": "agent", "role": "engineer", "max_rounds": 2}])
    model = Scripted("notes__read", "notes__read", Completion(text="nothing noted"))
    rec, _, worked, live = await work(model, lambda rec: any(not e.data.failed for e in rec.of("agent_turn_completed")), org)
    [breach] = rec.of("turn.guard_breach", seat="ada")
    first, second = rec.of("agent_turn_completed", seat="ada")
    assert breach.data.guard == "max_iter" and breach.data.turn_id == first.data.turn_id and first.data.failed
    assert rec.of("agent_turn_stopped") == [] and rec.of("turn_trigger_skipped") == []
    assert worked == {"delivery:slack:D-1": second.data.turn_id}
    assert live.errors == [
        "max_iter: no answer after 2 rounds (the seat's max_rounds)",  # the breach, then the failed turn, say the same
    ] and live.seat("ada")["last_error"] == ""  # cleared once a turn of it worked


def test_the_abandon_phrases_are_the_designs_and_a_crash_after_a_write_is_panicked() -> None:
    assert TRIGGER_SKIP_REASONS == (
        "already worked", "a later turn answered it in its thread", "wrote outside the engine before breaking",
        "panicked", "model declined",
    )
    assert TRIGGER_ABANDONED == TRIGGER_SKIP_REASONS[2:]
    failed = dict(turn_id="t", outcome=OUTCOME_FAILED)
    assert abandoned_reason(TurnResult(**failed, error_kind=ERR_CRASHED, wrote=True)) == "panicked"
    assert abandoned_reason(TurnResult(**failed, error_kind="llm_unavailable", wrote=True)) == "wrote outside the engine before breaking"
    assert abandoned_reason(TurnResult(**failed, error_kind=ERR_CRASHED, wrote=False)) == ""
    assert abandoned_reason(TurnResult(turn_id="t", outcome=OUTCOME_COMPLETED, wrote=True)) == ""
