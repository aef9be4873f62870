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

from pydantic import Field

from crewlet.company.shape import FileModel, read_section

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


class EpisodesFile(FileModel):
    """The ``episodes`` section's shape."""

    recent: int = Field(default=DEFAULT_RECENT, ge=RECENT_RANGE[0], le=RECENT_RANGE[1])
    max_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=MAX_BYTES_RANGE[0], le=MAX_BYTES_RANGE[1])


def parse_episodes(value: Any, source: Optional[str]) -> EpisodeSettings:
    """``episodes: {recent: 0-20, max_bytes: 256-16384}``; absent is the defaults."""
    if value is None:
        return DEFAULT_EPISODES
    body = read_section(EpisodesFile, value, EPISODES_KEY, source)
    return EpisodeSettings(recent=body.recent, max_bytes=body.max_bytes)


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
