"""What the shipped servers share: the server itself, the tool annotations, the vendor client's calls, their environment and argument checks.

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
from typing import Any, Callable, Generic, Optional, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

C = TypeVar("C")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: Where :func:`tool` leaves a method's annotations for :func:`server`.
_ANNOTATIONS = "_mcp_tool_annotations"

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


def page_limit(limit: int, most: int) -> int:
    """How many items one read returns: from 1 to ``most``, else a :class:`ToolError` saying so."""
    if not 1 <= limit <= most:
        raise ToolError(f"limit must be between 1 and {most} (got {limit})")
    return limit


def tool(annotations: ToolAnnotations) -> Callable[[F], F]:
    """Mark a method of a :class:`VendorCalls` as one of the server's tools, with its read-or-write hints.

    The method is the tool: its name, its docstring (the description the model
    reads) and its typed parameters (the input schema) are the tool's.
    """

    def mark(method: F) -> F:
        setattr(method, _ANNOTATIONS, annotations)
        return method

    return mark


class VendorCalls(Generic[C]):
    """A server's tools, each one call through one vendor client made on first use; a failed call is a :class:`ToolError` the model reads.

    A server says its ``name`` and ``instructions``, how its client is made
    (:meth:`connect`), what the client raises when the vendor refused a call or
    was not reached (``errors``) and how that reads (:meth:`refusal`); its
    tools are the methods marked with :func:`tool`, in the order written.
    """

    name: str = ""
    instructions: str = ""
    errors: tuple[type[Exception], ...] = ()

    def __init__(self) -> None:
        self._client: Optional[C] = None

    def connect(self) -> C:
        raise NotImplementedError

    def refusal(self, what: str, exc: Exception) -> str:
        raise NotImplementedError

    def client(self) -> C:
        if self._client is None:
            self._client = self.connect()
        return self._client

    def call(self, what: str, make: Callable[[C], T]) -> T:
        try:
            return make(self.client())
        except self.errors as exc:
            raise ToolError(self.refusal(what, exc)) from None


def server(calls: VendorCalls[Any]) -> MCPServer:
    """The MCP server of ``calls``: its name and instructions, and its marked methods as its tools.

    It logs at WARNING: its stderr is the engine's log stream, which wants no line per call.
    """
    made = MCPServer(calls.name, instructions=calls.instructions, log_level="WARNING")
    for attribute, method in vars(type(calls)).items():
        annotations = getattr(method, _ANNOTATIONS, None)
        if annotations is not None:
            made.add_tool(getattr(calls, attribute), annotations=annotations)
    return made


__all__ = [
    "ADDS",
    "ADDS_ONCE",
    "MAX_TEXT_CHARS",
    "READS",
    "VendorCalls",
    "from_env",
    "message_text",
    "need_text",
    "page_limit",
    "server",
    "tool",
]
