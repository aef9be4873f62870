"""Ephemeral A2A channels: ``ask``, ``answer``, ``sweep`` (design: Ephemeral A2A channels).

* :func:`ask` opens a channel record, publishes ``a2a_channel_opened`` and puts
  an ``a2a_request`` wake on the TARGET's inbox (the brief, the channel id, the
  asker, and the chain of asks in the envelope). The wake names no partition
  key, so it keys on its own id and is never coalesced.
* :func:`answer` is called by the answering turn's hook: only the target may
  answer, a closed channel bounces saying so, an unknown id says it is
  unknown. It publishes the ``a2a_message`` wake on the ASKER's inbox (under an
  id derived from the channel, so a repeat is the ledger's skip, never a
  second turn) and ``a2a_message_sent``, then closes the channel by
  compare-and-set and publishes ``a2a_channel_closed`` naming the answerer.
* :func:`sweep` is the maintenance duty: an open channel idle past an hour is
  closed with NO ``closed_by`` / ``turn_id`` / ``work_key`` (the dashboard's
  "system closed A2A channel"), and a closed row is deleted seven days after
  it closed. It is a decision on the record's state, never a bucket expiry: an
  open channel inside the hour is never touched.

Both timestamps of a record come from the coordination store's own clock
(``Now()``) unless a test injects ``now``, so ``open_seconds`` is never two
nodes' skew.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Optional, Sequence, TypedDict

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from a2a.models import Channel
from crewlet import events
from crewlet.events import Event
from crewlet.queue.emit import Emitter
from crewlet.events.types import (
    A2AChannelClosed,
    A2AChannelOpened,
    A2AMessage,
    A2AMessageSent,
    A2ARequest,
    TurnGuardBreach,
)
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.events.tracing import Trace, trace_of
from crewlet.base.db import in_store

log = logging.getLogger("crewlet.a2a")

#: Neither is configurable (design); tests inject their own through the keyword arguments.
IDLE_CLOSE_S = 3600.0
DELETE_AFTER_S = 7 * 86400.0
#: The deepest a chain of asks may go: a turn at this depth may not ask again.
A2A_MAX_DEPTH = 3
#: The guard ``turn.guard_breach`` names when the cap stops an ask.
GUARD_DEPTH_CAP = "depth_cap"
#: Namespace of the answer wake's id: one channel, one answer id, however often it is sent.
_ANSWER_NS = uuid.UUID("6f1f8f5e-6a52-4c3e-9a7a-2a2a0a2a0a2a")
#: Namespace of the ids an ask derives: its channel's (from a caller's request id) and its two events'.
_ASK_NS = uuid.UUID("0c5d4f7a-3b1e-4d9a-8f26-5a2c1e7b9d40")


class A2AError(Exception):
    """An ask or an answer refused; ``reason`` says why in a person's words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownChannel(A2AError):
    pass


class ChannelClosed(A2AError):
    pass


class NotTheAnswerer(A2AError):
    pass


class DepthCapExceeded(A2AError):
    pass


class RequestIdReused(A2AError):
    """A request id already opened a channel with a different asker, target or brief."""


def conversation_key(channel_id: Any) -> str:
    """Both hops of a channel are one conversation: what the turns on either side are tagged with."""
    return f"a2a:{channel_id}"


def answer_event_id(channel_id: Any) -> str:
    return str(uuid.uuid5(_ANSWER_NS, str(channel_id)))


def ask_channel_id(asker: str, request_id: str) -> str:
    """The channel an ask carrying ``request_id`` opens: a retry of that ask names the same channel."""
    return str(uuid.uuid5(_ASK_NS, f"request\n{asker}\n{request_id}"))


def _ask_event_id(channel_id: str, which: str) -> str:
    """The id of an ask's ``which`` event: one per channel, so an ask completed twice is one event each."""
    return str(uuid.uuid5(_ASK_NS, f"{which}\n{channel_id}"))


class _Delegation(TypedDict):
    """The envelope fields every event of one A2A exchange carries (``events.new``'s keywords)."""

    delegation_depth: int
    parent_turn_id: str
    delegation_chain: list[str]


@dataclass(frozen=True)
class SweepReport:
    closed: list[str]
    deleted: int


# -- the store ------------------------------------------------------------------------------


def _stamp(now: Optional[datetime]) -> Any:
    return now if now is not None else Now()


