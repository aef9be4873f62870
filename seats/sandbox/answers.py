"""Answers to a parked run's question: each delivery to the seat is offered to it first, and the operator route.

**The chat route.** A run that asked holds nothing, so the seat's mail runs
as usual — each delivery first offered here (:func:`offer`). The first reply
after the question, from the conversation the run was launched from and not
the seat's own, is the answer: recorded on the run's row (the run holds the
seat again from that moment), acked, and handed to the job
(:func:`resume`). The rest of that delivery then waits behind the run: it is
handed back at the head. The reply goes to the completion ledger as the
run's in the same transaction as the row, so its original, should it come
round again on any node, is dropped by the ledger (and offered to no run). A reply the store could
not record is handed back at the head too, keeping its place ahead of the
person's next message — but only while it has more than
:data:`~seats.park.PARK_HEADROOM` deliveries left; from there on it is not
offered to the run at all and is worked as the ordinary message it is.

**The resume** is the coordinator's: the reply goes to the job on its
stdin; a job that is gone (its node stopped while the run waited) is
started again at its next attempt and given the recorded reply when it asks
again. A reply no job took when the run ends goes back to the seat's inbox
through the row's outbox (:func:`handed_back`), as a new message carrying
the original's values.

**The operator route** (``POST /api/sandbox/runs/{run_id}/answer``) travels
as a ``sandbox_answer_given`` inbox wake: never a turn, always acked, its
outcome recorded as ``sandbox_run_answered`` — resumed, ``not_awaiting``
(the run asked nothing), ``gone`` (no such run, or it ended) or
``declined`` (the job was gone when the answer reached it).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from django.db import DatabaseError

from crewlet.base.db import in_store
from crewlet.company.org import Seat
from crewlet.events import Event
from crewlet.events.types import (
    ANSWER_DECLINED,
    ANSWER_GONE,
    ANSWER_NOT_AWAITING,
    ANSWER_RESUMED,
    ROUTE_CHAT,
    ROUTE_OPERATOR,
    SandboxAnswerGiven,
)
from crewlet.queue.contract import Partition
from seats.ledger import IDENTITY_KEYS, trigger_identity
from seats.park import PARK_HEADROOM
from seats.sandbox import runs, wakes
from seats.sandbox.runs import Run
from seats.wake import Wake

if TYPE_CHECKING:  # pragma: no cover
    from seats.sandbox.coordinator import SandboxCoordinator

log = logging.getLogger("crewlet.seats.sandbox")

#: Keys of the reply recorded on a run's row (``answer``).
K_EVENT = "event"
K_TEXT = "text"
K_ANSWERED_BY = "answered_by"
K_ANSWERED_BY_SEAT = "answered_by_seat"
K_ROUTE = "route"
#: The payload key a reply handed back to the inbox carries: the run it left.
K_HANDED_BACK_FROM = "handed_back_from"
#: The namespace of a handed-back reply's id (:func:`handed_back`).
HANDED_BACK_NAMESPACE = uuid.UUID("0b3c5a52-7f0e-4d55-9a51-3b1d2d8e6c11")
#: Why a delivery was handed back (the inbox's ``seat_delivery_deferred`` line).
WHY_STORE = "sandbox_answer_unrecorded"
WHY_HELD = "sandbox_resumed"


@dataclass(frozen=True)
class Offer:
    """What the runs made of a delivery: the events they consumed, and whether the delivery goes back at the head."""

    consumed: frozenset[str] = frozenset()
    defer: bool = False
    why: str = ""


def matches(run: Run, event: Event, seat: Seat) -> bool:
    """Whether ``event`` answers ``run``'s question: a message of its conversation after the question, not the seat's own."""
    wake = Wake(event)
    if not run.work_key or wake.conversation_identity != run.work_key or not wake.body:
        return False
    if run.asked_at is None or event.timestamp <= run.asked_at:
        return False
    return not (wake.sender_id and wake.sender_id in seat.identities.values())


def _answer(text: str, route: str, by: str, by_seat: str = "", event: Optional[Event] = None) -> dict[str, Any]:
    return {K_TEXT: text, K_ROUTE: route, K_ANSWERED_BY: by, K_ANSWERED_BY_SEAT: by_seat,
            K_EVENT: event.to_dict() if event is not None else None}


async def offer(coordinator: "SandboxCoordinator", seat: Seat, partition: Partition) -> Offer:
    """Offer each delivery of ``partition`` to the seat's parked runs before it becomes a turn (see the module docstring)."""
    handle = seat.handle
    parked = coordinator.parked(handle)
    operator = any(isinstance(d.event.data, SandboxAnswerGiven) for d in partition.deliveries)
    if not (parked or operator):
        return Offer()
    consumed: set[str] = set()
    took = False
    for delivery in partition.deliveries:
        event = delivery.event
        try:
            if isinstance(event.data, SandboxAnswerGiven):
                consumed.add(event.id)
                await operator_answer(coordinator, handle, event)
                continue
            run = next((r for r in parked if matches(r, event, seat)), None)
            if run is None:
                continue
            if delivery.remaining <= PARK_HEADROOM:
                log.info("sandbox_reply_not_offered", extra={"seat": handle, "run_id": run.run_id, "remaining": delivery.remaining})
                continue
            wake = Wake(event)
            answer = _answer(wake.body, ROUTE_CHAT, wake.sender or wake.sender_id, event=event)
            if not await in_store(runs.answered)(run.run_id, answer, event.id, trigger_identity(event)):
                continue  # the run is not parked any more, or this reply is one a run took already
        except DatabaseError as exc:
            log.warning("sandbox_answer_store_failed", extra={"seat": handle, "event_id": event.id, "error": type(exc).__name__})
            return Offer(consumed=frozenset(consumed), defer=True, why=WHY_STORE)
        run.status, run.answer = runs.ANSWERED, answer
        parked.remove(run)
        consumed.add(event.id)
        took = True
        log.info("sandbox_reply_recorded", extra={"seat": handle, "run_id": run.run_id, "event_id": event.id})
        await coordinator.sync_hold(handle)
        await resume(coordinator, handle, run)
    rest = [d for d in partition.deliveries if d.event.id not in consumed]
    if took and rest and coordinator.holding(handle):
        return Offer(consumed=frozenset(consumed), defer=True, why=WHY_HELD)
    return Offer(consumed=frozenset(consumed))


