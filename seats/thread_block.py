"""The thread block: the conversation a chat or tracker trigger belongs to, read as its turn begins and shown beside it.

Design: "A failed turn does not hold its conversation back" and "And the
failed one is not answered twice". A newer message's turn runs before an
older one whose turn failed; reading the thread at its start, it sees that
message still waiting and answers the thread as it stands. So:

* the turn is shown its conversation (:mod:`seats.thread_read`, with the
  seat's own credentials) as a block after the message that woke it, each
  line marked — the seat's own (``you``), the messages still waiting for it,
  the one that woke it — so the model tells the conversation from the
  trigger;
* bounded by the company's ``thread_block`` (``max_messages``,
  ``max_bytes``; :mod:`crewlet.company.thread_bounds`), newest kept, and the
  block says how many it left out;
* it reports the waiting messages it showed — somebody else's, after the
  seat's own last reply, before the message that woke it, never one a bound
  dropped — as :attr:`ThreadBlock.waiting`, the identities the inbox writes to
  the completion ledger beside the turn's own triggers once it completes, so
  the failed message's redelivery is dropped as answered in its thread;
* a read that fails (or outlasts ``thread_block.timeout_s``) does not fail
  the turn: it runs without the block, and its phase says so
  (``agent_phase_completed.thread_block``: ``status``, ``shown``,
  ``left_out``, ``waiting``, ``error``).

A trigger from no conversation (a schedule, an A2A ask, a task) has no block
and its phase no ``thread_block``. A message at the top of a shared channel
is its own thread: nothing before it is shown waiting, so a failed
top-level message before it is still owed its own turn.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from crewlet.base.logfmt import short_reason
from crewlet.base.redact import redact
from crewlet.company.org import Organization, Seat
from crewlet.company.thread_bounds import ThreadBounds
from crewlet.events.backend_ids import message_identity
from seats.ledger import storable, trigger_identity
from seats.reply_target import SURFACE, target_of
from seats.thread_read import READERS, Conversation, Reader, ThreadMessage, ThreadReadError, seat_access
from seats.turn_types import Trigger
from seats.wake import MESSAGE_ID, MESSAGE_SOURCE, Wake

log = logging.getLogger("crewlet.seats.thread_block")

#: ``agent_phase_completed.thread_block.status``: read and shown; could not be read; nothing read (no grant, no token).
STATUS_READ = "read"
STATUS_FAILED = "failed"
STATUS_UNREAD = "unread"
#: How each line of the block is marked.
MARK_OWN = "you"
MARK_WAITING = "waiting"
MARK_WOKE = "this message woke you"
#: What a message cut to fit the byte bound ends with.
CUT_MARK = " …[cut]"


@dataclass(frozen=True)
class ThreadBlock:
    """What a turn was shown of its conversation: the block's text, the waiting messages it showed, its phase record."""

    text: str = ""
    #: The ledger identities of the waiting messages the block showed (oldest first).
    waiting: tuple[str, ...] = ()
    #: ``agent_phase_completed.thread_block``; None for a trigger from no conversation.
    record: Optional[dict[str, Any]] = None


NO_BLOCK = ThreadBlock()


def bounded(messages: Sequence[ThreadMessage], bounds: ThreadBounds) -> list[ThreadMessage]:
    """The newest messages within ``max_messages`` and ``max_bytes`` of text (UTF-8), oldest first.

    The newest message is always kept, its text cut to the byte bound when
    it alone exceeds it; an older one that does not fit ends the block.
    """
    kept: list[ThreadMessage] = []
    spent = 0
    for message in reversed(messages):
        if len(kept) >= bounds.max_messages:
            break
        size = len(message.text.encode("utf-8"))
        if spent + size > bounds.max_bytes:
            if kept:
                break
            cut = message.text.encode("utf-8")[: max(0, bounds.max_bytes - len(CUT_MARK.encode()))].decode("utf-8", "ignore")
            message = ThreadMessage(message.identity, message.author, cut + CUT_MARK, message.own)
            size = bounds.max_bytes
        kept.append(message)
        spent += size
    kept.reverse()
    return kept


def woke_by(trigger: Trigger) -> set[str]:
    """The ledger identities of the messages that woke the turn: each event's, and each constituent's of a merged one."""
    found = set()
    for ev in trigger.events:
        found.add(trigger_identity(ev))
        for entry in Wake(ev).messages:
            message_id = entry.get(MESSAGE_ID) if isinstance(entry, dict) else None
            if isinstance(message_id, (str, int)) and not isinstance(message_id, bool) and str(message_id).strip():
                source = entry.get(MESSAGE_SOURCE) or ev.source
                found.add(storable(message_identity(str(source), str(message_id).strip()))[:255])
    return found


def waiting(kept: Sequence[ThreadMessage], woke: set[str]) -> list[ThreadMessage]:
    """Somebody else's messages after the seat's own last reply and before the first one that woke the turn.

    Empty when no message that woke it is among ``kept``: a message the block
    cannot place before it is never taken as answered.
    """
    at = next((i for i, m in enumerate(kept) if m.identity in woke), None)
    if at is None:
        return []
    last_own = max((i for i, m in enumerate(kept[:at]) if m.own), default=-1)
    return [m for m in kept[last_own + 1: at] if not m.own]


