"""The scheduler: each schedule's slot fires once across the fleet, as ``task_assigned`` to its seat's inbox.

Slots are aligned to the epoch, ``every`` long, so every node computes the
same slot for the same instant; the slot is claimed by inserting a
``ScheduleFiring`` row whose (schedule, slot) is unique, and only the node whose
insert landed publishes. The task's event id is derived from the org, the
schedule and the slot, so even a publish retried after an unclear failure is
one trigger to the completion ledger. A schedule whose slot began before this
node started fires at once if nobody fired it — a node that was down at the
boundary still owes it — and never twice.

The target is resolved from the company current at the firing (a seat removed
or flipped to human by an applied revision is skipped), and the firing is
recorded as ``scheduled_task_fired`` on the event stream.
"""
from __future__ import annotations

import logging
import math
import time
import uuid
from datetime import datetime, timezone as dt_timezone
from typing import Callable, Optional

from django.db import IntegrityError, transaction

from crewlet import events
from crewlet.engine.services import Periodic
from crewlet.queue.emit import Emitter
from crewlet.events.types import ScheduledTaskFired, TaskAssigned
from crewlet.company.org import CompanyHolder, Organization, Schedule
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import QueueError
from crewlet.events.tracing import start_span, trace_of
from seats.delivery_models import ScheduleFiring
from crewlet.base.db import in_store

log = logging.getLogger("crewlet.seats.scheduler")

#: Task event ids are uuid5 in this namespace over org/schedule/slot. Never change it.
TASK_ID_NAMESPACE = uuid.UUID("0b5e8a52-3c1d-5f0e-8e37-73636865646c")
#: Production default: how often the scheduler looks for due slots.
TICK_S = 1.0


def slot_of(schedule: Schedule, now_s: float) -> int:
    """The start of the slot ``now_s`` falls in, in epoch milliseconds."""
    every_ms = max(int(round(schedule.every_s * 1000)), 1)
    return (int(now_s * 1000) // every_ms) * every_ms


def task_event_id(org: Organization, schedule: Schedule, slot: int) -> str:
    return str(uuid.uuid5(TASK_ID_NAMESPACE, f"{org.org}/{schedule.name}/{slot}"))


def claim_slot(schedule: str, slot: int, seat: str, event_id: str, node: str, fired_at: datetime) -> bool:
    """Insert the firing; True only for the one caller whose insert landed."""
    try:
        with transaction.atomic(using="default"):
            ScheduleFiring.objects.create(
                schedule=schedule, slot=slot, seat=seat, task_event_id=event_id, node=node, fired_at=fired_at
            )
    except IntegrityError:
        return False
    return True


def unclaim_slot(schedule: str, slot: int, node: str) -> None:
    """Give a slot back whose task could not be published, so the next tick (anywhere) retries it."""
    ScheduleFiring.objects.filter(schedule=schedule, slot=slot, node=node).delete()


def prune_firings(before: datetime) -> int:
    """Forget firings older than ``before``: a slot that old can never be current again."""
    deleted, _ = ScheduleFiring.objects.filter(fired_at__lt=before).delete()
    return deleted


aclaim_slot = in_store(claim_slot)
aunclaim_slot = in_store(unclaim_slot)
aprune_firings = in_store(prune_firings)


class Scheduler:
    """Fires due schedule slots; ``fire_due`` is one pass, ``run`` ticks until cancelled."""

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        node_id: str = "",
        clock: Callable[[], float] = time.time,
        tick_s: float = TICK_S,
        emitter: Optional[Emitter] = None,
    ) -> None:
        self.queue = queue
        self.emitter = emitter or Emitter(queue)
        self.holder = holder
        self.node_id = node_id
        self.clock = clock
        self.tick_s = tick_s
        self.fired = 0
        #: Completed passes of ``run`` (a liveness gauge; tests wait on it rather than on the clock).
        self.passes = 0

    async def fire_due(self, now_s: Optional[float] = None) -> list[str]:
        """Fire every schedule whose current slot nobody fired yet; returns the task event ids this call published."""
        at = self.clock() if now_s is None else now_s
        org = self.holder.current()
        out = []
        for schedule in org.schedules:
            seat = org.seat_by_handle(schedule.seat)
            if seat is None or not seat.is_agent:
                log.warning("schedule_target_not_an_agent", extra={"schedule": schedule.name, "seat": schedule.seat})
                continue
            slot = slot_of(schedule, at)
            event_id = task_event_id(org, schedule, slot)
            fired_at = datetime.fromtimestamp(at, dt_timezone.utc)
            if not await aclaim_slot(schedule.name, slot, seat.handle, event_id, self.node_id, fired_at):
                continue
            with start_span("scheduler.fire", attributes={"crewlet.schedule": schedule.name}):
                task = events.new(
                    TaskAssigned(
                        **seat.labels(),
                        schedule_id=schedule.name,
                        title=schedule.task,
                        instructions=schedule.task,
                        assigned_by="scheduler",
                    ),
                    trace_of(),
                    source="scheduler",
                    event_id=event_id,
                    timestamp=fired_at,
                )
                try:
                    await self.queue.publish(topics.agent_inbox(seat.handle), task)
                except QueueError:
                    log.error("schedule_publish_failed", extra={"schedule": schedule.name, "slot": slot}, exc_info=True)
                    await aunclaim_slot(schedule.name, slot, self.node_id)
                    continue
                await self.emitter.emit(
                    ScheduledTaskFired(
                        **seat.labels(),
                        schedule_id=schedule.name,
                        schedule_name=schedule.name,
                        task_event_id=event_id,
                        fired_at=events.format_timestamp(fired_at),
                    ),
                    trace_of(),
                    source="scheduler",
                    log_event="schedule_record_publish_failed",
                    schedule=schedule.name,
                )
            self.fired += 1
            out.append(event_id)
            log.info("scheduled_task_fired", extra={"schedule": schedule.name, "seat": seat.handle, "slot": slot})
        return out

    def _next_due_in(self, now_s: float) -> float:
        """Seconds to the next slot boundary of any schedule, capped at one tick."""
        wait = self.tick_s
        for schedule in self.holder.current().schedules:
            every = schedule.every_s
            left = every - math.fmod(now_s, every)
            wait = min(wait, max(left, 0.001))
        return wait

    async def _pass(self) -> None:
        try:
            await self.fire_due()
        finally:
            self.passes += 1

    def periodic(self) -> Periodic:
        """The ticking duty: a pass now, then at each next slot boundary (at most ``tick_s`` apart).

        A failing pass is logged (``scheduler_pass_failed``) and the next tick tries again.
        """
        return Periodic("scheduler_pass", lambda: self._next_due_in(self.clock()), self._pass, logger=log)

    async def run(self) -> None:
        """Tick until cancelled (the :meth:`periodic` duty, in the calling task)."""
        await self.periodic().run()


__all__ = ["Scheduler", "TICK_S", "claim_slot", "prune_firings", "slot_of", "task_event_id"]
