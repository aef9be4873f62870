"""The events a coding run publishes, and the wake each one is when its seat is told.

A run's start, question and ending travel on the seat's control subject
(``crewlet.agent.{handle}.control``), which is consumed even while the run
holds the seat's inbox. Each carries, in its free-form payload, the
launching wake's routing values — partition key, conversation identity,
message id, source — so the turn it wakes answers where the run was asked
(:mod:`seats.reply_target` reads them like any wake's), and a ``body`` the
turn reads as its prompt.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from crewlet.events import Event, new
from crewlet.events.tracing import trace_of
from crewlet.events.types import (
    SandboxClarificationRequested,
    SandboxRunAnswered,
    SandboxRunCompleted,
    SandboxRunFailed,
    SandboxRunStarted,
)
from seats.sandbox.runs import OUTCOME_FAILED, Run
from seats.turn_types import Trigger
from seats.wake import BODY, CONVERSATION_IDENTITY, EVENT_NAME, MESSAGE_ID, PARTITION_KEY, Wake

#: The start's payload key: which attempt of the run it starts.
K_ATTEMPT = "attempt"
#: Keys of a run's ``launch`` (its row), besides the wake keys it copies.
K_SOURCE = "source"
#: The wake keys a run copies from the wake that launched it.
ROUTING_KEYS = (PARTITION_KEY, CONVERSATION_IDENTITY, MESSAGE_ID, EVENT_NAME)
#: The run's output a wake quotes, at most (the row keeps what the job's tail held).
QUOTED_OUTPUT_CHARS = 3000


def launch_of(trigger: Trigger) -> dict[str, Any]:
    """Where the turn launching a run was asked: its partition and its latest wake's routing values."""
    wake = Wake(trigger.events[-1])
    return {
        PARTITION_KEY: trigger.partition_key or wake.partition_key,
        CONVERSATION_IDENTITY: wake.conversation_identity or trigger.conversation_key,
        MESSAGE_ID: wake.message_id,
        EVENT_NAME: wake.event_name,
        K_SOURCE: trigger.events[-1].source,
    }


def _routing(run: Run, body: str = "") -> dict[str, Any]:
    extras = {key: run.launch[key] for key in ROUTING_KEYS if run.launch.get(key)}
    if body:
        extras[BODY] = body
    return extras


def _tags(run: Run) -> dict[str, Any]:
    return {"seat": run.seat, "run_id": run.run_id, "work_key": run.work_key, "turn_id": run.turn_id,
            "conversation_key": run.work_key}


def started(run: Run) -> Event:
    """The start of ``run``'s current attempt: the node consuming the seat's control subject starts its job."""
    extras = {**_routing(run), K_ATTEMPT: run.attempt}
    return new(SandboxRunStarted(**_tags(run), task=run.task), trace_of(), source=run.launch.get(K_SOURCE, ""), extras=extras)


def asked(run: Run, question: str) -> Event:
    """The run's question, as the wake of the turn that puts it to the person where the run was asked."""
    body = (
        f"Your coding run {run.run_id} stopped to ask: {question}\n"
        "Ask the person who gave you the task, where they asked (the reply target below). "
        "Their next reply there is handed to the run; you need not wait for it."
    )
    return new(
        SandboxClarificationRequested(**_tags(run), question=question, asked_in=run.work_key),
        trace_of(), source=run.launch.get(K_SOURCE, ""), extras=_routing(run, body),
    )


def ending(run: Run) -> Event:
    """The run's ending, under the id and instant recorded on its row: whoever publishes it publishes the same event."""
    result = run.result or {}
    output = str(result.get("output", ""))[-QUOTED_OUTPUT_CHARS:]
    body: Any
    if run.outcome == OUTCOME_FAILED:
        error = str(result.get("error", ""))
        text = f"Your coding run {run.run_id} failed: {error}"
        body = SandboxRunFailed(**_tags(run), error=error, ended_at=_iso(run.ended_at))
    else:
        code = result.get("exit_code")
        text = f"Your coding run {run.run_id} finished ({run.outcome}, exit code {code})."
        if output:
            text += f" Its output ends with:\n{output}"
        text += "\nTell the person who gave you the task what came of it, where they asked."
        body = SandboxRunCompleted(
            **_tags(run), outcome=run.outcome, result=output, duration_seconds=float(result.get("duration_s", 0.0))
        )
    return new(
        body, trace_of(), source=run.launch.get(K_SOURCE, ""), extras=_routing(run, text),
        event_id=run.ending_id, timestamp=run.ended_at,
    )


def answer_outcome(run: Run, outcome: str, route: str, answered_by: str, answered_by_seat: str = "") -> Any:
    """What a reply to the run's question became (``sandbox_run_answered``)."""
    return SandboxRunAnswered(
        **_tags(run), outcome=outcome, route=route, answered_by=answered_by, answered_by_seat=answered_by_seat
    )


def _iso(at: Optional[datetime]) -> str:
    return at.isoformat() if at is not None else ""


__all__ = ["K_ATTEMPT", "QUOTED_OUTPUT_CHARS", "ROUTING_KEYS", "answer_outcome", "asked", "ending", "launch_of", "started"]
