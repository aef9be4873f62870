"""Partition policy: what a seat's drained partition becomes, decided in one place.

It lives with the seats because the seats' inbox loop is what asks it: the
notifications app only publishes wakes to seat inboxes and never imports
seats, so what a seat's partition becomes is the seats' business.

The inbox loop owns fetching, gating and running turns; this module owns the
decisions about a partition's events, and returns them for the loop to carry
out (it never calls back into the loop):

* :func:`dedupe` — same-id duplicates (an at-least-once edge, the requeue
  below) and same-trigger duplicates (one provider message under two event
  ids) are dropped, the first kept;
* :func:`plan` — a multi-event partition becomes ONE trigger: the digest
  (:func:`coalesce`, when the loop has a ``merge``) or the events as one
  trigger of several lines; either way with the ``notifications_coalesced``
  record to publish. A merge that raises degrades the plan;
* :func:`degrade` — per-event dispatch for a partition one of whose events
  broke it (a merge that failed, a store that refused a value, a turn that
  crashed): the tail is requeued as independent inbox messages FIRST
  (:func:`requeue_tail`; a failure there has run nothing), then the first
  event is worked alone. The loop isolates the partition's event ids, so
  from then on each of them is a partition of its own: the good ones run
  their own turns and only the poison one keeps failing, alone, toward the
  dead-letter stream.

:func:`dispatch` is that whole sequence, for a caller with no inbox loop that
wants it in one call.

The digest itself — how several wakes read as one — is ``seats.digest``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence, TypeVar

from crewlet import events
from crewlet.engine import runtime
from crewlet.events import Event, Trace
from crewlet.queue.emit import Emitter
from crewlet.events.types import NotificationsCoalesced
from crewlet.company.org import Organization
from crewlet.queue import topics
from crewlet.queue.contract import BatchOptions, EventQueue, unique_partition_key
from seats import digest
from seats.digest import MalformedConstituent
from seats.ledger import trigger_identity
from seats.wake import COALESCED_EVENT_IDS, DUPLICATES_COLLAPSED, PARTITION_KEY, SEAT, Wake, as_text

log = logging.getLogger("crewlet.seats.coalescer")

#: How much of an unexpected merge error a log line carries.
REASON_CHARS = 200
T = TypeVar("T")


Merge = Callable[[Sequence[Event]], Event]
"""The digest seam: several wakes of one partition in, ONE trigger out (:func:`coalesce` has this shape).

Pure; whatever it raises degrades the partition to per-event dispatch.
"""

#: The ``why`` of a partition degraded because its merge raised.
WHY_UNMERGEABLE = "unmergeable"


def partition_key_of(event: Event) -> str:
    """The wake's ``partition_key``, else its own id: a wake naming no conversation is never coalesced."""
    return Wake(event).partition_key or unique_partition_key(event)


def batch_options(org: Organization) -> BatchOptions:
    """The coalesce knobs as the batch layer reads them (mutated in place on apply)."""
    return BatchOptions(
        partition_key=partition_key_of, linger_s=org.coalesce_window_s, max_batch=org.coalesce_max_batch
    )


@dataclass(frozen=True)
class Fresh:
    """A partition's events with their duplicates dropped, each kept one's trigger identity, and what was dropped."""

    events: list[Event]
    #: Event id -> trigger identity, for every kept event.
    identities: dict[str, str]
    #: (event, its identity) of every dropped duplicate, in partition order.
    dropped: list[tuple[Event, str]] = field(default_factory=list)


def _event_id(event: Event) -> str:
    return event.id


def dedupe(evs: Sequence[Event], identity: Callable[[Event], str] = trigger_identity) -> Fresh:
    """Drop every event whose id or ``identity`` an earlier one already has, keeping the first.

    Same ids come from an at-least-once edge and from the degrade path's
    requeue meeting its original; same identities (the completion ledger's
    key by default) from a provider that sent one message twice under two
    event ids: either way one turn works it.
    """
    kept: list[Event] = []
    identities: dict[str, str] = {}
    seen: set[str] = set()
    dropped: list[tuple[Event, str]] = []
    for ev in evs:
        ident = identity(ev)
        if ev.id in identities or ident in seen:
            dropped.append((ev, ident))
            continue
        identities[ev.id] = ident
        seen.add(ident)
        kept.append(ev)
    return Fresh(events=kept, identities=identities, dropped=dropped)


