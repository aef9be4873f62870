"""What other apps contribute to a seat's turns, without the seats app knowing them.

Two registries, filled by the other apps' ``AppConfig.ready``:

``after_turn`` holds async callables ``(queue, seat, trigger_events, result)``;
the inbox loop calls every one after a turn that completed and before its
triggers go to the completion ledger (so a hook runs once per worked
trigger, never on a skip). A hook that raises is logged and the others still
run: the turn happened, and redoing it is the duplicate the ledger prevents.
The a2a app registers the one that sends an answering turn's response back.

``builtin_tools`` holds the tools the engine itself offers a model beside a
seat's MCP tools (a seat is granted one by naming it in its ``tools``). A
built-in runs in the turn's own task with the turn's queue, seat and
trigger; refusing a call is raising :class:`BuiltinToolError`, whose reason
the model reads as the tool's error. ``ends_turn`` says the turn ends once
the round that called it is done (``a2a_ask``: the answer wakes the seat in a
turn of its own). The a2a app registers ``a2a_ask``.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence

from crewlet.events import Event
from crewlet.company.org import Organization, Seat
from crewlet.queue.contract import EventQueue
from seats.tools.base import ToolCall, ToolSpec

if TYPE_CHECKING:  # pragma: no cover
    from seats.turns import Trigger, TurnResult

log = logging.getLogger("crewlet.seats.hooks")

AfterTurn = Callable[[EventQueue, Seat, Sequence[Event], "TurnResult"], Awaitable[None]]

#: The registry; register with :func:`register_after_turn` (idempotent).
after_turn: list[AfterTurn] = []


def register_after_turn(hook: AfterTurn) -> None:
    if hook not in after_turn:
        after_turn.append(hook)


async def run_after_turn(queue: EventQueue, seat: Seat, trigger_events: Sequence[Event], result: "TurnResult") -> None:
    """Call every hook in registration order; a failing one is logged, never raised."""
    for hook in list(after_turn):
        try:
            await hook(queue, seat, trigger_events, result)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "seat_after_turn_hook_failed",
                extra={"seat": seat.handle, "turn_id": result.turn_id, "hook": getattr(hook, "__qualname__", repr(hook))},
            )


class BuiltinToolError(Exception):
    """A built-in tool refused its call; the message is what the model reads as the tool's error."""


@dataclass(frozen=True)
class BuiltinCall:
    """One call of a built-in, with the turn it was made in."""

    queue: EventQueue
    org: Organization
    seat: Seat
    trigger: "Trigger"
    call: ToolCall


@dataclass(frozen=True)
class BuiltinTool:
    spec: ToolSpec
    run: Callable[[BuiltinCall], Awaitable[str]]
    ends_turn: bool = False


#: The registry, by tool name; register with :func:`register_builtin_tool` (the latest one of a name wins).
builtin_tools: dict[str, BuiltinTool] = {}


def register_builtin_tool(tool: BuiltinTool) -> None:
    builtin_tools[tool.spec.name] = tool


__all__ = [
    "AfterTurn",
    "BuiltinCall",
    "BuiltinTool",
    "BuiltinToolError",
    "after_turn",
    "builtin_tools",
    "register_after_turn",
    "register_builtin_tool",
    "run_after_turn",
]
