"""A turn's tool calls: what a seat is offered, and each call run — a built-in in the turn, an MCP tool through the toolbox.

The tools a seat is granted are its MCP tools, listed by the
:class:`~seats.tools.base.Toolbox`, and the built-ins it names (the
runner's :class:`~seats.hooks.TurnHooks`). A tool that fails or times out
is a result the model reads, never a crashed turn; a built-in that ends the
turn (``a2a_ask``) says so on the turn's state. :func:`writes` says which
calls can change the world (the ledger is written before the first).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Mapping, Optional

from crewlet.base.logfmt import short_reason
from crewlet.company.org import Seat
from crewlet.queue.contract import EventQueue
from seats.hooks import BuiltinCall, BuiltinTool, BuiltinToolError
from seats.ledger import storable
from seats.provider_base import Completion
from seats.tools.base import ToolCall, ToolResult, ToolSpec, Toolbox
from seats.turn_types import TurnState

log = logging.getLogger("crewlet.seats.turns")


class NoTools:
    """The toolbox of a node that runs no MCP servers: no seat has an MCP tool."""

    async def specs(self, handle: str) -> list[ToolSpec]:
        return []

    async def call(self, handle: str, call: ToolCall) -> ToolResult:
        return ToolResult(ok=False, content="", bytes=0, server="", tool=call.name, duration_s=0.0, error=f"no tool {call.name!r}")


def admitted_result(res: ToolResult) -> ToolResult:
    """A tool's result made storable where it enters the turn: NUL and lone surrogates in its words escaped."""
    content, error = storable(res.content), storable(res.error or "")
    if content is res.content and error == (res.error or ""):
        return res
    return dataclasses.replace(res, content=content, error=error)


def refused(call: ToolCall, why: str, *, server: str = "") -> ToolResult:
    """A call that did not run, answered with why: the model reads it as the tool's error."""
    return ToolResult(ok=False, content="", bytes=0, server=server, tool=call.name, duration_s=0.0, error=why)


async def granted(toolbox: Toolbox, builtins: Mapping[str, BuiltinTool], seat: Seat) -> list[ToolSpec]:
    """The seat's MCP tools, then the built-ins it names; a toolbox that fails to list offers none."""
    try:
        specs = list(await toolbox.specs(seat.handle))
    except Exception as exc:
        log.warning("seat_tools_unlisted", extra={"seat": seat.handle, "error": short_reason(exc)})
        specs = []
    for name in seat.tools:
        specs.extend(tool.spec for tool in builtins.values() if tool.granted_by == name)
    return specs


def writes(loop: TurnState, call: ToolCall, answer: Completion) -> bool:
    """Whether running ``call`` can change the world: a well-formed call of an offered tool not marked read-only.

    A call :func:`act` refuses without running (not offered, arguments that
    are no object) changes nothing.
    """
    if call.id in answer.invalid:
        return False
    spec = next((t for t in loop.tools if t.name == call.name), None)
    return spec is not None and not spec.read_only


async def act(
    queue: EventQueue,
    toolbox: Toolbox,
    builtins: Mapping[str, BuiltinTool],
    loop: TurnState,
    call: ToolCall,
    answer: Completion,
    services: Optional[Mapping[str, object]] = None,
) -> ToolResult:
    """Run one call: a built-in here, an MCP tool through the toolbox; every failure is a result."""
    offered = {t.name for t in loop.tools}
    if call.id in answer.invalid:
        return refused(call, answer.invalid[call.id])
    if call.name not in offered:
        return refused(call, f"no tool named {call.name!r} was offered; the tools are: {', '.join(sorted(offered)) or 'none'}")
    builtin = builtins.get(call.name)
    if builtin is not None and builtin.granted_by not in loop.seat.tools:
        builtin = None
    started = time.monotonic()
    if builtin is None:
        try:
            return admitted_result(await toolbox.call(loop.seat.handle, call))
        except Exception as exc:  # the toolbox promises results; one that raised is still only a failed call
            log.warning("seat_tool_call_raised", extra={"seat": loop.seat.handle, "tool": call.name, "error": short_reason(exc)})
            return refused(call, storable(short_reason(exc, 1000)))
    try:
        content = await builtin.run(BuiltinCall(
            queue=queue, org=loop.org, seat=loop.seat, trigger=loop.trigger, call=call, services=services or {}
        ))
    except BuiltinToolError as exc:
        return ToolResult(
            ok=False, content="", bytes=0, server="", tool=call.name, duration_s=time.monotonic() - started,
            error=storable(str(exc)),
        )
    except Exception as exc:  # a built-in's own failure (its store, its publish) is a failed call the model reads
        log.warning("seat_builtin_raised", extra={"seat": loop.seat.handle, "tool": call.name, "error": short_reason(exc)})
        return refused(call, storable(short_reason(exc, 1000)))
    loop.ended_by_tool = loop.ended_by_tool or builtin.ends_turn
    return ToolResult(
        ok=True,
        content=content,
        bytes=len(content.encode("utf-8")),
        server="",
        tool=call.name,
        duration_s=time.monotonic() - started,
    )


__all__ = ["NoTools", "act", "admitted_result", "granted", "refused", "writes"]
