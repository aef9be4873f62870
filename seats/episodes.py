"""Conversation sessions: what a seat did on a conversation, carried into that conversation's next turn.

At a turn's end (:func:`remember`) an episode is written for (seat,
conversation identity) — what the seat was asked, the tools it called, what
it answered, how the turn ended — and ``episode_written`` is published once
the row is committed. The conversation's next turn opens (:func:`recall`)
with its recent episodes, oldest first, in a block the model can tell apart
from the message that woke it; the block is part of the turn's opening user
text, so ``prompt.size`` counts it in ``user_bytes``.

The identity is the wake's ``conversation_identity`` (a turn's
``conversation_key``): a DM is one conversation however it is threaded
(``slack:D1``), a channel thread is its own (``slack:C9:1718.001``), a
tracker item is its key. A turn with no identity, or the ``event:{uuid}``
fallback, stores and reads nothing: no later message could reproduce its key.

The rows live in the coordination store (:class:`~seats.episode_models.Episode`),
because the next turn may run on another node of the fleet. What one costs is
the company's ``episodes`` key (:mod:`crewlet.company.episodes`): how many a
turn is given, and the most one weighs as the model reads it. A conversation
keeps its newest :data:`KEPT_PER_CONVERSATION`; a retired seat's are purged
with its mailboxes (:func:`purge`). Neither reading nor writing one ever fails
a turn: a store that is away costs the turn its past, logged.
"""
from __future__ import annotations

import logging
import uuid
from datetime import timezone as dt_timezone
from typing import Any, Iterable, Optional, Sequence

from django.db import transaction

from crewlet.base.db import in_store
from crewlet.base.jsontext import storable
from crewlet.base.logfmt import short_reason
from crewlet.company.episodes import EpisodeSettings
from crewlet.company.org import Organization, Seat
from crewlet.events.types import EpisodeWritten
from crewlet.queue.contract import UNIQUE_KEY_PREFIX
from seats.episode_models import CONVERSATION_MAX_LENGTH, Episode
from seats.tools.mcp import clip
from seats.turn_types import Emit, Trigger, TurnResult, TurnState, TurnTags

log = logging.getLogger("crewlet.seats.episodes")

#: The most episodes one (seat, conversation) keeps: older ones are deleted as newer ones are written.
KEPT_PER_CONVERSATION = 50
#: The most bytes of UTF-8 a conversation identity may have to be filed (what the store's index holds).
CONVERSATION_MAX_BYTES = 2 * CONVERSATION_MAX_LENGTH
#: How much of a turn's error an episode keeps.
ERROR_MAX_BYTES = 300
#: The share of an episode's bytes its tools line may take before the rest are counted rather than named.
TOOLS_SHARE = 4

BLOCK_OPEN = (
    "[Your earlier turns in this conversation ({conversation}), oldest first: what you were asked, "
    "the tools you called, what you answered and how each turn ended. The message you are answering now "
    "follows the block.]"
)
BLOCK_CLOSE = "[End of your earlier turns. The message you are answering now:]"


def remembered(conversation: str) -> bool:
    """Whether episodes are kept for ``conversation``: a real identity a later message can reproduce, and one the store can index."""
    return (
        bool(conversation)
        and not conversation.startswith(UNIQUE_KEY_PREFIX)
        and len(conversation) <= CONVERSATION_MAX_LENGTH
        and len(conversation.encode("utf-8", "backslashreplace")) <= CONVERSATION_MAX_BYTES
    )


# -- one episode as the model reads it -----------------------------------------------------------


def _tools_line(tools: Sequence[dict[str, Any]]) -> str:
    if not tools:
        return "none"
    return ", ".join(f"{t.get('name', '')}{'' if t.get('ok') else ' (failed)'}" for t in tools)