@in_store
def _open(
    asker: str,
    target: str,
    brief: str,
    asker_turn_id: str,
    depth: int,
    chain: list[str],
    now: Optional[datetime],
    channel_id: Optional[str] = None,
    on_behalf_of: Optional[str] = None,
) -> tuple[Channel, bool]:
    """The channel row and whether this call created it (False: ``channel_id`` was opened before)."""
    fields = {
        "asker": asker,
        "target": target,
        "brief": brief,
        "asker_turn_id": asker_turn_id,
        "delegation_depth": depth,
        "delegation_chain": chain,
        "opened_at": _stamp(now),
        "on_behalf_of": uuid.UUID(on_behalf_of) if on_behalf_of else None,
    }
    if channel_id is None:
        row, created = Channel.objects.create(**fields), True
    else:
        with transaction.atomic(using="default"):
            row, created = Channel.objects.get_or_create(pk=uuid.UUID(channel_id), defaults=fields)
    row.refresh_from_db()
    return row, created


@in_store
def _get(channel_id: str) -> Optional[Channel]:
    try:
        return Channel.objects.filter(pk=uuid.UUID(str(channel_id))).first()
    except (ValueError, TypeError):
        return None


@in_store
def asked_on_behalf(channel_id: str, asker: str, turn_id: str) -> bool:
    """Whether ``asker``'s turn ``turn_id`` asked on behalf of ``channel_id``: then that turn was not its answer."""
    try:
        owed = uuid.UUID(str(channel_id))
    except (ValueError, TypeError):
        return False
    return Channel.objects.filter(on_behalf_of=owed, asker=asker, asker_turn_id=turn_id).exists()


@in_store
def _close(channel_id: Any, *, closed_by: str, turn_id: str, work_key: str, messages: int, now: Optional[datetime]) -> Optional[Channel]:
    """The compare-and-set: only the caller whose update flips open → closed gets the row back."""
    with transaction.atomic(using="default"):
        won = Channel.objects.filter(pk=channel_id, state=Channel.OPEN).update(
            state=Channel.CLOSED,
            closed_at=_stamp(now),
            closed_by=closed_by,
            turn_id=turn_id,
            work_key=work_key,
            message_count=F("message_count") + messages,
        )
    if not won:
        return None
    return Channel.objects.get(pk=channel_id)


@in_store
def _idle_open(cutoff: Any) -> list[str]:
    return [str(pk) for pk in Channel.objects.filter(state=Channel.OPEN, opened_at__lt=cutoff).values_list("pk", flat=True)]


@in_store
def _delete_closed(cutoff: Any) -> int:
    deleted, _ = Channel.objects.filter(state=Channel.CLOSED, closed_at__lt=cutoff).delete()
    return deleted


# -- publishing -------------------------------------------------------------------------------


async def _publish(queue: EventQueue, topic: str, event: Event) -> None:
    await queue.publish(topic, event)


async def _wake(
    queue: EventQueue, body: A2ARequest | A2AMessage, text: str, trace: Trace, event_id: str, envelope: _Delegation
) -> None:
    """Put ``body`` in ``body.to_seat``'s inbox as a wake.

    The extras are what the inbox reads off any wake — who sent it, what it
    says, which conversation it is in — here the body's own sender, ``text``
    and channel conversation. No partition_key: the wake keys on its own id
    and is never coalesced.
    """
    extras = {"sender": body.from_seat, "body": text, "conversation_identity": body.conversation_key}
    wake = events.new(body, trace, extras=extras, event_id=event_id, **envelope)
    await _publish(queue, topics.agent_inbox(body.to_seat), wake)


def _closed_body(row: Channel) -> A2AChannelClosed:
    return A2AChannelClosed(
        channel_id=str(row.id),
        participants=row.participants,
        message_count=row.message_count,
        open_seconds=row.open_seconds,
        closed_by=row.closed_by,
        turn_id=row.turn_id,
        work_key=row.work_key,
    )


def _request_of(row: Channel, *, role: str = "", agent_id: str = "") -> A2ARequest:
    """The ask a channel carries, as its ``a2a_request`` wake says it (the asking turn's role and agent id given)."""
    cid = str(row.id)
    return A2ARequest(
        channel_id=cid,
        from_seat=row.asker,
        to_seat=row.target,
        brief=row.brief,
        turn_id=row.asker_turn_id,
        conversation_key=conversation_key(cid),
        role=role,
        agent_id=agent_id,
    )


async def _owed_ask(row: Channel) -> dict[str, Any]:
    """``a2a_message.owed_ask`` for an answer on ``row``: the ask its asker still owes, when it asked on behalf of one."""
    if not row.on_behalf_of:
        return {}
    owed = await _get(str(row.on_behalf_of))
    return A2AMessage.owing(_request_of(owed)) if owed is not None else {}