def dedupe_same_id(evs: Sequence[Event]) -> list[Event]:
    """Drop same-id duplicates (an at-least-once edge, a partial requeue), keeping the first."""
    return dedupe(evs, _event_id).events


def coalesce(evs: Sequence[Event]) -> Event:
    """Merge one partition's wakes into ONE trigger: its same-id duplicates dropped, then ``seats.digest.merge``.

    A single event (after the drop) is returned as it is. Raises
    ``MalformedConstituent`` for a constituent that cannot be merged.
    """
    if not evs:
        raise ValueError("coalesce() needs at least one event")
    return digest.merge(dedupe_same_id(evs))


def _record(
    *,
    seat: str,
    role: str,
    agent_id: str,
    partition_key: str,
    event_ids: list[str],
    duplicates_collapsed: int,
    trace: Trace,
    source: str,
) -> Event:
    return events.new(
        NotificationsCoalesced(
            seat=seat,
            role=role,
            agent_id=agent_id,
            partition_key=partition_key,
            count=len(event_ids),
            event_ids=event_ids,
            duplicates_collapsed=duplicates_collapsed,
        ),
        trace,
        source=source,
    )


def coalesced_record(
    merged: Event,
    *,
    seat: str = "",
    role: str = "",
    agent_id: str = "",
    trace: Optional[Trace] = None,
) -> Event:
    """The ``notifications_coalesced`` event for a merged trigger, naming its ``partition_key``.

    ``trace`` defaults to a child of the merged trigger's (the first
    constituent's) span, so the record hangs in the delivery's own tree.
    """
    payload = merged.payload if isinstance(merged.payload, dict) else {}
    carried = Trace.of(merged)
    return _record(
        seat=seat or as_text(merged.field(SEAT)),
        role=role,
        agent_id=agent_id,
        partition_key=as_text(payload.get(PARTITION_KEY)),
        event_ids=[str(i) for i in payload.get(COALESCED_EVENT_IDS) or []],
        duplicates_collapsed=int(payload.get(DUPLICATES_COLLAPSED) or 0),
        trace=trace or (carried.child() if carried else Trace.root()),
        source=merged.source,
    )


async def publish_record(emitter: Emitter, record: Event, *, seat: str = "") -> None:
    """Publish a ``notifications_coalesced`` record; telemetry, so a failure is logged (and retried), not raised."""
    await emitter.publish(
        topics.event(record.type),
        record,
        log_event="notifications_coalesced_publish_failed",
        seat=seat,
        partition_key=record.data.partition_key,
    )


async def publish_coalesced(
    queue: EventQueue,
    merged: Event,
    *,
    seat: str = "",
    role: str = "",
    agent_id: str = "",
    trace: Optional[Trace] = None,
    emitter: Optional[Emitter] = None,
) -> Event:
    """Publish the merge's ``notifications_coalesced`` record; telemetry, so a failure is logged, not raised.

    Through the caller's ``emitter`` when it has one, else one for this
    record alone: either way a broker that is away for a moment is retried.
    """
    record = coalesced_record(merged, seat=seat, role=role, agent_id=agent_id, trace=trace)
    await publish_record(emitter or runtime.emitter_for(queue), record, seat=seat)
    return record


@dataclass(frozen=True)
class Degrade:
    """Per-event dispatch of a partition one of whose events broke it (design: The digest trigger).

    ``tail`` goes back to the seat's inbox as independent messages FIRST,
    then ``first`` is worked alone in the delivery's ack scope: a requeue
    that fails has run nothing, so the whole partition goes back, and a
    completed turn is never replayed by a later event's failure. ``why`` is
    what broke it, for the log line.
    """

    first: Event
    tail: list[Event]
    why: str

    @property
    def events(self) -> list[Event]:
        return [self.first, *self.tail]


def degrade(evs: Sequence[Event], why: str) -> Degrade:
    """The degraded dispatch of ``evs`` (non-empty, in the order to work them): the first alone, the rest requeued."""
    return Degrade(first=evs[0], tail=list(evs[1:]), why=why)


