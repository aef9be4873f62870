"""A seat's tools: the :class:`Toolbox` seam a turn calls through, and the MCP session manager behind it."""
from __future__ import annotations

from seats.tools.base import SEAT_TOOLS, SeatSessions, ToolCall, ToolImage, ToolResult, ToolSpec, Toolbox

__all__ = ["SEAT_TOOLS", "SeatSessions", "ToolCall", "ToolImage", "ToolResult", "ToolSpec", "Toolbox"]
