"""A redelivered trigger the completion ledger already holds: acked without a turn, and said so.

``turn_trigger_skipped`` names the turn that worked it and why it is not
worked again (:func:`seats.ledger.skip_words`): that turn was woken by it
(``already worked``), or a later turn was shown it waiting in its thread
block and answered it there (``a later turn answered it in its thread``).
The event is published under the skipped event's own trace, so the skip is
found beside the delivery it drops.
"""
from __future__ import annotations

import logging
from typing import Awaitable, Callable, Mapping

from crewlet.company.org import Seat
from crewlet.events import Event
from crewlet.events.tracing import child_span
from crewlet.events.types import TurnTriggerSkipped
from seats.ledger import skip_words
from seats.wake import Wake

log = logging.getLogger("crewlet.seats.inbox")


async def skip_worked(emit: Callable[[object], Awaitable[None]], seat: Seat, ev: Event, identity: str, done: Mapping[str, str]) -> None:
    """Say that ``ev`` (``identity``, which ``done`` holds) is acked without a turn, and which turn worked it."""
    reason, detail = skip_words(done, identity)
    worked_by = done[identity]
    with child_span(ev, "seat.trigger_skipped", attributes={"crewlet.seat": seat.handle}):
        await emit(
            TurnTriggerSkipped(
                **seat.labels(),
                trigger_event_id=ev.id,
                turn_id=worked_by,
                conversation_key=Wake(ev).conversation_identity,
                reason=reason,
                detail=detail,
            )
        )
    log.info(
        "turn_trigger_skipped",
        extra={"seat": seat.handle, "event_id": ev.id, "trigger": identity, "worked_by": worked_by, "reason": reason},
    )


__all__ = ["skip_worked"]
