"""What the shipped chat servers share: the tool annotations, their environment, and their argument checks.

The annotations are MCP's hints, set on every tool because the engine reads
them to tell a read from a write: ``read_only_hint`` for a tool that changes
nothing; for a write, ``destructive_hint`` false when it only adds (a post, a
reaction), and ``idempotent_hint`` true when calling it again with the same
arguments changes nothing more (a reaction already there) but false when each
call adds something (every post is a new message). ``open_world_hint``: every
one of them talks to a vendor's workspace.
"""
from __future__ import annotations

import os

from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

#: Reads the conversation; changes nothing.
READS = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=True)
#: Adds something new on every call (a message): never destructive, never idempotent.
ADDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True)
#: Adds something once: a second identical call leaves it as it was (a reaction).
ADDS_ONCE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=True)

#: The longest message a tool posts, in characters (Slack's own limit for a message's text is 40,000; Mattermost's 16,383).
MAX_TEXT_CHARS = 16_000


def from_env(name: str, what: str) -> str:
    """The value of the variable ``name``; unset or empty is a :class:`ToolError` naming it (never its value)."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise ToolError(f"{name} is not set: the engine passes {what} there, and this seat was granted none")
    return value


def need_text(value: str, field: str, max_chars: int = 200) -> str:
    """A required argument as stripped text, at most ``max_chars`` long; a :class:`ToolError` the model can act on otherwise."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise ToolError(f"{field} must be a non-empty string")
    if len(text) > max_chars:
        raise ToolError(f"{field} is {len(text)} characters; at most {max_chars}")
    return text


def message_text(value: str, field: str = "text") -> str:
    """A message to post: non-empty, at most :data:`MAX_TEXT_CHARS` (kept as written, leading spaces included)."""
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{field} must be a non-empty string")
    if len(value) > MAX_TEXT_CHARS:
        raise ToolError(f"{field} is {len(value)} characters; at most {MAX_TEXT_CHARS} per message (split it)")
    return value


__all__ = ["ADDS", "ADDS_ONCE", "MAX_TEXT_CHARS", "READS", "from_env", "message_text", "need_text"]
