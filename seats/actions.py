"""A person pausing and resuming a seat: compare-and-set in the coordination store, announced after commit.

Each change is one conditional UPDATE on ``SeatPause.version``: whoever's
update matched the version they read made the change, and only that caller
publishes ``seat_paused`` / ``seat_resumed`` — so a second pause of a paused
seat is no change and no event, however many people or nodes clicked at once.
A pause amended to stop the running turn is a change and is re-announced.

Publishing happens after the change committed (``transaction.on_commit`` on
the sync path, after the store call returned on the async one): an event for a
change that rolled back would tell the dashboard something that never
happened. Then the runtime hook applies the hold on the seat's inbox in this
process; a node that did not take the call learns it from its pause reconcile
(and the dispatch-time store check), because the row, not the event, is the
state.

Callers: the HTTP API and the admin action (sync: :func:`pause_seat`,
:func:`resume_seat`, which hand the publish to the engine's loop) and async
code (:func:`apause_seat`, :func:`aresume_seat`). Both find the queue and the
hook on the engine running in this process (its queue, and its
:data:`~crewlet.engine.interfaces.SEAT_RUNTIME`, through
:func:`crewlet.engine.runtime.find_service`); an async caller may pass its own
queue instead. Without them the call is refused with the one "no engine here"
error, :class:`~crewlet.engine.runtime.EngineAway`.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, Optional

from django.db import transaction
from django.utils import timezone

from crewlet import events
from crewlet.engine import runtime
from crewlet.events.types import SeatPaused, SeatResumed
from crewlet.engine.interfaces import SEAT_RUNTIME, SeatLoops
from crewlet.company.org import CompanyHolder
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import InvalidArgument
from crewlet.events.tracing import trace_of
from seats.delivery_models import SeatPause
from crewlet.base.db import in_store

log = logging.getLogger("crewlet.seats.actions")

#: How long the sync path waits for the engine loop to publish and apply a change.
ANNOUNCE_TIMEOUT_S = 10.0
#: Compare-and-set attempts before giving up to whoever keeps changing the row.
_CAS_ATTEMPTS = 8
#: Why a sync pause or resume is refused where no seat runtime runs to announce it on.
NO_RUNTIME_HERE = "no running seat runtime in this process to announce seat pauses on"


class SeatNotFound(LookupError):
    """The handle names no agent seat of the active company: there is nothing to pause."""


@dataclass(frozen=True)
class PauseChange:
    """One won compare-and-set: what changed, by whom, and (for a resume) the pause it ended."""

    handle: str
    paused: bool
    version: int
    by: str
    by_seat: str
    reason: str
    stop_running: bool
    at: datetime
    paused_by: str = ""
    paused_at: Optional[datetime] = None

    def event(self) -> events.Event:
        if self.paused:
            body: Any = SeatPaused(
                seat=self.handle,
                paused_by=self.by,
                paused_by_seat=self.by_seat,
                reason=self.reason,
                stop_running=self.stop_running,
                paused_at=events.format_timestamp(self.paused_at or self.at),
            )
        else:
            body = SeatResumed(
                seat=self.handle,
                resumed_by=self.by,
                resumed_by_seat=self.by_seat,
                paused_by=self.paused_by,
                paused_at=events.format_timestamp(self.paused_at) if self.paused_at else "",
            )
        return events.new(body, trace_of(), source="operator")


PauseHook = Callable[[PauseChange], Awaitable[None]]


def seat_runtime_here() -> bool:
    """Whether a seat runtime runs in this process (the sync path needs one to announce on)."""
    return runtime.find_service(SEAT_RUNTIME) is not None


# -- the compare-and-set ----------------------------------------------------------


def _check(handle: str, holder: Optional[CompanyHolder]) -> None:
    try:
        topics.agent_inbox(handle)
    except InvalidArgument:
        raise SeatNotFound(f"seat={handle!r}: not a seat handle") from None
    if holder is not None:
        seat = holder.current().seat_by_handle(handle)
        if seat is None or not seat.is_agent:
            raise SeatNotFound(f"seat={handle!r}: not an agent seat of the active company")


def _row(handle: str) -> SeatPause:
    row, _ = SeatPause.objects.get_or_create(handle=handle)
    return row


#: What a compare-and-set plans from the row it read and the time: the columns to write and the change that makes.
_Plan = Optional[tuple[dict[str, Any], PauseChange]]


def _compare_and_set(handle: str, exhausted: str, plan: Callable[[SeatPause, datetime], _Plan]) -> Optional[PauseChange]:
    """Write ``handle``'s pause row only if nobody wrote it since it was read (its ``version``); a few attempts.

    ``plan`` returns None when the row already says what was asked (nothing to
    change). Every node shares the row, so a lost race rereads it and plans again.
    """
    for _ in range(_CAS_ATTEMPTS):
        row = _row(handle)
        planned = plan(row, timezone.now())
        if planned is None:
            return None
        columns, change = planned
        if SeatPause.objects.filter(pk=row.pk, version=row.version).update(**columns, version=row.version + 1):
            return change
    log.warning(exhausted, extra={"seat": handle})
    return None


def pause_cas(handle: str, by: str, by_seat: str, reason: str, stop_running: bool) -> Optional[PauseChange]:
    """Pause ``handle`` unless it already is (with at least this ``stop_running``); the change when won."""

    def plan(row: SeatPause, now: datetime) -> _Plan:
        if row.paused and (row.stop_running or not stop_running):
            return None
        amend = row.paused  # only an upgrade to stop_running reaches here while paused
        paused_at = row.paused_at if amend and row.paused_at else now
        why = reason if (reason or not amend) else row.reason
        columns: dict[str, Any] = dict(
            paused=True, paused_by=by, paused_by_seat=by_seat, reason=why, stop_running=bool(stop_running), paused_at=paused_at
        )
        change = PauseChange(handle=handle, paused=True, version=row.version + 1, by=by, by_seat=by_seat, reason=why,
                             stop_running=bool(stop_running), at=now, paused_by=by, paused_at=paused_at)
        return columns, change

    return _compare_and_set(handle, "seat_pause_cas_exhausted", plan)


def resume_cas(handle: str, by: str, by_seat: str) -> Optional[PauseChange]:
    """Resume ``handle`` if it is paused; the change (naming the pause it ended) when won."""

    def plan(row: SeatPause, now: datetime) -> _Plan:
        if not row.paused:
            return None
        columns: dict[str, Any] = dict(paused=False, stop_running=False, resumed_by=by, resumed_at=now)
        change = PauseChange(handle=handle, paused=False, version=row.version + 1, by=by, by_seat=by_seat, reason="",
                             stop_running=False, at=now, paused_by=row.paused_by, paused_at=row.paused_at)
        return columns, change

    return _compare_and_set(handle, "seat_resume_cas_exhausted", plan)


def pause_states(handles: Optional[list[str]] = None) -> dict[str, SeatPause]:
    """The pause rows of ``handles`` (every row when None): what a runtime reconciles its holds to."""
    rows = SeatPause.objects.all() if handles is None else SeatPause.objects.filter(handle__in=handles)
    return {row.handle: row for row in rows}


apause_cas = in_store(pause_cas)
aresume_cas = in_store(resume_cas)
apause_states = in_store(pause_states)


# -- announcing -----------------------------------------------------------------------


async def _announce(queue: EventQueue, change: PauseChange, hook: Optional[PauseHook]) -> None:
    """Publish the change's event, then let this process's runtime apply the hold."""
    event = change.event()
    await runtime.emitter_for(queue).publish(
        topics.event(event.type), event, log_event="seat_pause_publish_failed", level=logging.ERROR, seat=change.handle
    )
    if hook is not None:
        try:
            await hook(change)
        except Exception:
            log.exception("seat_pause_hook_failed", extra={"seat": change.handle})
    log.info(
        "seat_paused" if change.paused else "seat_resumed",
        extra={"seat": change.handle, "by": change.by, "version": change.version, "stop_running": change.stop_running},
    )


def _resolve(queue: Optional[EventQueue]) -> tuple[EventQueue, Optional[PauseHook], Optional[CompanyHolder]]:
    here = runtime.current_queue()
    seats = runtime.find_service(SEAT_RUNTIME)
    hook = seats.on_pause_change if seats is not None else None
    holder = seats.holder if seats is not None else None
    if queue is not None:
        if here is queue:
            return queue, hook, holder
        return queue, None, None
    if here is None or seats is None:
        raise runtime.EngineAway(
            runtime.MISSING_SERVICE,
            "no queue to announce seat pauses on: pass queue= or run the engine's seat runtime in this process",
        )
    return here, hook, holder


async def apause_seat(
    handle: str,
    by: str,
    reason: str = "",
    stop_running: bool = False,
    *,
    by_seat: str = "",
    queue: Optional[EventQueue] = None,
) -> bool:
    """Pause a seat; True when this call made the change (and so announced it)."""
    q, hook, holder = _resolve(queue)
    _check(handle, holder)
    change = await apause_cas(handle, by, by_seat, reason, stop_running)
    if change is None:
        return False
    await _announce(q, change, hook)
    return True


async def aresume_seat(handle: str, by: str, *, by_seat: str = "", queue: Optional[EventQueue] = None) -> bool:
    """Resume a paused seat; True when this call made the change."""
    q, hook, holder = _resolve(queue)
    _check(handle, holder)
    change = await aresume_cas(handle, by, by_seat)
    if change is None:
        return False
    await _announce(q, change, hook)
    return True


def _sync(cas: Callable[[], Optional[PauseChange]]) -> bool:
    running = runtime.current_engine()
    seats: Optional[SeatLoops] = running.find(SEAT_RUNTIME) if running is not None else None
    if running is None or running.queue is None or seats is None:
        raise runtime.EngineAway(runtime.MISSING_SERVICE, NO_RUNTIME_HERE)
    hook = seats.on_pause_change
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("pause_seat/resume_seat block: from async code call apause_seat/aresume_seat")
    queue: EventQueue = running.queue

    def announce(change: PauseChange) -> None:
        # The change is committed whatever happens here: a failed announcement is logged, and
        # every node's pause reconcile still applies the row.
        try:
            running.call(lambda: _announce(queue, change, hook), ANNOUNCE_TIMEOUT_S)
        except Exception:
            log.error("seat_pause_announce_failed", extra={"seat": change.handle}, exc_info=True)

    with transaction.atomic(using="default"):
        change = cas()
        if change is not None:
            transaction.on_commit(lambda: announce(change), using="default")
    return change is not None


def _holder_here() -> Optional[CompanyHolder]:
    seats = runtime.find_service(SEAT_RUNTIME)
    return seats.holder if seats is not None else None


def pause_seat(handle: str, by: str, reason: str = "", stop_running: bool = False, *, by_seat: str = "") -> bool:
    """Sync pause (API view, admin action); the announcement runs on the engine's loop after commit."""
    _check(handle, _holder_here())
    return _sync(lambda: pause_cas(handle, by, by_seat, reason, stop_running))


def resume_seat(handle: str, by: str, *, by_seat: str = "") -> bool:
    """Sync resume; see :func:`pause_seat`."""
    _check(handle, _holder_here())
    return _sync(lambda: resume_cas(handle, by, by_seat))


__all__ = [
    "NO_RUNTIME_HERE",
    "PauseChange",
    "SeatNotFound",
    "apause_seat",
    "apause_states",
    "aresume_seat",
    "pause_cas",
    "pause_seat",
    "pause_states",
    "resume_cas",
    "resume_seat",
    "seat_runtime_here",
]
