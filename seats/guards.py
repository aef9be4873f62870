"""The runtime guards a running turn is held to: a stall and a scheduled task's timeout.

Both end the turn where it is — the provider call or tool call in flight is
cancelled — as a failed turn with ``turn.guard_breach`` under its guard (the
seat's ``last_error``, never a stop), like ``max_iter`` (:mod:`seats.turns`):

* ``stall`` — no round progress for ``node.turn_stall_s``: progress is a
  provider's answer or a tool's result (:meth:`~seats.turn_types.TurnState.moved`),
  so a call that hangs, a retry that never gets through and a tool that never
  returns all count against it, and a long turn that keeps answering does not;
* ``scheduled_timeout`` — a turn working a scheduled task (``task_assigned``
  from the scheduler) ran past its schedule's ``timeout``, counted from the
  turn's start; of several tasks in one trigger, the shortest timeout holds.

The watch reads the monotonic clock: each wait is until the earlier of the
two deadlines, and when both have passed the one due first is the breach.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Coroutine, Optional

from crewlet.events.types import GUARD_SCHEDULED_TIMEOUT, GUARD_STALL, TaskAssigned
from crewlet.company.org import Organization
from seats.turn_types import OUTCOME_FAILED, Trigger, TurnResult, TurnState

log = logging.getLogger("crewlet.seats.turns")


def scheduled_timeout(org: Organization, trigger: Trigger) -> Optional[tuple[str, float]]:
    """The schedule whose task this trigger works and its ``timeout_s`` (the shortest, of several); None for other work."""
    by_name = {s.name: s for s in org.schedules}
    found = [
        by_name[ev.data.schedule_id]
        for ev in trigger.events
        if isinstance(ev.data, TaskAssigned) and ev.data.schedule_id in by_name
    ]
    if not found:
        return None
    first = min(found, key=lambda s: s.timeout_s)
    return first.name, first.timeout_s


def _breach(result: TurnResult, guard: str, error: str) -> None:
    result.outcome, result.guard, result.error_kind = OUTCOME_FAILED, guard, guard
    result.error = f"{guard}: {error}"


async def guarded(rounds: Coroutine[Any, Any, None], loop: TurnState, result: TurnResult, *, stall_s: float) -> None:
    """Run the turn's ``rounds`` under its guards; a breach cancels them and is written into ``result``.

    An exception of the rounds' own propagates; this task's cancellation (a
    person's overdue stop, a lost lease) cancels the rounds too.
    """
    task = asyncio.ensure_future(rounds)
    schedule = scheduled_timeout(loop.org, loop.trigger)
    ends_at = loop.started + schedule[1] if schedule is not None else float("inf")
    try:
        while True:
            due = min(ends_at, loop.progress + stall_s)
            await asyncio.wait({task}, timeout=max(due - time.monotonic(), 0.0))
            if task.done():
                task.result()
                return
            now, stalls_at = time.monotonic(), loop.progress + stall_s
            if min(ends_at, stalls_at) <= now:
                break
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task})  # the rounds unwind before the turn closes its providers under them
        raise
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:  # it failed while being cut: the breach is what ended it
        log.debug("turn_rounds_failed_when_cut", extra={"seat": loop.seat.handle}, exc_info=task.exception())
    if schedule is not None and ends_at <= stalls_at:
        _breach(result, GUARD_SCHEDULED_TIMEOUT, f"the scheduled task {schedule[0]} ran past its timeout of {schedule[1]:g}s")
    else:
        _breach(result, GUARD_STALL, f"no provider answer or tool result for {stall_s:g}s (node.turn_stall_s)")


__all__ = ["guarded", "scheduled_timeout"]
