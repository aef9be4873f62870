"""Seat mailboxes: created for every agent seat before any is claimed, retired 24 h after removal.

A durable subscription IS the mailbox, and the agent stream keeps a message
only while a subscription covers it: publish to a seat nobody made a mailbox
for and the wake is dropped with nothing reporting a loss. So every node walks
the whole company at start (before it claims a single seat) and again on every
applied change, creating each agent seat's inbox — not just its own share, since the node that serves a seat may not be the one
that made its mailbox (design: "A seat's mailbox exists before the seat is
running"). Creating one is idempotent, so N nodes cost N-1 no-ops. The walk
asks the broker for ``ENSURE_CONCURRENCY`` inboxes at once, so a company of
thousands of seats starts in a few round trips' time per hundred seats without
flooding the broker's API.

A seat's control subscription is made when a run of the seat first needs it
(:func:`ensure_control_mailbox`, called by whatever opens the run before it
publishes to the control subject), not by the walk: a seat with no run would
otherwise hold a second durable consumer that nothing ever publishes to, which
doubles what a company costs the broker at rest and halves the seats that fit
under ``stream.max_consumers`` (its room is still counted, see
:mod:`crewlet.company.capacity`).

The walk records each seat in the coordination store FIRST: once a seat is
removed its handle is gone from the company its names are derived from, and
the retirement clock has to live somewhere. The maintenance duty deletes a
seat's inbox and control subscriptions (whichever exist), with their mail, once it has been
absent for 24 hours; it also lists the mailboxes the broker holds, so one that
escaped the record is still found (design: "A removed seat's subscriptions are
retired, not kept"). The seat's conversation episodes (:mod:`seats.episodes`)
go with them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Awaitable, Callable, Iterable, Optional

from django.utils import timezone

from crewlet.base.aio import bounded_each
from crewlet.company.org import Organization
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue, SubscriptionRef
from seats.delivery_models import SeatRecord
from seats.episodes import apurge as apurge_episodes
from crewlet.base.db import in_store

log = logging.getLogger("crewlet.seats.mailboxes")

#: Inboxes the walk asks the broker for at once: enough to hide the round trip, few enough for its API queue.
ENSURE_CONCURRENCY = 16
#: Production default: how long a seat is absent before its mailboxes are deleted.
ABSENT_AFTER_S = 86400.0
INBOX_PATTERN = "crewlet.agent.*.inbox"
CONTROL_PATTERN = "crewlet.agent.*.control"


def mailbox_refs(handle: str) -> tuple[SubscriptionRef, SubscriptionRef]:
    """The seat's inbox and control subscriptions, exactly as the walk creates them."""
    return (
        SubscriptionRef(topics.agent_inbox(handle), topics.agent_inbox_group(handle)),
        SubscriptionRef(topics.agent_control(handle), topics.agent_control_group(handle)),
    )


def handle_of(ref: SubscriptionRef) -> Optional[str]:
    """The handle a listed seat mailbox belongs to, or None for a topic that is not one."""
    handle, lane = topics.agent_of(ref.topic)
    return handle if lane in (topics.LANE_INBOX, topics.LANE_CONTROL) else None


# -- the record ---------------------------------------------------------------


def record_seats(org: Organization, now: Optional[datetime] = None) -> None:
    """Record every seat of ``org`` and start or stop each retirement clock.

    A handle with an agent seat in ``org`` is present (clock cleared). A handle
    gone from ``org``, or an agent seat flipped to human, is absent from
    ``now`` unless its clock already runs. A human seat that never was an
    agent has no mailbox and no clock.
    """
    at = now or timezone.now()
    agents = {s.handle for s in org.agent_seats()}
    existing = {
        h: (kind, absent_since, retired_at)
        for h, kind, absent_since, retired_at in SeatRecord.objects.filter(
            handle__in=[s.handle for s in org.seats]
        ).values_list("handle", "kind", "absent_since", "retired_at")
    }
    rows = []
    for s in org.seats:
        absent_since: Optional[datetime] = None
        retired_at: Optional[datetime] = None
        before = existing.get(s.handle)
        if s.handle not in agents and before is not None:
            kind, was_absent, was_retired = before
            if kind == SeatRecord.KIND_AGENT or was_absent is not None:  # flipped: its mailbox retires
                absent_since, retired_at = was_absent or at, was_retired
        rows.append(
            SeatRecord(
                handle=s.handle,
                kind=s.kind,
                first_seen=at,
                last_active_at=at,
                absent_since=absent_since,
                retired_at=retired_at,
            )
        )
    if rows:
        SeatRecord.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["handle"],
            update_fields=["kind", "last_active_at", "absent_since", "retired_at"],
        )
    gone = SeatRecord.objects.exclude(handle__in=[s.handle for s in org.seats])
    gone.filter(absent_since__isnull=True).update(absent_since=at)


def record_found(handles: Iterable[str], now: Optional[datetime] = None) -> list[str]:
    """Record mailboxes the broker holds that no walk recorded; their clock starts now."""
    at = now or timezone.now()
    wanted = sorted(set(handles))
    if not wanted:
        return []
    known = set(SeatRecord.objects.filter(handle__in=wanted).values_list("handle", flat=True))
    fresh = [h for h in wanted if h not in known]
    SeatRecord.objects.bulk_create(
        [
            SeatRecord(handle=h, kind=SeatRecord.KIND_UNKNOWN, first_seen=at, last_active_at=at, absent_since=at)
            for h in fresh
        ],
        ignore_conflicts=True,
    )
    return fresh


