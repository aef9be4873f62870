"""The guards a running turn is held to (``seats.guards``): a stall and a scheduled task's timeout, each a guard breach.

The turns run the real runner on the in-memory twin with the scripted echo
model and an in-test toolbox; the bounds are shrunk to fractions of a second
through the runner's ``stall_s`` and the schedule's ``timeout_s``.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from crewlet import events
from crewlet.company.fields import CompanyError
from crewlet.company.org import SCHEDULE_TIMEOUT_S, CompanyHolder, Organization
from crewlet.events.tracing import Trace
from crewlet.events.types import TaskAssigned
from seats.turn_types import Trigger, TurnResult
from seats.turns import TurnRunner
from seats_support import Recorder, company, memory_queues, wake
from turn_support import NotesToolbox

SEATS = [{"handle": "ada", "kind": "agent", "role": "engineer", "tools": ["a2a_ask"]}, {"handle": "grace", "kind": "human", "role": "lead"}]
READ = {"calls": [{"tool": "notes__read", "arguments": {}}]}


def org_with(*script: dict[str, Any], schedules: Any = None, **echo: Any) -> Organization:
    return company(providers=[{"kind": "echo", "script": list(script), **echo}], seats=SEATS, schedules=schedules)


async def run(org: Organization, trigger: Trigger, *, stall_s: float, tools: Any = None) -> tuple[TurnResult, Recorder]:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        seat = org.seat_by_handle("ada")
        assert seat is not None
        result = await TurnRunner(q, CompanyHolder(org), toolbox=tools, stall_s=stall_s).run(seat, trigger)
    return result, rec


def task_from(schedule: str) -> Trigger:
    ev = events.new(TaskAssigned(seat="ada", schedule_id=schedule, title="sweep", instructions="sweep", assigned_by="scheduler"), Trace.root())
    return Trigger(events=[ev])


async def test_a_tool_call_that_never_returns_is_a_stall_guard_breach_and_a_failed_turn() -> None:
    tools = NotesToolbox(hold=asyncio.Event())  # never set: the call hangs
    result, rec = await run(org_with(READ), Trigger(events=[wake("ada", "what do the notes say?")]), stall_s=0.2, tools=tools)

    assert (result.outcome, result.guard, result.error_kind) == ("failed", "stall", "stall")
    assert result.error == "stall: no provider answer or tool result for 0.2s (node.turn_stall_s)"
    assert tools.running is not None and tools.running.cancelled()  # the call in flight was cut
    [breach] = rec.of("turn.guard_breach")
    assert (breach.data.guard, breach.data.detail) == ("stall", "no provider answer or tool result for 0.2s (node.turn_stall_s)")
    [done] = rec.of("agent_turn_completed")
    assert done.data.failed and done.data.error.startswith("stall: ") and not rec.of("agent_turn_stopped")
    assert rec.types().index("turn.guard_breach") < rec.types().index("agent_turn_completed")
    [phase] = rec.of("agent_phase_completed")
    assert phase.data.failed and phase.data.error_kind == "stall"


async def test_a_turn_that_keeps_answering_outlives_its_stall_bound_because_every_round_is_progress() -> None:
    # Eight rounds of 0.15 s each: the turn runs past 1 s, no round comes near it.
    org = org_with(*[READ] * 7, {"answer": "nothing yet"}, delay_s=0.15)
    result, rec = await run(org, Trigger(events=[wake("ada", "read the notes")]), stall_s=1.0, tools=NotesToolbox())
    assert result.ok and result.response == "nothing yet" and len(result.rounds) == 8
    assert result.duration_ms >= 1000 and rec.of("turn.guard_breach") == []


async def test_a_scheduled_tasks_turn_past_its_schedules_timeout_is_a_scheduled_timeout_guard_breach() -> None:
    org = org_with(READ, delay_s=30, schedules=[{"name": "sweep", "seat": "ada", "every": "15m", "task": "sweep"}])
    org = dataclasses.replace(org, schedules=tuple(dataclasses.replace(s, timeout_s=0.2) for s in org.schedules))
    result, rec = await run(org, task_from("sweep"), stall_s=60.0, tools=NotesToolbox())

    assert (result.outcome, result.guard) == ("failed", "scheduled_timeout")
    assert result.error == "scheduled_timeout: the scheduled task sweep ran past its timeout of 0.2s"
    [breach] = rec.of("turn.guard_breach")
    assert breach.data.guard == "scheduled_timeout" and breach.data.turn_id == result.turn_id


async def test_a_task_no_schedule_of_the_company_names_has_no_timeout_and_other_work_only_the_stall_bound() -> None:
    org = org_with({"answer": "done"}, delay_s=0.3, schedules=[{"name": "sweep", "seat": "ada", "every": "15m", "task": "sweep"}])
    org = dataclasses.replace(org, schedules=tuple(dataclasses.replace(s, timeout_s=0.1) for s in org.schedules))
    for trigger in (task_from("a-removed-schedule"), Trigger(events=[wake("ada", "hello")])):
        result, rec = await run(org, trigger, stall_s=60.0)
        assert result.ok and result.response == "done" and rec.of("turn.guard_breach") == []


def test_a_schedules_timeout_is_a_duration_from_one_second_to_a_day_and_defaults_to_half_an_hour() -> None:
    base = {"name": "sweep", "seat": "ada", "every": "15m", "task": "sweep"}
    assert company(schedules=[base]).schedules[0].timeout_s == SCHEDULE_TIMEOUT_S == 1800.0
    assert company(schedules=[{**base, "timeout": "90s"}]).schedules[0].timeout_s == 90.0
    with pytest.raises(CompanyError) as refused:
        company(schedules=[{**base, "timeout": "2d"}])
    assert str(refused.value) == "schedules[0].timeout='2d': must be a duration like 90s, 15m, 24h or 7d, between 1s and 1d"