# -- the verbs ----------------------------------------------------------------------------------


async def ask(
    queue: EventQueue,
    from_seat: str,
    to_handle: str,
    brief: str,
    *,
    trace: Optional[Trace] = None,
    parent_turn_id: str = "",
    delegation_depth: int = 0,
    delegation_chain: Sequence[str] = (),
    role: str = "",
    agent_id: str = "",
    max_depth: Optional[int] = None,
    now: Optional[datetime] = None,
    request_id: str = "",
    on_behalf_of: Optional[str] = None,
) -> Channel:
    """Open a channel from ``from_seat`` (asking from a turn at ``delegation_depth``) to ``to_handle``.

    ``on_behalf_of`` is the channel the asking turn was answering: the row
    keeps it, so the turn that this channel's answer wakes — on whichever
    node, after whatever redelivery — answers that channel in turn.

    A turn at or past the cap does not ask: ``turn.guard_breach`` (``depth_cap``)
    is published for it and :class:`DepthCapExceeded` raised.

    With a ``request_id`` the ask is idempotent: the channel's id derives from
    the asker and the request id, so a retry (after a timeout, or a lost
    answer) finds the channel the first attempt opened instead of opening a
    second one. A retry of a channel still open publishes its two events again
    under their fixed ids — completing an attempt that stopped between the row
    and the publishes; where the first attempt did publish, the event store
    keeps one row per id and the target's inbox drops the same-id wake (or the
    ledger skips it once worked). A retry of a closed channel publishes
    nothing. The same request id with another target or brief is
    :class:`RequestIdReused`.
    """
    trace = trace or trace_of()
    cap = A2A_MAX_DEPTH if max_depth is None else max_depth
    if not from_seat or not to_handle:
        raise A2AError("an ask needs both the asking seat and the seat asked")
    if from_seat == to_handle:
        raise A2AError(f"{from_seat} cannot open an A2A channel to itself")
    if delegation_depth >= cap:
        detail = (
            f"{from_seat} asked {to_handle} at delegation depth {delegation_depth}; "
            f"the cap is {cap} (chain: {' → '.join([*delegation_chain, from_seat])})"
        )
        breach = events.new(
            TurnGuardBreach(seat=from_seat, role=role, agent_id=agent_id, turn_id=parent_turn_id, guard=GUARD_DEPTH_CAP, detail=detail),
            trace,
            delegation_depth=delegation_depth,
            parent_turn_id=parent_turn_id,
            delegation_chain=list(delegation_chain),
        )
        await _publish(queue, topics.event(breach.type), breach)
        log.warning("a2a_depth_cap", extra={"seat": from_seat, "target": to_handle, "depth": delegation_depth, "cap": cap})
        raise DepthCapExceeded(detail)

    chain = list(delegation_chain)
    wanted = ask_channel_id(from_seat, request_id) if request_id else None
    row, created = await _open(
        from_seat, to_handle, brief, parent_turn_id, delegation_depth, chain, now, wanted, on_behalf_of
    )
    cid = str(row.id)
    if not created:
        if (row.asker, row.target, row.brief) != (from_seat, to_handle, brief):
            raise RequestIdReused(
                f"request_id {request_id!r} already opened A2A channel {cid} "
                f"({row.asker} → {row.target}) with another target or brief"
            )
        if row.state != Channel.OPEN:
            log.info("a2a_ask_repeated", extra={"channel_id": cid, "asker": from_seat, "state": row.state})
            return row
    envelope: _Delegation = {
        "delegation_depth": delegation_depth + 1,
        "parent_turn_id": parent_turn_id,
        "delegation_chain": [*chain, from_seat],
    }
    opened = events.new(
        A2AChannelOpened(
            channel_id=cid,
            participants=row.participants,
            opened_by=from_seat,
            target=to_handle,
            brief=brief,
            turn_id=parent_turn_id,
            role=role,
            agent_id=agent_id,
        ),
        trace,
        event_id=_ask_event_id(cid, "opened"),
        **envelope,
    )
    await _publish(queue, topics.event(opened.type), opened)
    request = _request_of(row, role=role, agent_id=agent_id)
    await _wake(queue, request, brief, trace, _ask_event_id(cid, "request"), envelope)
    log.info(
        "a2a_channel_opened" if created else "a2a_ask_repeated",
        extra={"channel_id": cid, "asker": from_seat, "target": to_handle},
    )
    return row


