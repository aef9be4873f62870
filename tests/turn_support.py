"""A seat's tools for turn tests where MCP itself is not the point: an in-test :class:`~seats.tools.base.Toolbox`."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional

from seats.tools.base import ToolCall, ToolResult, ToolSpec

NOTE_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@dataclass
class NotesToolbox:
    """``notes__write`` keeps a note and says so; ``notes__read`` (read-only) lists them; ``notes__broken`` answers as a server that timed out.

    ``hold`` (when set) keeps every call waiting until it is set; ``entered``
    is set as soon as a call arrives, and ``running`` is the task making it,
    so a test can act while a tool runs (or end the turn under it).
    """

    notes: list[str] = field(default_factory=list)
    calls: list[tuple[str, ToolCall]] = field(default_factory=list)
    hold: Optional[asyncio.Event] = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    running: Optional["asyncio.Task[object]"] = None

    async def specs(self, handle: str) -> list[ToolSpec]:
        return [
            ToolSpec(name="notes__write", description="Keep a note.", input_schema=NOTE_SCHEMA),
            ToolSpec(name="notes__broken", description="A note server that is down.", input_schema=NOTE_SCHEMA),
            ToolSpec(name="notes__read", description="The notes kept.", input_schema={"type": "object"}, read_only=True),
        ]

    async def call(self, handle: str, call: ToolCall) -> ToolResult:
        self.calls.append((handle, call))
        self.running = asyncio.current_task()
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        if call.name == "notes__broken":
            return ToolResult(
                ok=False, content="", bytes=0, server="notes", tool="broken", duration_s=5.0,
                error="the notes server did not answer within 5 s",
            )
        if call.name == "notes__read":
            content = "\n".join(self.notes)
            return ToolResult(ok=True, content=content, bytes=len(content), server="notes", tool="read", duration_s=0.01)
        self.notes.append(str(call.arguments.get("text", "")))
        content = f"saved note {len(self.notes)}"
        return ToolResult(ok=True, content=content, bytes=len(content), server="notes", tool="write", duration_s=0.01)
