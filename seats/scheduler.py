"""The scheduler: each schedule's slot fires once across the fleet, as ``task_assigned`` to its seat's inbox.

An ``every`` schedule's slots are aligned to the epoch, ``every`` long; a
``cron`` schedule's slot is the latest instant of its expression, read in its
time zone by cronsim (Debian cron's rules: a 09:00 stays 09:00 local across a
daylight-saving change, a time skipped by the spring change fires at the
change, a time repeated in autumn fires once). Either way every node computes
the same slot, in epoch milliseconds, for the same instant; the slot is
claimed by inserting a ``ScheduleFiring`` row whose (schedule, slot) is
unique, and only the node whose insert landed publishes. The task's event id
is derived from the org, the schedule and the slot, so even a publish retried
after an unclear failure is one trigger to the completion ledger. A slot that
began before this node started fires at once if nobody fired it — a node that
was down at the boundary still owes it — and never twice.

A ``cron`` schedule fires no slot that began before the fleet first saw it
(:class:`~seats.delivery_models.ScheduleSeen`, per schedule name and
cadence, recorded by the first node to start with it or to tick with it):
a stand-up added on a Tuesday afternoon first fires on Wednesday morning,
not at once. An ``every`` schedule keeps its first rule: the slot the
schedule is first seen in fires at once.

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
from zoneinfo import ZoneInfo

from cronsim import CronSim
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Subquery

from crewlet import events
from crewlet.engine.services import Periodic
from crewlet.queue.emit import Emitter
from crewlet.events.types import ScheduledTaskFired, TaskAssigned
from crewlet.company.org import CompanyHolder, Organization, Schedule
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import QueueError
from crewlet.events.tracing import start_span, trace_of
from seats.delivery_models import ScheduleFiring, ScheduleSeen
from crewlet.base.db import in_store

log = logging.getLogger("crewlet.seats.scheduler")

#: Task event ids are uuid5 in this namespace over org/schedule/slot. Never change it.
TASK_ID_NAMESPACE = uuid.UUID("0b5e8a52-3c1d-5f0e-8e37-73636865646c")
#: Production default: how often the scheduler looks for due slots.
TICK_S = 1.0


def slot_of(schedule: Schedule, now_s: float) -> Optional[int]:
    """The start of the slot ``now_s`` falls in, in epoch milliseconds (None: a cron with no instant in the 50 years before)."""
    if schedule.cron:
        return _cron_slot_ms(schedule, now_s)
    every_ms = max(int(round(schedule.every_s * 1000)), 1)
    return (int(now_s * 1000) // every_ms) * every_ms


def next_slot_s(schedule: Schedule, now_s: float) -> Optional[float]:
    """When the first slot after ``now_s`` begins, in epoch seconds (None: a cron with no instant in the next 50 years)."""
    if schedule.cron:
        try:
            return next(CronSim(schedule.cron, _local(schedule, now_s))).timestamp()
        except StopIteration:
            return None
    return now_s + schedule.every_s - math.fmod(now_s, schedule.every_s)


def _local(schedule: Schedule, epoch_s: float) -> datetime:
    """``epoch_s`` as a time in the schedule's zone (by way of UTC, so the fold of a repeated hour is right)."""
    return datetime.fromtimestamp(epoch_s, dt_timezone.utc).astimezone(ZoneInfo(schedule.timezone))


def _cron_slot_ms(schedule: Schedule, now_s: float) -> Optional[int]:
    """The latest instant of the cron expression at or before ``now_s``.

    cronsim's backward walk finds an instant at or before ``now_s``; around an
    autumn change it can land a day early, so the forward walk (the one with
    Debian cron's rules) steps from there to the latest instant not after ``now_s``.
    """
    try:
        slot = next(CronSim(schedule.cron, _local(schedule, math.floor(now_s / 60) * 60 + 60), reverse=True))
        for later in CronSim(schedule.cron, _local(schedule, slot.timestamp())):
            if later.timestamp() > now_s:
                break
            slot = later
    except StopIteration:
        return None
    return int(slot.timestamp()) * 1000


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
    """Forget firings older than ``before``, except each schedule's latest.

    The latest may still be its current slot — a monthly cron's, or a long
    ``every``'s — and forgetting it would fire that slot again.
    """
    latest = ScheduleFiring.objects.filter(schedule=OuterRef("schedule")).order_by("-slot").values("pk")[:1]
    deleted, _ = ScheduleFiring.objects.filter(fired_at__lt=before).exclude(pk=Subquery(latest)).delete()
    return deleted


