"""What other apps contribute to a seat's turns, without the seats app knowing them.

An app declares its contributions on its ``AppConfig`` as a method
``turn_hooks(self) -> TurnHooks``, the way it declares its engine services
(``AppConfig.engine_services``). :func:`declared_hooks` reads every
installed app's, in ``INSTALLED_APPS`` order, into one frozen
:class:`TurnHooks`; nothing here holds them between reads. A
:class:`~seats.turns.TurnRunner` reads them once, when it is built (the seat
runtime builds its runner when the engine makes the runtime), and keeps them
as its ``hooks``.

``after_turn`` holds async callables ``(queue, seat, trigger_events, result)``;
the inbox loop calls every one (:func:`run_after_turn`) after a turn that
completed and before its triggers go to the completion ledger (so a hook runs
once per worked trigger, never on a skip). A hook that raises is logged and
the others still run: the turn happened, and redoing it is the duplicate the
ledger prevents. The a2a app declares the one that sends an answering turn's
response back.

``builtin_tools`` holds the tools the engine itself offers a model beside a
seat's MCP tools (a seat is granted one by naming it in its ``tools``). A
built-in runs in the turn's own task with the turn's queue, seat and
trigger; refusing a call is raising :class:`BuiltinToolError`, whose reason
the model reads as the tool's error. ``ends_turn`` says the turn ends once
the round that called it is done (``a2a_ask``: the answer wakes the seat in a
turn of its own). The a2a app declares ``a2a_ask``.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Awaitable, Callable, Iterable, Mapping, Optional, Sequence

from django.apps import apps

from crewlet.events import Event
from crewlet.company.org import Organization, Seat
from crewlet.queue.contract import EventQueue
from seats.tools.base import ToolCall, ToolSpec
from seats.turn_types import Trigger, TurnResult

log = logging.getLogger("crewlet.seats.hooks")

AfterTurn = Callable[[EventQueue, Seat, Sequence[Event], TurnResult], Awaitable[None]]


class BuiltinToolError(Exception):
    """A built-in tool refused its call; the message is what the model reads as the tool's error."""


@dataclass(frozen=True)
class BuiltinCall:
    """One call of a built-in, with the turn it was made in."""

    queue: EventQueue
    org: Organization
    seat: Seat
    trigger: Trigger
    call: ToolCall


@dataclass(frozen=True)
class BuiltinTool:
    """A tool the engine runs itself: the spec the model is shown, what a call runs, and whether it ends the turn."""

    spec: ToolSpec
    run: Callable[[BuiltinCall], Awaitable[str]]
    ends_turn: bool = False


def _no_tools() -> Mapping[str, BuiltinTool]:
    return MappingProxyType({})


@dataclass(frozen=True)
class TurnHooks:
    """The after-turn hooks, in the order they run, and the built-in tools by name: a declaration, never changed."""

    after_turn: tuple[AfterTurn, ...] = ()
    builtin_tools: Mapping[str, BuiltinTool] = field(default_factory=_no_tools)

    @classmethod
    def of(cls, *, after_turn: Iterable[AfterTurn] = (), builtin_tools: Iterable[BuiltinTool] = ()) -> TurnHooks:
        """Hooks and tools as one declaration: a hook named twice runs once, and the last tool of a name is the one offered."""
        hooks: list[AfterTurn] = []
        for hook in after_turn:
            if hook not in hooks:
                hooks.append(hook)
        return cls(after_turn=tuple(hooks), builtin_tools=MappingProxyType({tool.spec.name: tool for tool in builtin_tools}))


def declared_hooks() -> TurnHooks:
    """Every installed app's ``AppConfig.turn_hooks()``, in ``INSTALLED_APPS`` order, as one :class:`TurnHooks`.

    Read from the apps each time it is called, so it holds nothing of its
    own: whoever needs the hooks for longer (a turn runner) keeps what it read.
    """
    after_turn: list[AfterTurn] = []
    builtin_tools: list[BuiltinTool] = []
    for config in apps.get_app_configs():
        contribute: Optional[Callable[[], TurnHooks]] = getattr(config, "turn_hooks", None)
        if contribute is None:
            continue
        hooks = contribute()
        after_turn.extend(hooks.after_turn)
        builtin_tools.extend(hooks.builtin_tools.values())
    return TurnHooks.of(after_turn=after_turn, builtin_tools=builtin_tools)


async def run_after_turn(
    queue: EventQueue,
    seat: Seat,
    trigger_events: Sequence[Event],
    result: TurnResult,
    hooks: Optional[TurnHooks] = None,
) -> None:
    """Every hook of ``hooks`` (else of the apps' declarations), in order; a failing one is logged, never raised."""
    for hook in (declared_hooks() if hooks is None else hooks).after_turn:
        try:
            await hook(queue, seat, trigger_events, result)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "seat_after_turn_hook_failed",
                extra={"seat": seat.handle, "turn_id": result.turn_id, "hook": getattr(hook, "__qualname__", repr(hook))},
            )


__all__ = [
    "AfterTurn",
    "BuiltinCall",
    "BuiltinTool",
    "BuiltinToolError",
    "TurnHooks",
    "declared_hooks",
    "run_after_turn",
]