async def answer(
    queue: EventQueue,
    channel_id: str,
    answering_seat: str,
    response: str,
    turn_id: str,
    work_key: str,
    *,
    trace: Optional[Trace] = None,
    role: str = "",
    agent_id: str = "",
    now: Optional[datetime] = None,
) -> Channel:
    """The answering turn's response back to the asker, then the close. Refusals raise :class:`A2AError`."""
    trace = trace or trace_of()
    row = await _get(channel_id)
    if row is None:
        raise UnknownChannel(f"no A2A channel {channel_id!r}: the id is unknown")
    cid = str(row.id)
    if row.target != answering_seat:
        raise NotTheAnswerer(f"{answering_seat} may not answer A2A channel {cid}: only {row.target}, the seat asked, may")
    if row.state != Channel.OPEN:
        raise ChannelClosed(_closed_reason(row))
    envelope: _Delegation = {
        "delegation_depth": row.delegation_depth,
        "parent_turn_id": turn_id,
        "delegation_chain": list(row.delegation_chain or []),
    }
    wake = A2AMessage(
        channel_id=cid,
        from_seat=answering_seat,
        to_seat=row.asker,
        message=response,
        turn_id=turn_id,
        conversation_key=conversation_key(cid),
        owed_ask=await _owed_ask(row),
    )
    await _wake(queue, wake, response, trace, answer_event_id(cid), envelope)
    sent = events.new(
        A2AMessageSent(
            channel_id=cid,
            from_seat=answering_seat,
            to_seat=row.asker,
            message=response,
            message_count=row.message_count + 1,
            turn_id=turn_id,
            role=role,
            agent_id=agent_id,
        ),
        trace,
        **envelope,
    )
    await _publish(queue, topics.event(sent.type), sent)
    closed = await _close(row.id, closed_by=answering_seat, turn_id=turn_id, work_key=work_key, messages=1, now=now)
    if closed is None:  # the sweep (or a twin of this turn) closed it between the read and the close
        latest = await _get(cid)
        raise ChannelClosed(_closed_reason(latest or row))
    event = events.new(_closed_body(closed), trace, **envelope)
    await _publish(queue, topics.event(event.type), event)
    log.info("a2a_channel_closed", extra={"channel_id": cid, "closed_by": answering_seat, "turn_id": turn_id})
    return closed


def _closed_reason(row: Channel) -> str:
    by = f"by {row.closed_by}" if row.closed_by else "by the sweep (no answer came)"
    when = f" at {events.format_timestamp(row.closed_at)}" if row.closed_at else ""
    return f"A2A channel {row.id} is closed: it was closed {by}{when}, and a closed channel takes no reply"


async def sweep(
    queue: EventQueue,
    *,
    idle_close_s: float = IDLE_CLOSE_S,
    delete_after_s: float = DELETE_AFTER_S,
    now: Optional[datetime] = None,
    emitter: Optional[Emitter] = None,
) -> SweepReport:
    """Close open channels idle past ``idle_close_s``; delete closed ones ``delete_after_s`` after they closed.

    A close is committed before its ``a2a_channel_closed`` is published and
    no later sweep finds the channel open again, so the record goes through
    ``emitter`` (the caller's, else one for this pass): a broker away for a
    moment is retried rather than costing the record, and the pass goes on.
    """
    base: Any = now if now is not None else Now()
    emitter = emitter or Emitter(queue)
    closed: list[str] = []
    for cid in await _idle_open(base - timedelta(seconds=idle_close_s)):
        row = await _close(cid, closed_by="", turn_id="", work_key="", messages=0, now=now)
        if row is None:  # answered, or another node's sweep, since the list was read
            continue
        await emitter.emit(_closed_body(row), Trace.root(), log_event="a2a_channel_closed_publish_failed", channel_id=cid)
        closed.append(cid)
        log.info("a2a_channel_swept", extra={"channel_id": cid, "open_seconds": row.open_seconds})
    deleted = await _delete_closed(base - timedelta(seconds=delete_after_s))
    if deleted:
        log.info("a2a_channels_deleted", extra={"rows": deleted})
    return SweepReport(closed=closed, deleted=deleted)


__all__ = [
    "A2AError",
    "A2A_MAX_DEPTH",
    "ChannelClosed",
    "DELETE_AFTER_S",
    "DepthCapExceeded",
    "GUARD_DEPTH_CAP",
    "IDLE_CLOSE_S",
    "NotTheAnswerer",
    "RequestIdReused",
    "SweepReport",
    "UnknownChannel",
    "answer",
    "answer_event_id",
    "ask",
    "ask_channel_id",
    "asked_on_behalf",
    "conversation_key",
    "sweep",
]
