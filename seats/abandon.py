"""Triggers whose turn is abandoned rather than worked again: why, and the ``turn_trigger_skipped`` that says so.

A failed turn is normally a failed delivery — NAK'd, redelivered, worked
again — and that is only safe while nothing it did can be seen outside the
engine. Once a turn ran a call that can change the world its triggers are in
the completion ledger (written just before that call), and running it again
could post a second reply or file a second ticket. So such a turn is
ABANDONED: its delivery is acknowledged and each trigger it covered gets a
``turn_trigger_skipped`` with one of the fixed phrases (design: the event list,
``turn_trigger_skipped``), which the live projection makes the seat's
``last_error``:

* ``wrote outside the engine before breaking`` — it failed after a write
  (the chain gave out, a guard fired, the ledger or a provider broke);
* ``panicked`` — it crashed after a write;
* ``model declined`` — its model refused the work (the turn completed with
  what the model said; the person's request was not done, and retrying the
  same request would be refused the same way).

A turn that failed having only read is none of these: :func:`abandoned_reason`
answers "" and the inbox NAKs it as before.
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Sequence

from crewlet.company.org import Seat
from crewlet.events import Event
from crewlet.events.tracing import child_span
from crewlet.events.types import STOP_REFUSAL, TurnTriggerSkipped
from crewlet.events.types.phrases import TRIGGER_MODEL_DECLINED, TRIGGER_PANICKED, TRIGGER_WROTE_BEFORE_BREAKING
from seats.turn_types import ERR_CRASHED, OUTCOME_COMPLETED, OUTCOME_FAILED, TurnResult
from seats.wake import Wake

log = logging.getLogger("crewlet.seats.inbox")

#: How much of the turn's error a skip's ``detail`` carries.
DETAIL_CHARS = 1000


def abandoned_reason(result: TurnResult) -> str:
    """The phrase a turn's triggers are abandoned with, or "" when they are worked again (or were simply worked)."""
    if result.outcome == OUTCOME_COMPLETED and result.error_kind == STOP_REFUSAL:
        return TRIGGER_MODEL_DECLINED
    if result.outcome != OUTCOME_FAILED or not result.wrote:
        return ""
    return TRIGGER_PANICKED if result.error_kind == ERR_CRASHED else TRIGGER_WROTE_BEFORE_BREAKING


async def abandon(
    emit: Callable[[Any], Awaitable[None]], seat: Seat, covered: Sequence[Event], result: TurnResult, reason: str
) -> None:
    """One ``turn_trigger_skipped`` per trigger ``result``'s turn covered, under each trigger's own trace."""
    said = f"{result.error_kind}: {result.error}" if result.error else result.error_kind
    detail = f"turn {result.turn_id} ended {said}"[:DETAIL_CHARS] if said else f"turn {result.turn_id}"
    for ev in covered:
        with child_span(ev, "seat.trigger_abandoned", attributes={"crewlet.seat": seat.handle}):
            await emit(
                TurnTriggerSkipped(
                    **seat.labels(),
                    trigger_event_id=ev.id,
                    turn_id=result.turn_id,
                    conversation_key=Wake(ev).conversation_identity,
                    reason=reason,
                    detail=detail,
                )
            )
    log.warning(
        "turn_trigger_abandoned",
        extra={
            "seat": seat.handle, "turn_id": result.turn_id, "reason": reason, "events": len(covered),
            "error_kind": result.error_kind,
        },
    )


__all__ = ["abandon", "abandoned_reason"]
