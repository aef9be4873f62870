"""Conversation sessions: the company file's ``episodes`` key, how much of a conversation's past its next turn is given.

At a turn's end the seat writes an episode for the conversation it worked
(what it was asked, the tools it called, what it answered, how it ended), and
that conversation's next turn opens with its recent ones (:mod:`seats.episodes`).
Two numbers bound what that costs, since the opening prompt is re-sent on every
round of a turn: ``recent``, how many of the newest episodes a turn is given
(0 gives none, while episodes are still written and listed), and
``max_bytes``, what one episode may weigh as the model reads it (its texts are
cut to fit). Read per turn from the active company, so an applied revision
changes the very next turn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from crewlet.company.fields import _known, _mapping, _number

#: The company-file key.
EPISODES_KEY = "episodes"
RECENT = "recent"
MAX_BYTES = "max_bytes"
EPISODES_KEYS = (RECENT, MAX_BYTES)
#: How many episodes a turn may be given: each is re-sent on every round of the turn.
RECENT_RANGE = (0, 20)
#: What one episode may weigh, in bytes of UTF-8: room for an ask, a tool list and an answer, and no whole transcript.
MAX_BYTES_RANGE = (256, 16384)
DEFAULT_RECENT = 5
DEFAULT_MAX_BYTES = 2048


@dataclass(frozen=True)
class EpisodeSettings:
    """``episodes``: how many recent episodes a conversation's next turn is given, and the most one weighs."""

    recent: int = DEFAULT_RECENT
    max_bytes: int = DEFAULT_MAX_BYTES


DEFAULT_EPISODES = EpisodeSettings()


def parse_episodes(value: Any, source: Optional[str]) -> EpisodeSettings:
    """``episodes: {recent: 0-20, max_bytes: 256-16384}``; absent is the defaults."""
    if value is None:
        return DEFAULT_EPISODES
    body = _mapping(value, EPISODES_KEY, source)
    _known(body, f"{EPISODES_KEY}.", EPISODES_KEYS, source)
    recent = _number(body.get(RECENT, DEFAULT_RECENT), f"{EPISODES_KEY}.{RECENT}", *RECENT_RANGE, True, source)
    max_bytes = _number(body.get(MAX_BYTES, DEFAULT_MAX_BYTES), f"{EPISODES_KEY}.{MAX_BYTES}", *MAX_BYTES_RANGE, True, source)
    return EpisodeSettings(recent=recent, max_bytes=max_bytes)


__all__ = [
    "DEFAULT_EPISODES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_RECENT",
    "EPISODES_KEY",
    "EpisodeSettings",
    "MAX_BYTES_RANGE",
    "RECENT_RANGE",
    "parse_episodes",
]
