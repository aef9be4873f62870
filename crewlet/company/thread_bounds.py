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

from crewlet.company.fields import _known, _mapping, _number

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


def parse_thread_bounds(value: Any, source: Optional[str]) -> ThreadBounds:
    """``thread_block: {max_messages?, max_bytes?, timeout_s?}``, each in its range; absent keys keep their defaults."""
    if value is None:
        return DEFAULT_THREAD_BOUNDS
    body = _mapping(value, THREAD_BLOCK_KEY, source)
    _known(body, f"{THREAD_BLOCK_KEY}.", THREAD_BLOCK_KEYS, source)
    d = DEFAULT_THREAD_BOUNDS
    return ThreadBounds(
        max_messages=_number(body.get(MAX_MESSAGES, d.max_messages), f"{THREAD_BLOCK_KEY}.{MAX_MESSAGES}", *MAX_MESSAGES_RANGE, True, source),
        max_bytes=_number(body.get(MAX_BYTES, d.max_bytes), f"{THREAD_BLOCK_KEY}.{MAX_BYTES}", *MAX_BYTES_RANGE, True, source),
        timeout_s=float(_number(body.get(TIMEOUT_S, d.timeout_s), f"{THREAD_BLOCK_KEY}.{TIMEOUT_S}", *TIMEOUT_RANGE_S, False, source)),
    )


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