def _head(episode: Episode) -> str:
    when = episode.written_at.astimezone(dt_timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ended = episode.outcome + (f": {episode.error}" if episode.error else "")
    return f"- {when}, turn {episode.turn_id}, {ended}\n  tools: {_tools_line(episode.tools)}"


_ASKED = "\n  asked: "
_ANSWERED = "\n  answered: "


def render(episode: Episode) -> str:
    """One episode as the block shows it: when and how it ended, its tools, what was asked and answered."""
    return f"{_head(episode)}{_ASKED}{episode.asked}{_ANSWERED}{episode.answered}"


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _tools_within(tools: list[dict[str, Any]], max_bytes: int) -> list[dict[str, Any]]:
    """The first calls while their line fits ``max_bytes``, the rest counted in one last entry."""
    for named in range(len(tools), -1, -1):
        left = len(tools) - named
        kept = tools[:named] + ([{"name": f"…and {left} more", "ok": True}] if left else [])
        if _size(_tools_line(kept)) <= max_bytes:
            return kept
    return []


#: Below this many bytes a cut text is left out whole: the cut's own note would not fit.
_CUT_MIN_BYTES = 32


def _cut(text: str, max_bytes: int) -> str:
    if _size(text) <= max_bytes:
        return text
    return clip(text, max_bytes) if max_bytes >= _CUT_MIN_BYTES else ""


def fitted(episode: Episode, max_bytes: int) -> Episode:
    """``episode`` with its tools line and texts cut so that :func:`render` is at most ``max_bytes`` bytes.

    The head (when, how it ended, the tools) goes first; what is left is
    shared between what was asked and what was answered, half each, a text
    shorter than its half leaving the rest to the other.
    """
    episode.error = _cut(episode.error, min(ERROR_MAX_BYTES, max_bytes // TOOLS_SHARE))
    episode.tools = _tools_within(list(episode.tools), max_bytes // TOOLS_SHARE)
    frame = _size(_ASKED) + _size(_ANSWERED)
    if _size(_head(episode)) + frame > max_bytes:  # the smallest size and the longest head: the error gives way
        episode.error = ""
    room = max_bytes - _size(_head(episode)) - frame
    asked, answered = _size(episode.asked), _size(episode.answered)
    if asked + answered > room:
        half = max(0, room // 2)
        episode.asked = _cut(episode.asked, asked if asked <= half else max(half, room - answered))
        episode.answered = _cut(episode.answered, max(0, room - _size(episode.asked)))
    return episode


def block(conversation: str, episodes: Sequence[Episode]) -> str:
    """The conversation's recent episodes as one block set apart from the trigger; empty without any."""
    if not episodes:
        return ""
    lines = [BLOCK_OPEN.format(conversation=conversation), *(render(e) for e in episodes), BLOCK_CLOSE]
    return "\n".join(lines)


# -- the store -------------------------------------------------------------------------------------


def recent(seat: str, conversation: str, count: int) -> list[Episode]:
    """The newest ``count`` episodes of (seat, conversation), oldest first."""
    if count <= 0 or not remembered(conversation):
        return []
    rows = list(Episode.objects.filter(seat=seat, conversation=conversation).order_by("-written_at", "-id")[:count])
    return rows[::-1]


def of_seat(seat: str, limit: int) -> list[Episode]:
    """The seat's newest ``limit`` episodes over all its conversations, newest first (its dashboard page)."""
    return list(Episode.objects.filter(seat=seat).order_by("-written_at", "-id")[:limit])


def write(episode: Episode) -> Episode:
    """Store ``episode`` and keep its conversation's newest :data:`KEPT_PER_CONVERSATION`, in one transaction."""
    with transaction.atomic(using="default"):
        episode.save(using="default")
        older = (
            Episode.objects.filter(seat=episode.seat, conversation=episode.conversation)
            .order_by("-written_at", "-id")
            .values_list("pk", flat=True)[KEPT_PER_CONVERSATION:]
        )
        stale = list(older)
        if stale:
            Episode.objects.filter(pk__in=stale).delete()
    return episode


def purge(handles: Iterable[str]) -> int:
    """Delete every episode about these seats (their retirement); how many went."""
    wanted = sorted(set(handles))
    if not wanted:
        return 0
    deleted, _ = Episode.objects.filter(seat__in=wanted).delete()
    return deleted


arecent = in_store(recent)
awrite = in_store(write)
apurge = in_store(purge)


# -- a turn's two calls ---------------------------------------------------------------------------


async def recall(org: Organization, seat: Seat, trigger: Trigger, user: str) -> str:
    """``user`` opened by its conversation's recent episodes (the company's ``episodes.recent``); ``user`` when none.

    A store that cannot be read costs the turn its past, never the turn.
    """
    settings: EpisodeSettings = org.episodes
    conversation = trigger.conversation_key
    if settings.recent <= 0 or not remembered(conversation):
        return user
    try:
        episodes = await arecent(seat.handle, conversation, settings.recent)
    except Exception as exc:
        log.warning(
            "episodes_unread",
            extra={"seat": seat.handle, "turn_id": trigger.turn_id, "conversation": conversation, "error": short_reason(exc)},
        )
        return user
    given = block(conversation, [fitted(e, settings.max_bytes) for e in episodes])
    return f"{given}\n\n{user}" if given else user


def episode_of(loop: TurnState, result: TurnResult, max_bytes: int) -> Episode:
    """The turn as an episode, cut to ``max_bytes``: the trigger it was asked, its calls in order, its answer, its end."""
    tools = [{"name": storable(str(c.get("name", ""))), "ok": bool(c.get("ok"))} for c in result.tool_calls]
    return fitted(
        Episode(
            episode_id=str(uuid.uuid4()),
            seat=loop.seat.handle,
            conversation=loop.trigger.conversation_key,
            turn_id=loop.trigger.turn_id,
            asked=storable(loop.trigger.prompt()),
            answered=storable(result.response),
            tools=tools,
            outcome=result.outcome,
            error=storable(result.error if not result.ok else ""),
        ),
        max_bytes,
    )


async def remember(emit: Emit, loop: TurnState, result: TurnResult, tags: TurnTags) -> Optional[Episode]:
    """Write the turn's episode and, once it is committed, publish ``episode_written``; None when nothing is kept.

    Nothing is kept for a turn without a real conversation, or one that never
    reached a model (no round ran: nothing was done). A write that fails is
    logged; the turn has ended either way.
    """
    if not remembered(loop.trigger.conversation_key) or not result.rounds:
        return None
    episode = episode_of(loop, result, loop.org.episodes.max_bytes)
    try:
        await awrite(episode)
    except Exception as exc:
        log.warning(
            "episode_unwritten",
            extra={"seat": episode.seat, "turn_id": episode.turn_id, "conversation": episode.conversation, "error": short_reason(exc)},
        )
        return None
    await emit(EpisodeWritten(**tags, episode_id=episode.episode_id))
    log.info("episode_written", extra={"seat": episode.seat, "turn_id": episode.turn_id, "conversation": episode.conversation})
    return episode


__all__ = [
    "BLOCK_CLOSE",
    "BLOCK_OPEN",
    "KEPT_PER_CONVERSATION",
    "apurge",
    "arecent",
    "awrite",
    "block",
    "episode_of",
    "fitted",
    "of_seat",
    "purge",
    "recall",
    "recent",
    "remember",
    "remembered",
    "render",
    "write",
]