def render(where: str, kept: Sequence[ThreadMessage], left_out: Optional[int], waits: set[str], woke: set[str]) -> str:
    """The block as the model reads it: a lead line saying what it is and what it left out, then one line per message."""
    if left_out is None:
        omitted = "; earlier messages left out"
    else:
        omitted = f"; {left_out} earlier message{'s' if left_out != 1 else ''} left out" if left_out else ""
    lead = (
        f"The conversation the message above belongs to ({where}), as it stood when this turn began, oldest first"
        f"{omitted}. Messages marked {MARK_WAITING} came after your last reply and are not answered yet: "
        "answer the conversation as it stands, them included."
    )
    lines = []
    for m in kept:
        mark = MARK_OWN if m.own else MARK_WOKE if m.identity in woke else MARK_WAITING if m.identity in waits else ""
        who = m.author or "someone"
        lines.append(f"[{who}{' | ' + mark if mark else ''}] {m.text}")
    return storable(lead + "\n" + "\n".join(lines))


def shown(conversation: Conversation, trigger: Trigger, bounds: ThreadBounds) -> ThreadBlock:
    """The block of a conversation read whole (pure: what :func:`read_thread_block` makes of a read)."""
    kept = bounded(conversation.messages, bounds)
    woke = woke_by(trigger)
    waits = [m.identity for m in waiting(kept, woke)]
    dropped = len(conversation.messages) - len(kept)
    left_out = None if conversation.older is None else dropped + conversation.older
    record = {"surface": conversation.surface, "status": STATUS_READ, "shown": len(kept), "left_out": left_out, "waiting": waits}
    if not kept:
        return ThreadBlock(record=record)
    text = render(trigger.partition_key, kept, left_out, set(waits), woke)
    return ThreadBlock(text=text, waiting=tuple(waits), record=record)


def conversation_target(trigger: Trigger) -> Optional[dict[str, Any]]:
    """What to read: the trigger's reply target, except that a Slack direct message at its channel's top reads the channel."""
    target = target_of(trigger)
    if target is None or target[SURFACE] not in READERS:
        return None
    if target[SURFACE] == "slack":
        if "timestamp" not in target:
            return None  # a slash command or a click: no message of its own, no conversation to read
        if len(trigger.partition_key.split(":")) == 2:
            target.pop("thread_ts", None)  # slack:<D…>: a direct message's line, not one message's thread
    return target


async def read_thread_block(
    org: Organization,
    seat: Seat,
    trigger: Trigger,
    *,
    environ: Optional[Mapping[str, str]] = None,
    readers: Mapping[str, Reader] = READERS,
) -> ThreadBlock:
    """The turn's thread block; never raises: a read that fails is a block with nothing shown and a phase that says why."""
    target = conversation_target(trigger)
    if target is None:
        return NO_BLOCK
    surface = target[SURFACE]
    bounds = org.thread_block
    access = seat_access(org, seat, surface, os.environ if environ is None else environ)
    if access is None:
        why = f"the seat is granted no builtin {surface} server with a token set"
        return ThreadBlock(record={"surface": surface, "status": STATUS_UNREAD, "error": why})
    read = readers[surface]
    try:
        conversation = await asyncio.wait_for(
            asyncio.to_thread(read, access, seat, target, bounds.max_messages, bounds.timeout_s), timeout=bounds.timeout_s
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if isinstance(exc, TimeoutError):
            error = f"the {surface} conversation was not read within {bounds.timeout_s:g}s (thread_block.timeout_s)"
        elif isinstance(exc, ThreadReadError):
            error = str(exc)
        else:
            error = short_reason(exc, 500)
        error = redact(error)[:500]
        log.warning("thread_block_unread", extra={"seat": seat.handle, "turn_id": trigger.turn_id, "surface": surface, "error": error})
        return ThreadBlock(record={"surface": surface, "status": STATUS_FAILED, "error": error})
    block = shown(conversation, trigger, bounds)
    log.info(
        "thread_block_read",
        extra={"seat": seat.handle, "turn_id": trigger.turn_id, "surface": surface, "shown": (block.record or {}).get("shown"),
               "waiting": len(block.waiting)},
    )
    return block


def with_thread_block(user: str, block: ThreadBlock) -> str:
    """The turn's message with its thread block after it (as it was, when there is none)."""
    return f"{user}\n\n{block.text}" if block.text else user


__all__ = [
    "MARK_OWN",
    "MARK_WAITING",
    "MARK_WOKE",
    "NO_BLOCK",
    "STATUS_FAILED",
    "STATUS_READ",
    "STATUS_UNREAD",
    "ThreadBlock",
    "bounded",
    "conversation_target",
    "read_thread_block",
    "shown",
    "waiting",
    "with_thread_block",
]
