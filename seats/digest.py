"""The digest: how a partition of several wakes reads as ONE trigger (pure).

Design: Inbox Batching & Coalescing § The digest trigger. The merged trigger is:

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

A constituent that cannot be merged raises :class:`MalformedConstituent`;
what a partition then becomes is ``seats.coalescer``'s decision (it degrades).
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

from crewlet.events import Event, format_timestamp
from crewlet.events.types import ExternalNotification
from crewlet.events.types.notification import coalesced_trigger_id
from seats.wake import (
    BODY,
    COALESCED_COUNT,
    COALESCED_EVENT_IDS,
    CONVERSATION_IDENTITY,
    DELIVERY_ID,
    DELIVERY_IDS,
    DIGEST_BODY,
    DIRECT,
    DUPLICATES_COLLAPSED,
    EVENT_NAME,
    MESSAGE_COLLAPSED,
    MESSAGE_EVENT_ID,
    MESSAGE_ID,
    MESSAGE_SOURCE,
    MESSAGE_TIMESTAMP,
    PARTITION_KEY,
    RECON,
    SENDER,
    SENDER_ID,
    TITLE,
    TRIGGER_POSITION,
    TRIGGER_POSITIONS,
    URL,
    Wake,
    WakeValueError,
)

DUPLICATE_MARKER = "(same as a later message from {sender}; collapsed)"
COLLAPSED_DUPLICATE = "duplicate"
COLLAPSED_SUPERSEDED = "superseded"
_POSITION = re.compile(r"^(?P<stream>[^@]+)@(?P<generation>\d+):(?P<sequence>\d+)$")


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
    wake: Wake
    sender: str
    sender_id: str
    body: str
    digest_body: str
    partition_key: str
    conversation: str


@contextlib.contextmanager
def _merging(index: int, event_id: str) -> Iterator[None]:
    """Reads of constituent ``index``: a value of the wrong type is that constituent's :class:`MalformedConstituent`."""
    try:
        yield
    except WakeValueError as exc:
        raise MalformedConstituent(index, event_id, exc.reason) from None


def _read(index: int, event: Any) -> _Constituent:
    if not isinstance(event, Event):
        raise MalformedConstituent(index, str(getattr(event, "id", "?")), f"not an event ({type(event).__name__})")
    if not isinstance(event.payload, dict):
        raise MalformedConstituent(index, event.id, "its payload is not a map")
    if event.data is not None and not isinstance(event.data, ExternalNotification):
        raise MalformedConstituent(index, event.id, f"a {event.type} is not a notification wake")
    wake = Wake(event, strict=True)
    with _merging(index, event.id):
        wake.messages  # read for its check alone: a merged constituent's own list is rebuilt below
        body = wake.body
        sender = wake.sender
        return _Constituent(
            index=index,
            event=event,
            wake=wake,
            sender=sender,
            sender_id=wake.sender_id or sender,
            body=body,
            digest_body=wake.digest_body,
            partition_key=wake.partition_key,
            conversation=wake.conversation_identity,
        )


def _chronological(items: Sequence[_Constituent]) -> list[_Constituent]:
    return sorted(items, key=lambda c: (c.event.timestamp, c.index))


def _merge_positions(items: Sequence[_Constituent]) -> tuple[str, list[str]]:
    positions = [p for p in (c.wake.trigger_position for c in items) if p]
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


def merge(unique: Sequence[Event]) -> Event:
    """Merge one partition's distinct wakes (no two with one id; at least one) into ONE trigger.

    A single event is returned as it is: single-event partitions follow the
    pre-batching dispatch path. Raises :class:`MalformedConstituent` for a
    constituent that cannot be merged — not a wake, a non-string body, or a
    partition key or conversation identity that disagrees with the others (a
    partition has one identity, and a merged trigger filed under whichever
    event sorted first would be a lie).
    """
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
        ev, wake = c.event, c.wake
        with _merging(c.index, ev.id):
            messages.append(
                {
                    MESSAGE_EVENT_ID: ev.id,
                    MESSAGE_TIMESTAMP: format_timestamp(ev.timestamp),
                    MESSAGE_SOURCE: ev.source,
                    SENDER: c.sender,
                    SENDER_ID: c.sender_id,
                    BODY: c.body,
                    EVENT_NAME: wake.event_name,
                    TITLE: wake.title,
                    URL: wake.url,
                    DELIVERY_ID: wake.delivery_id,
                    MESSAGE_ID: wake.message_id,
                    RECON: wake.recon,
                    DIRECT: wake.direct,
                    MESSAGE_COLLAPSED: effective[c.index][1],
                }
            )

    deepest = max(ordered, key=lambda c: (c.event.delegation_depth, -ordered.index(c)))
    position, positions = _merge_positions(ordered)
    ids = [c.event.id for c in ordered]
    latest_ev = latest.event

    payload = dict(latest_ev.payload)
    payload.update(
        {
            PARTITION_KEY: first_key,
            BODY: merged_body,
            SENDER: latest.sender,
            SENDER_ID: latest.sender_id,
            RECON: all(m[RECON] for m in messages),
            DIRECT: any(m[DIRECT] for m in messages),
            COALESCED_COUNT: len(ordered),
            COALESCED_EVENT_IDS: ids,
            DUPLICATES_COLLAPSED: duplicates,
            DELIVERY_IDS: [m[DELIVERY_ID] for m in messages if m[DELIVERY_ID]],
        }
    )
    payload.pop(DIGEST_BODY, None)
    if first_conv:
        payload[CONVERSATION_IDENTITY] = first_conv
    if position:
        payload[TRIGGER_POSITION] = position
        if len(set(positions)) > 1:
            payload[TRIGGER_POSITIONS] = positions

    if isinstance(latest_ev.data, ExternalNotification):
        data = latest_ev.data
    else:
        with _merging(latest.index, latest_ev.id):
            wake = latest.wake
            data = ExternalNotification(
                seat=wake.seat, event_name=wake.event_name, delivery_id=wake.delivery_id, title=wake.title, url=wake.url
            )
    data = replace(data, body=merged_body, sender=latest.sender, messages=messages)

    return Event(
        type=latest_ev.type if latest_ev.data is not None else ExternalNotification.event_type,
        payload=payload,
        id=coalesced_trigger_id(ids),
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


__all__ = [
    "COLLAPSED_DUPLICATE",
    "COLLAPSED_SUPERSEDED",
    "DUPLICATE_MARKER",
    "MalformedConstituent",
    "merge",
]