async def requeue_tail(queue: EventQueue, handle: str, degraded: Degrade) -> int:
    """Publish ``degraded.tail`` back to the seat's inbox, each as an independent message.

    Same ids, so a partially-requeued copy that meets its original on a
    redelivery collapses in :func:`dedupe`. Raises the queue's error on the
    first failure: the caller then fails the partition BEFORE any turn ran,
    so no completed turn is ever replayed by a later event's failure.
    """
    topic = topics.agent_inbox(handle)
    for ev in degraded.tail:
        await queue.publish(topic, ev)
    return len(degraded.tail)


@dataclass(frozen=True)
class Plan:
    """One partition's dispatch, decided; the caller carries it out in this order.

    1. ``degraded``: requeue its tail (:func:`requeue_tail`) — nothing has
       run yet, so a failure hands the whole partition back;
    2. ``record``: publish it (:func:`publish_record`);
    3. run ONE turn with ``trigger`` as its events; when it completes, what
       it ``covers`` is recorded as worked.
    """

    trigger: list[Event]
    covers: list[Event]
    record: Optional[Event] = None
    degraded: Optional[Degrade] = None


def plan(
    evs: Sequence[Event],
    merge: Optional[Merge],
    *,
    partition_key: str = "",
    seat: str = "",
    role: str = "",
    agent_id: str = "",
    trace: Optional[Trace] = None,
) -> Plan:
    """What a partition's deduplicated events become: ONE trigger, and whatever must happen before it runs.

    A single event is its own trigger. Without a ``merge`` the events are one
    trigger of several lines, recorded under ``partition_key`` and ``trace``
    (the turn's own span). With one, the merged trigger covers them all and
    its record hangs under the merged trigger's trace; a merge that raises —
    a :class:`MalformedConstituent`, or anything else it raised on one of the
    events (a value no rule anticipated) — degrades to the oldest event alone.
    """
    if len(evs) <= 1:
        return Plan(trigger=list(evs), covers=list(evs))
    if merge is None:
        record = _record(
            seat=seat,
            role=role,
            agent_id=agent_id,
            partition_key=partition_key,
            event_ids=[ev.id for ev in evs],
            duplicates_collapsed=0,
            trace=trace or Trace.root(),
            source="",
        )
        return Plan(trigger=list(evs), covers=list(evs), record=record)
    try:
        merged = merge(evs)
    except Exception as exc:  # the merge is pure: whatever it raises, one of these events is why
        ordered = sorted(evs, key=lambda e: e.timestamp)
        if isinstance(exc, MalformedConstituent):
            malformed, reason = exc.event_id, exc.reason
        else:
            malformed, reason = "", f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
        log.warning(
            "notifications_coalesce_degraded",
            extra={"seat": seat, "events": len(ordered), "malformed": malformed, "reason": reason},
        )
        degraded = degrade(ordered, WHY_UNMERGEABLE)
        return Plan(trigger=[degraded.first], covers=[degraded.first], degraded=degraded)
    record = coalesced_record(merged, seat=seat, role=role, agent_id=agent_id)
    return Plan(trigger=[merged], covers=list(evs), record=record)


async def dispatch(
    queue: EventQueue,
    handle: str,
    evs: Sequence[Event],
    run: Callable[[Event], Awaitable[T]],
    *,
    role: str = "",
    agent_id: str = "",
) -> T:
    """One partition, end to end, for a caller with no inbox loop: dedupe, :func:`plan` with the digest, carry it out.

    ``run`` is the caller's turn for the one trigger. A partition that
    cannot be merged runs its first event and requeues the rest first; a
    requeue that fails raises before ``run`` was called.
    """
    chosen = plan(dedupe_same_id(evs), coalesce, seat=handle, role=role, agent_id=agent_id)
    if chosen.degraded is not None:
        await requeue_tail(queue, handle, chosen.degraded)
    if chosen.record is not None:
        await publish_record(runtime.emitter_for(queue), chosen.record, seat=handle)
    return await run(chosen.trigger[0])


__all__ = [
    "WHY_UNMERGEABLE",
    "Degrade",
    "Fresh",
    "Merge",
    "Plan",
    "batch_options",
    "coalesce",
    "coalesced_record",
    "dedupe",
    "dedupe_same_id",
    "degrade",
    "dispatch",
    "partition_key_of",
    "plan",
    "publish_coalesced",
    "publish_record",
    "requeue_tail",
]