def due_for_retirement(cutoff: datetime, listed: Iterable[str]) -> list[str]:
    """Handles absent since before ``cutoff`` whose mailboxes are not known to be gone."""
    listed = set(listed)
    rows = SeatRecord.objects.filter(absent_since__isnull=False, absent_since__lte=cutoff).values_list(
        "handle", "retired_at"
    )
    return sorted(h for h, retired_at in rows if retired_at is None or h in listed)


def mark_retired(handle: str, now: Optional[datetime] = None) -> None:
    SeatRecord.objects.filter(handle=handle, absent_since__isnull=False).update(retired_at=now or timezone.now())


arecord_seats = in_store(record_seats)
arecord_found = in_store(record_found)
adue_for_retirement = in_store(due_for_retirement)
amark_retired = in_store(mark_retired)


# -- the walk -------------------------------------------------------------------


async def ensure_mailboxes(queue: EventQueue, org: Organization, *, now: Optional[datetime] = None) -> list[str]:
    """Record every seat, then create every agent seat's inbox, ``ENSURE_CONCURRENCY`` at a time.

    Idempotent. Returns the handles whose inbox this call created (empty on a
    node that finds them all made), in the company's order. Human seats get
    no mailbox: a human has no inbox and no turn to wake.
    """
    await arecord_seats(org, now)
    made: set[str] = set()

    async def ensure(handle: str) -> None:
        inbox = mailbox_refs(handle)[0]
        if await queue.ensure_subscription(inbox.topic, inbox.group):
            made.add(handle)

    await bounded_each([seat.handle for seat in org.agent_seats()], ensure, ENSURE_CONCURRENCY)
    created = [seat.handle for seat in org.agent_seats() if seat.handle in made]
    log.info(
        "seat_mailboxes_ensured",
        extra={"org": org.org, "agent_seats": len(org.agent_seats()), "mailboxes_created": len(created)},
    )
    return created


async def ensure_control_mailbox(queue: EventQueue, handle: str) -> bool:
    """Create the seat's control subscription unless it exists; True when this call made it.

    Called by whatever opens a run of the seat, before it publishes to the
    control subject: the agent stream keeps a control message only while this
    subscription exists. Idempotent, like the inbox's.
    """
    control = mailbox_refs(handle)[1]
    return await queue.ensure_subscription(control.topic, control.group)


@dataclass
class SweepReport:
    """What one retirement sweep did, for the log and the tests."""

    retired: list[str] = field(default_factory=list)
    found_unrecorded: list[str] = field(default_factory=list)
    deleted: list[SubscriptionRef] = field(default_factory=list)
    #: The retired seats' conversation episodes, deleted with their mailboxes.
    episodes_purged: int = 0


async def retire_absent(
    queue: EventQueue,
    org: Organization,
    *,
    absent_after_s: float = ABSENT_AFTER_S,
    now: Optional[datetime] = None,
    claim: Optional[Callable[[str], Awaitable[bool]]] = None,
    release: Optional[Callable[[str], Awaitable[None]]] = None,
    before_delete: Optional[Callable[[str], Awaitable[object]]] = None,
) -> SweepReport:
    """The maintenance duty's mailbox pass: delete what has been absent for ``absent_after_s``.

    ``claim``/``release`` (a fleet's seat lease) are held around each seat's
    deletion, so no node still serving an older revision attaches to the
    mailbox while it is deleted; a seat whose lease another node holds is left
    for a later sweep. The retirement's mark is written before the first
    deletion, then ``before_delete`` runs (the seat's coding runs are ended);
    the seat's episodes are deleted after its mailboxes.

    ``org`` is the active company (read it from the holder per sweep). The
    broker's own listing is consulted too, so a mailbox created by a node that
    never recorded it, or left behind by an older build, is still retired —
    24 hours after this sweep first finds it, never at once, since a seat a
    newer revision just added on another node looks exactly like that.
    """
    at = now or timezone.now()
    report = SweepReport()
    await arecord_seats(org, at)
    active = {s.handle for s in org.agent_seats()}
    listed: dict[str, list[SubscriptionRef]] = {}
    for pattern in (INBOX_PATTERN, CONTROL_PATTERN):
        for ref in await queue.list_subscriptions(pattern):
            handle = handle_of(ref)
            if handle is not None:
                listed.setdefault(handle, []).append(ref)
    report.found_unrecorded = await arecord_found([h for h in listed if h not in active], at)
    for handle in report.found_unrecorded:
        log.warning("seat_mailbox_unrecorded", extra={"seat": handle, "subscriptions": len(listed[handle])})

    cutoff = at - timedelta(seconds=absent_after_s)
    for handle in await adue_for_retirement(cutoff, listed):
        if handle in active:  # came back since the record was read
            continue
        if claim is not None and not await claim(handle):
            log.warning("seat_retirement_deferred", extra={"seat": handle, "why": "another node holds its lease"})
            continue
        try:
            # The mark first: a deletion that fails half-way leaves a mailbox the broker still
            # lists, which makes the seat due again on the next sweep, mark or no mark.
            await amark_retired(handle, at)
            if before_delete is not None:
                await before_delete(handle)
            refs = set(mailbox_refs(handle)) | set(listed.get(handle, []))
            for ref in sorted(refs):
                if await queue.delete_subscription(ref.topic, ref.group):
                    report.deleted.append(ref)
            report.episodes_purged += await apurge_episodes([handle])
        finally:
            if release is not None:
                await release(handle)
        report.retired.append(handle)
        log.info("seat_mailboxes_retired", extra={"seat": handle, "absent_after_s": absent_after_s})
    return report


__all__ = [
    "ABSENT_AFTER_S",
    "CONTROL_PATTERN",
    "INBOX_PATTERN",
    "SweepReport",
    "ensure_control_mailbox",
    "ensure_mailboxes",
    "handle_of",
    "mailbox_refs",
    "record_seats",
    "retire_absent",
]
