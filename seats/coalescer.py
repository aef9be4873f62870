"""The digest coalescer: a partition of several wakes becomes ONE trigger.

It lives with the seats because the seats' inbox loop is what calls it: the
notifications app only publishes wakes to seat inboxes and never imports
seats, so the digest a seat's partition becomes is the seats' business.

Design (Inbox Batching & Coalescing § The digest trigger). The seats' inbox
loop hands a drained multi-event partition to :func:`coalesce` (pure), runs
the one trigger it returns, and records the merge with
:func:`publish_coalesced`. :func:`dispatch` is that whole sequence, including
the degrade path, for a caller that wants it in one call.

What the merged trigger is:

* a chronological digest of the EARLIER constituents (oldest first), then the
  latest constituent's full body — so the per-source scaffolding a turn
  renders from the trigger's title/url/source appears once, pointing at the
  most recent state;
* per-source supersede rules first: an earlier constituent whose parser gave
  a ``digest_body`` (Jira ``issue_updated``, a code host's lifecycle events,
  a Confluence page update) shows only that lead line;
* then the source-agnostic same-sender dedupe: an earlier constituent whose
  effective body is byte-identical to a LATER one from the SAME sender
  collapses to a marker (two different people's "+1" are two facts and both
  stay). Comments and messages otherwise always keep their text;
* ``messages``: every constituent (sender, salient body, metadata, its recon
  flag and whether it collapsed) at full fidelity for the learning workers;
* conservative merges: the trigger is ``recon`` only if every constituent
  was, and ``direct`` (somebody is waiting on an answer) if any was;
  ``trigger_position`` is the furthest position when they share a stream;
* the deepest constituent's delegation bookkeeping (batching cannot launder
  the depth cap) and the FIRST constituent's trace (a span cannot have two
  parents; rooting the turn under the message the rest reply to is what keeps
  the trace readable).

A constituent that cannot be merged raises :class:`MalformedConstituent`; the
caller degrades to per-event dispatch: requeue the tail FIRST (a requeue
failure aborts before any turn ran), then run the first event.
"""
from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Optional, Sequence, TypeVar

from crewlet import events, runtime
from crewlet.events import Event, Trace, format_timestamp
from crewlet.events.emit import Emitter
from crewlet.events.types import ExternalNotification, NotificationsCoalesced
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue

log = logging.getLogger("crewlet.seats.coalescer")

#: Ids of merged triggers are derived from their constituents' ids, so the
#: same partition merged twice (a redelivery) is the same trigger.
COALESCED_ID_NAMESPACE = uuid.UUID("0b8f3f52-6c1e-5d7a-9d2b-636f616c6573")
DUPLICATE_MARKER = "(same as a later message from {sender}; collapsed)"
COLLAPSED_DUPLICATE = "duplicate"
COLLAPSED_SUPERSEDED = "superseded"
#: How much of an unexpected merge error a log line carries.
REASON_CHARS = 200
_POSITION = re.compile(r"^(?P<stream>[^@]+)@(?P<generation>\d+):(?P<sequence>\d+)$")

T = TypeVar("T")


class MalformedConstituent(ValueError):
    """A partition member that cannot be merged; the partition degrades to per-event dispatch."""

    def __init__(self, index: int, event_id: str, reason: str) -> None:
        self.index = index
        self.event_id = event_id
        self.reason = reason
        super().__init__(f"constituent {index} ({event_id}) cannot be merged: {reason}")


@dataclass(frozen=True)
class _Constituent:
    index: int
    event: Event
    sender: str
    sender_id: str
    body: str
    digest_body: str
    partition_key: str
    conversation: str


def _text(event: Event, name: str, index: int, *, required: bool = False) -> str:
    value = event.field(name)
    if value is None:
        if required:
            raise MalformedConstituent(index, event.id, f"it carries no {name}")
        return ""
    if not isinstance(value, str):
        raise MalformedConstituent(index, event.id, f"{name} is a {type(value).__name__}, not a string")
    return value


def _read(index: int, event: Any) -> _Constituent:
    if not isinstance(event, Event):
        raise MalformedConstituent(index, str(getattr(event, "id", "?")), f"not an event ({type(event).__name__})")
    if not isinstance(event.payload, dict):
        raise MalformedConstituent(index, event.id, "its payload is not a map")
    if event.data is not None and not isinstance(event.data, ExternalNotification):
        raise MalformedConstituent(index, event.id, f"a {event.type} is not a notification wake")
    messages = event.field("messages")
    if messages is not None and not isinstance(messages, list):
        raise MalformedConstituent(index, event.id, "messages is not a list")
    body = _text(event, "body", index, required=True)
    sender = _text(event, "sender", index)
    return _Constituent(
        index=index,
        event=event,
        sender=sender,
        sender_id=_text(event, "sender_id", index) or sender,
        body=body,
        digest_body=_text(event, "digest_body", index),
        partition_key=_text(event, "partition_key", index),
        conversation=_text(event, "conversation_identity", index),
    )