async def resume(coordinator: "SandboxCoordinator", handle: str, run: Run) -> None:
    """Give ``run``'s recorded reply to its job; a job that is gone is started again and given it when it asks."""
    answer = run.answer or {}
    job = coordinator.jobs.get(run.run_id)
    if job is None:
        log.info("sandbox_run_resume_restarts", extra={"seat": handle, "run_id": run.run_id, "attempt": run.attempt})
        await coordinator.start_again(handle, run)
        return
    if not job.asking:
        return  # it asks again in a moment (a job started again): the reply is given then
    # The copy first: a job that takes the reply may ask its next question at once, and that question parks the run.
    run.status, run.answer = runs.RUNNING, None
    if not await job.answer(str(answer.get(K_TEXT, ""))):
        run.status, run.answer = runs.ANSWERED, answer
        await _told(coordinator, run, ANSWER_DECLINED, answer)
        return  # the job is gone: its ending hands the reply back through the outbox
    await coordinator.store(runs.resumed, run.run_id)
    log.info("sandbox_run_resumed", extra={"seat": handle, "run_id": run.run_id, "route": answer.get(K_ROUTE, "")})
    await _told(coordinator, run, ANSWER_RESUMED, answer)


async def operator_answer(coordinator: "SandboxCoordinator", handle: str, event: Event) -> None:
    """An operator's answer (``sandbox_answer_given``): given to the run when it waits on one, else recorded as what it became."""
    data = event.data
    assert isinstance(data, SandboxAnswerGiven)
    answer = _answer(data.answer, ROUTE_OPERATOR, data.answered_by, data.answered_by_seat)
    run = coordinator.run_of(handle, data.run_id) or await in_store(runs.get)(data.run_id)
    if run is None or run.seat != handle:
        await coordinator.emit(wakes.answer_outcome(
            Run(run_id=data.run_id, seat=handle, status=runs.ENDED, task=""), ANSWER_GONE, ROUTE_OPERATOR,
            data.answered_by, data.answered_by_seat,
        ))
        return
    if run.status == runs.ENDED:
        await _told(coordinator, run, ANSWER_GONE, answer)
        return
    if run.status != runs.PARKED or not await in_store(runs.answered)(run.run_id, answer, ""):
        await _told(coordinator, run, ANSWER_NOT_AWAITING, answer)
        return
    run.status, run.answer = runs.ANSWERED, answer
    await coordinator.sync_hold(handle)
    await resume(coordinator, handle, run)


async def _told(coordinator: "SandboxCoordinator", run: Run, outcome: str, answer: dict[str, Any]) -> None:
    await coordinator.emit(wakes.answer_outcome(
        run, outcome, str(answer.get(K_ROUTE, "")), str(answer.get(K_ANSWERED_BY, "")), str(answer.get(K_ANSWERED_BY_SEAT, "")),
    ))


def handed_back(wire: dict[str, Any], run_id: str) -> Event:
    """A reply no job took, as a new inbox message: the original's values, naming the run it left.

    Its id is derived from the run and the original, so a hand-back repeated
    (a node stopped before clearing the outbox) is the same message; it
    carries none of the original's identity keys, which the completion ledger
    holds as worked by the run, so the copy is worked as a message of its own.
    """
    event = Event.from_dict(wire)
    event.id = str(uuid.uuid5(HANDED_BACK_NAMESPACE, f"{run_id}:{event.id}"))
    for key in IDENTITY_KEYS:
        event.payload.pop(key, None)
        if hasattr(event.data, key):
            setattr(event.data, key, "")
    event.payload[K_HANDED_BACK_FROM] = run_id
    return event


__all__ = ["K_HANDED_BACK_FROM", "Offer", "WHY_HELD", "WHY_STORE", "handed_back", "matches", "offer", "operator_answer", "resume"]
