"""The company file's ``thread_block``: how much of its conversation a turn for a chat or tracker message is shown.

A turn woken by a Slack or Mattermost message, or by a comment on a GitHub
issue, a Jira issue or a Confluence page, begins by reading that
conversation from its backend (``seats.thread_block``). What it reads is
bounded twice, newest kept: by a count of messages (``max_messages``) and by
the bytes of their text (``max_bytes``, UTF-8); the block says how many it
left out. ``timeout_s`` bounds the read itself: past it the turn runs without
the block, and its phase says so. These shape the prompt every seat's turn
is given, so they are the company's, the same on every node of a fleet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pydantic import Field

from crewlet.company.shape import FileModel, read_section

#: The company-file key.
THREAD_BLOCK_KEY = "thread_block"
MAX_MESSAGES = "max_messages"
MAX_BYTES = "max_bytes"
TIMEOUT_S = "timeout_s"
THREAD_BLOCK_KEYS = (MAX_MESSAGES, MAX_BYTES, TIMEOUT_S)
#: The ranges each key takes (whole numbers for the two bounds).
MAX_MESSAGES_RANGE = (1, 200)
MAX_BYTES_RANGE = (1024, 262_144)
TIMEOUT_RANGE_S = (0.1, 60.0)


@dataclass(frozen=True)
class ThreadBounds:
    """The thread block's bounds: the newest ``max_messages`` messages, within ``max_bytes`` of text, read within ``timeout_s``."""

    max_messages: int = 30
    max_bytes: int = 16_384
    timeout_s: float = 10.0


DEFAULT_THREAD_BOUNDS = ThreadBounds()


class ThreadBlockFile(FileModel):
    """The ``thread_block`` section's shape; absent keys keep :data:`DEFAULT_THREAD_BOUNDS`'."""

    max_messages: int = Field(default=DEFAULT_THREAD_BOUNDS.max_messages, ge=MAX_MESSAGES_RANGE[0], le=MAX_MESSAGES_RANGE[1])
    max_bytes: int = Field(default=DEFAULT_THREAD_BOUNDS.max_bytes, ge=MAX_BYTES_RANGE[0], le=MAX_BYTES_RANGE[1])
    timeout_s: float = Field(default=DEFAULT_THREAD_BOUNDS.timeout_s, ge=TIMEOUT_RANGE_S[0], le=TIMEOUT_RANGE_S[1])


def parse_thread_bounds(value: Any, source: Optional[str]) -> ThreadBounds:
    """``thread_block: {max_messages?, max_bytes?, timeout_s?}``, each in its range; absent keys keep their defaults."""
    if value is None:
        return DEFAULT_THREAD_BOUNDS
    body = read_section(ThreadBlockFile, value, THREAD_BLOCK_KEY, source)
    return ThreadBounds(max_messages=body.max_messages, max_bytes=body.max_bytes, timeout_s=body.timeout_s)


__all__ = [
    "DEFAULT_THREAD_BOUNDS",
    "MAX_BYTES",
    "MAX_MESSAGES",
    "THREAD_BLOCK_KEY",
    "THREAD_BLOCK_KEYS",
    "TIMEOUT_S",
    "ThreadBounds",
    "parse_thread_bounds",
]