def dedupe_same_id(evs: Sequence[Event]) -> list[Event]:
    """Drop same-id duplicates (an at-least-once edge, a partial requeue), keeping the first."""
    seen: set[str] = set()
    out = []
    for ev in evs:
        if ev.id in seen:
            continue
        seen.add(ev.id)
        out.append(ev)
    return out


def _chronological(items: Sequence[_Constituent]) -> list[_Constituent]:
    return sorted(items, key=lambda c: (c.event.timestamp, c.index))


def _merge_positions(items: Sequence[_Constituent]) -> tuple[str, list[str]]:
    positions = [p for p in (c.event.field("trigger_position") for c in items) if isinstance(p, str) and p]
    if not positions:
        return "", []
    parsed = [m for m in (_POSITION.match(p) for p in positions) if m is not None]
    if len(parsed) == len(positions) and len({m.group("stream") for m in parsed}) == 1:
        best = max(parsed, key=lambda m: (int(m.group("generation")), int(m.group("sequence"))))
        return best.group(0), positions
    return positions[-1], positions


def _indent(text: str) -> str:
    lines = text.splitlines() or [""]
    return "\n".join([lines[0]] + ["   " + line for line in lines[1:]])


def coalesce(evs: Sequence[Event]) -> Event:
    """Merge one partition's wakes into ONE trigger (see the module docstring).

    A single event (after same-id duplicates are dropped) is returned as it
    is: single-event partitions follow the pre-batching dispatch path. Raises
    :class:`MalformedConstituent` for a constituent that cannot be merged —
    not a wake, a non-string body, or a partition key or conversation identity
    that disagrees with the others (a partition has one identity, and a merged
    trigger filed under whichever event sorted first would be a lie).
    """
    if not evs:
        raise ValueError("coalesce() needs at least one event")
    unique = dedupe_same_id(evs)
    items = [_read(i, ev) for i, ev in enumerate(unique)]
    if len(items) == 1:
        return items[0].event
    first_key, first_conv = items[0].partition_key, items[0].conversation
    for c in items[1:]:
        if c.partition_key != first_key:
            raise MalformedConstituent(c.index, c.event.id, f"partition_key {c.partition_key!r} is not {first_key!r}")
        if c.conversation != first_conv:
            raise MalformedConstituent(
                c.index, c.event.id, f"conversation_identity {c.conversation!r} is not {first_conv!r}"
            )

    ordered = _chronological(items)
    first, latest = ordered[0], ordered[-1]
    earlier = ordered[:-1]

    # Effective bodies: the per-source supersede rule first, then the same-sender dedupe.
    effective: dict[int, tuple[str, str]] = {}
    for c in ordered:
        if c is not latest and c.digest_body:
            effective[c.index] = (c.digest_body, COLLAPSED_SUPERSEDED)
        else:
            effective[c.index] = (c.body, "")
    duplicates = 0
    for pos, c in enumerate(earlier):
        mine = effective[c.index][0]
        if any(
            later.sender_id == c.sender_id and effective[later.index][0] == mine for later in ordered[pos + 1 :]
        ):
            effective[c.index] = (DUPLICATE_MARKER.format(sender=c.sender or c.sender_id or "the same sender"), COLLAPSED_DUPLICATE)
            duplicates += 1

    lines = [f"[{len(earlier)} earlier message{'s' if len(earlier) != 1 else ''} in this conversation, oldest first]"]
    for n, c in enumerate(earlier, 1):
        who = c.sender or c.sender_id or "someone"
        lines.append(f"{n}. {format_timestamp(c.event.timestamp)} {who}: {_indent(effective[c.index][0])}")
    lines.append("")
    lines.append(f"[Latest message, from {latest.sender or latest.sender_id or 'someone'}]")
    lines.append(latest.body)
    merged_body = "\n".join(lines)

    messages = []
    for c in ordered:
        ev = c.event
        messages.append(
            {
                "event_id": ev.id,
                "timestamp": format_timestamp(ev.timestamp),
                "source": ev.source,
                "sender": c.sender,
                "sender_id": c.sender_id,
                "body": c.body,
                "event_name": _text(ev, "event_name", c.index),
                "title": _text(ev, "title", c.index),
                "url": _text(ev, "url", c.index),
                "delivery_id": _as_text(ev.field("delivery_id")),
                "message_id": _as_text(ev.field("message_id")),
                "recon": ev.field("recon") is True,
                "direct": ev.field("direct") is not False,
                "collapsed": effective[c.index][1],
            }
        )

    deepest = max(ordered, key=lambda c: (c.event.delegation_depth, -ordered.index(c)))
    position, positions = _merge_positions(ordered)
    ids = [c.event.id for c in ordered]
    latest_ev = latest.event

    payload = dict(latest_ev.payload)
    payload.update(
        {
            "partition_key": first_key,
            "body": merged_body,
            "sender": latest.sender,
            "sender_id": latest.sender_id,
            "recon": all(m["recon"] for m in messages),
            "direct": any(m["direct"] for m in messages),
            "coalesced_count": len(ordered),
            "coalesced_event_ids": ids,
            "duplicates_collapsed": duplicates,
            "delivery_ids": [m["delivery_id"] for m in messages if m["delivery_id"]],
        }
    )
    payload.pop("digest_body", None)
    if first_conv:
        payload["conversation_identity"] = first_conv
    if position:
        payload["trigger_position"] = position
        if len(set(positions)) > 1:
            payload["trigger_positions"] = positions

    data = latest_ev.data if isinstance(latest_ev.data, ExternalNotification) else ExternalNotification(
        seat=_text(latest_ev, "seat", latest.index),
        event_name=_text(latest_ev, "event_name", latest.index),
        delivery_id=_as_text(latest_ev.field("delivery_id")),
        title=_text(latest_ev, "title", latest.index),
        url=_text(latest_ev, "url", latest.index),
    )
    data = replace(data, body=merged_body, sender=latest.sender, messages=messages)

    return Event(
        type=latest_ev.type if latest_ev.data is not None else "external_notification",
        payload=payload,
        id=str(uuid.uuid5(COALESCED_ID_NAMESPACE, "|".join(ids))),
        timestamp=latest_ev.timestamp,
        source=latest_ev.source,
        trace_id=first.event.trace_id,
        span_id=first.event.span_id,
        parent_span_id=first.event.parent_span_id,
        delegation_depth=deepest.event.delegation_depth,
        parent_turn_id=deepest.event.parent_turn_id,
        delegation_chain=list(deepest.event.delegation_chain),
        data=data,
        extra={k: v for k, v in latest_ev.extra.items()},
    )


