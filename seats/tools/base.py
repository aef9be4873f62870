"""The seam between a turn and the tools a seat is granted: :class:`Toolbox`.

The turn loop sees tools only through this protocol, so it neither knows nor
cares whether a tool is reached over MCP stdio, streamable HTTP or anything
else; the MCP session manager (:mod:`seats.tools.mcp`) is the implementation
the engine runs. The value types are frozen dataclasses so a round can record
them as they were when the model asked, and so a result can be handed to the
model and to the event store without either altering it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, runtime_checkable

#: The engine service that hands out this node's toolbox (:class:`seats.tools.mcp.McpToolbox`).
SEAT_TOOLS = "seat_tools"


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the model is shown it.

    ``name`` is the vendor-safe name (``<server>__<tool>``, matching
    ``^[a-zA-Z0-9_-]{1,64}$``) that both model vendors accept; the toolbox
    keeps the mapping back to the server's own tool name. ``input_schema`` is
    the JSON Schema the server listed, passed through unchanged so the model
    is held to the same contract the server enforces. ``read_only`` is the
    server's word (its MCP annotations' ``readOnlyHint: true``), or a
    built-in's, that a call changes nothing outside the engine: a turn's
    completion-ledger row is written before its first call of a tool that is
    not, so a turn that failed having only read is worked again.
    ``annotations`` are the server's MCP tool annotations as it listed them
    (``readOnlyHint``, ``destructiveHint``, ``idempotentHint``,
    ``openWorldHint``, ``title``), kept for whatever in the engine weighs a
    call; never sent to a model vendor, whose tool definitions have no place
    for them.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool = False
    annotations: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class ToolImage:
    """An image a tool returned: its media type and its bytes in base64, as MCP carries them.

    Handed to the model as image content in the vendor's own shape (an
    Anthropic ``tool_result`` image block; for OpenAI's chat completions,
    whose tool messages take text only, an ``image_url`` part of a user
    message right after the round's tool messages), never as base64 text.
    """

    mime_type: str
    data: str


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for in a round: the model's call ``id`` (echoed back with the result), the exposed ``name``, the ``arguments``."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a call produced, as the model will see it and a round records it.

    A tool that fails, times out or whose server is down is still a result
    (``ok=False`` and ``error`` saying why): the model can react to it, and a
    turn never crashes on a tool. ``bytes`` is the size of ``content`` in
    UTF-8 (the round's ``tool_bytes``); ``server`` and ``tool`` are the
    server's name and its own tool name (not the exposed name), what the
    design records per call; ``duration_s`` is the wall time of the call.
    ``images`` are the images it returned (:class:`ToolImage`), beside the
    text of ``content``, their base64 counted in ``bytes``; events record the
    text only.
    """

    ok: bool
    content: str
    bytes: int
    server: str
    tool: str
    duration_s: float
    error: Optional[str] = None
    images: tuple[ToolImage, ...] = ()


class Toolbox(Protocol):
    """The tools of each seat, as a turn uses them.

    Both methods take the seat's ``handle`` because the sessions behind them
    are per (seat, server): a seat sees only the servers it is granted, and a
    server's state (a login, a cursor) is never shared between seats.
    """

    async def specs(self, handle: str) -> list[ToolSpec]:
        """The seat's granted MCP tools, named ``<server>__<tool>``; a server that is down contributes none (the turn runs without it)."""
        ...

    async def call(self, handle: str, call: ToolCall) -> ToolResult:
        """Run ``call`` for the seat; never raises for a tool failure (``ok=False``, ``error=...``), so a failing tool is something the model sees, not a crashed turn."""
        ...


@runtime_checkable
class SeatSessions(Protocol):
    """A toolbox that holds something per seat (MCP sessions, child processes) to let go of when the seat leaves the node."""

    async def release(self, handle: str) -> None:
        """The seat is no longer run here: close what is held for it."""
        ...