def first_seen(schedule: str, cadence: str, now_ms: int) -> tuple[int, bool]:
    """When the fleet first saw (schedule, cadence), in epoch ms, recording ``now_ms`` if nobody had; and whether this call did."""
    row, created = ScheduleSeen.objects.get_or_create(schedule=schedule, cadence=cadence, defaults={"first_seen_ms": now_ms})
    return row.first_seen_ms, created


class StartedClock:
    """A clock that reads ``start_s`` when it is first read and runs at real speed from there (a schedule's rehearsal)."""

    def __init__(self, start_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.start_s = start_s
        self.monotonic = monotonic
        self._origin: Optional[float] = None

    def __call__(self) -> float:
        now = self.monotonic()
        if self._origin is None:
            self._origin = now
        return self.start_s + (now - self._origin)


def rehearsal_clock() -> Optional[StartedClock]:
    """The scheduler's clock ``CREWLET_SCHEDULER_CLOCK_START`` asks for (warned once), or None for the real one."""
    from django.conf import settings

    start_s = getattr(settings, "SCHEDULER_CLOCK_START_S", None)
    if start_s is None:
        return None
    at = datetime.fromtimestamp(start_s, dt_timezone.utc)
    log.warning("scheduler_clock_rehearsal", extra={"starts_at": events.format_timestamp(at), "hint": "unset CREWLET_SCHEDULER_CLOCK_START for the real clock"})
    return StartedClock(start_s)


aclaim_slot = in_store(claim_slot)
aunclaim_slot = in_store(unclaim_slot)
aprune_firings = in_store(prune_firings)
afirst_seen = in_store(first_seen)


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
        #: (schedule, cadence) -> when the fleet first saw it, epoch ms: read from the store once per node.
        self._seen: dict[tuple[str, str], int] = {}

    async def note_schedules(self, now_s: Optional[float] = None) -> None:
        """Record (or read) when the fleet first saw each ``cron`` schedule of the current company."""
        at = self.clock() if now_s is None else now_s
        for schedule in self.holder.current().schedules:
            if schedule.cron:
                await self._first_seen_ms(schedule, at)

    async def _first_seen_ms(self, schedule: Schedule, at: float) -> int:
        key = (schedule.name, schedule.cadence)
        if key not in self._seen:
            seen_ms, created = await afirst_seen(schedule.name, schedule.cadence, int(at * 1000))
            if created:
                upcoming = next_slot_s(schedule, seen_ms / 1000)
                log.info(
                    "schedule_first_seen",
                    extra={
                        "schedule": schedule.name,
                        "cadence": schedule.cadence,
                        "next_slot": events.format_timestamp(datetime.fromtimestamp(upcoming, dt_timezone.utc)) if upcoming else "never",
                    },
                )
            self._seen[key] = seen_ms
        return self._seen[key]

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
            if slot is None or (schedule.cron and slot < await self._first_seen_ms(schedule, at)):
                continue  # a cron slot that began before the schedule existed is not owed
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
            upcoming = next_slot_s(schedule, now_s)
            if upcoming is not None:
                wait = min(wait, max(upcoming - now_s, 0.001))
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


__all__ = [
    "Scheduler",
    "StartedClock",
    "TICK_S",
    "claim_slot",
    "first_seen",
    "next_slot_s",
    "prune_firings",
    "rehearsal_clock",
    "slot_of",
    "task_event_id",
]