def _as_text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    return str(value) if isinstance(value, (str, int)) else ""


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
    ids = [str(i) for i in payload.get("coalesced_event_ids") or []]
    carried = Trace.of(merged)
    return events.new(
        NotificationsCoalesced(
            seat=seat or _as_text(merged.field("seat")),
            role=role,
            agent_id=agent_id,
            partition_key=_as_text(payload.get("partition_key")),
            count=len(ids),
            event_ids=ids,
            duplicates_collapsed=int(payload.get("duplicates_collapsed") or 0),
        ),
        trace or (carried.child() if carried else Trace.root()),
        source=merged.source,
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
    await (emitter or runtime.emitter_for(queue)).publish(
        topics.event(record.type),
        record,
        log_event="notifications_coalesced_publish_failed",
        seat=seat,
        partition_key=record.data.partition_key,
    )
    return record


async def requeue_tail(queue: EventQueue, handle: str, ordered: Sequence[Event]) -> int:
    """Publish every event but the first back to the seat's inbox, as independent messages.

    Same ids, so a partially-requeued copy that meets its original on a
    redelivery collapses in the inbox's same-id dedupe. Raises the queue's
    error on the first failure: the caller then fails the partition BEFORE any
    turn ran, so no completed turn is ever replayed by a later event's failure.
    """
    topic = topics.agent_inbox(handle)
    for ev in ordered[1:]:
        await queue.publish(topic, ev)
    return max(len(ordered) - 1, 0)


async def dispatch(
    queue: EventQueue,
    handle: str,
    evs: Sequence[Event],
    run: Callable[[Event], Awaitable[T]],
    *,
    role: str = "",
    agent_id: str = "",
) -> T:
    """One partition, end to end: dedupe, merge (or degrade), record the merge, run ONE trigger.

    ``run`` is the caller's turn for one trigger. A partition that cannot be
    merged — a :class:`MalformedConstituent`, or anything else the pure merge
    raised on one of its events (a value no rule anticipated) — runs its
    first event and requeues the rest first; a requeue that fails raises
    before ``run`` was called.
    """
    unique = dedupe_same_id(evs)
    if len(unique) == 1:
        return await run(unique[0])
    try:
        merged = coalesce(unique)
    except Exception as exc:  # coalesce is pure: whatever it raises, one of these events is why
        ordered = sorted(unique, key=lambda e: e.timestamp)
        if isinstance(exc, MalformedConstituent):
            malformed, reason = exc.event_id, exc.reason
        else:
            malformed, reason = "", f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
        log.warning(
            "notifications_coalesce_degraded",
            extra={"seat": handle, "events": len(ordered), "malformed": malformed, "reason": reason},
        )
        await requeue_tail(queue, handle, ordered)
        return await run(ordered[0])
    await publish_coalesced(queue, merged, seat=handle, role=role, agent_id=agent_id)
    return await run(merged)


__all__ = [
    "COLLAPSED_DUPLICATE",
    "COLLAPSED_SUPERSEDED",
    "DUPLICATE_MARKER",
    "MalformedConstituent",
    "coalesce",
    "coalesced_record",
    "dedupe_same_id",
    "dispatch",
    "publish_coalesced",
    "requeue_tail",
]
