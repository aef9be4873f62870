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

``around_turn`` holds plain callables ``(org, seat, trigger)`` called as a
turn starts on the node running it (:func:`begin_turn`, from the turn's
task); what one returns, when not None, is called as that turn ends,
however it ends. Neither is awaited, so a hook cannot delay the turn it
brackets: one with work to do (a vendor call) starts a task of its own. A
hook that raises is logged and the turn runs all the same. The seats app
declares the chat working indicator (:mod:`seats.indicator`).

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
from typing import Awaitable, Callable, Iterable, Mapping, Optional, Sequence, TypeVar

from django.apps import apps

from crewlet.events import Event
from crewlet.company.org import Organization, Seat
from crewlet.queue.contract import EventQueue
from seats.tools.base import ToolCall, ToolSpec
from seats.turn_types import Trigger, TurnResult

log = logging.getLogger("crewlet.seats.hooks")

AfterTurn = Callable[[EventQueue, Seat, Sequence[Event], TurnResult], Awaitable[None]]
#: What an around-turn hook returns, called as the turn ends.
TurnEnd = Callable[[], None]
AroundTurn = Callable[[Organization, Seat, Trigger], Optional[TurnEnd]]
_H = TypeVar("_H")


class BuiltinToolError(Exception):
    """A built-in tool refused its call; the message is what the model reads as the tool's error."""


def _no_services() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True)
class BuiltinCall:
    """One call of a built-in, with the turn it was made in."""

    queue: EventQueue
    org: Organization
    seat: Seat
    trigger: Trigger
    call: ToolCall
    #: What the node's seat runtime hands its built-ins by name (the sandbox coordinator): none outside a runtime.
    services: Mapping[str, object] = field(default_factory=_no_services)


@dataclass(frozen=True)
class BuiltinTool:
    """A tool the engine runs itself: the spec the model is shown, what a call runs, and whether it ends the turn.

    ``grant`` is the name in ``seats[].tools`` that offers it, when one grant
    offers several tools (``memory``); by default the tool's own name.
    """

    spec: ToolSpec
    run: Callable[[BuiltinCall], Awaitable[str]]
    ends_turn: bool = False
    grant: str = ""

    @property
    def granted_by(self) -> str:
        return self.grant or self.spec.name


def _once(hooks: Iterable[_H]) -> tuple[_H, ...]:
    """``hooks`` in order, each once (compared by equality: a hook need not be hashable)."""
    kept: list[_H] = []
    for hook in hooks:
        if hook not in kept:
            kept.append(hook)
    return tuple(kept)


def _no_tools() -> Mapping[str, BuiltinTool]:
    return MappingProxyType({})


@dataclass(frozen=True)
class TurnHooks:
    """The after-turn and around-turn hooks, in the order they run, and the built-in tools by name: a declaration, never changed."""

    after_turn: tuple[AfterTurn, ...] = ()
    builtin_tools: Mapping[str, BuiltinTool] = field(default_factory=_no_tools)
    around_turn: tuple[AroundTurn, ...] = ()

    @classmethod
    def of(
        cls,
        *,
        after_turn: Iterable[AfterTurn] = (),
        builtin_tools: Iterable[BuiltinTool] = (),
        around_turn: Iterable[AroundTurn] = (),
    ) -> TurnHooks:
        """Hooks and tools as one declaration: a hook named twice runs once, and the last tool of a name is the one offered."""
        return cls(
            after_turn=_once(after_turn),
            builtin_tools=MappingProxyType({tool.spec.name: tool for tool in builtin_tools}),
            around_turn=_once(around_turn),
        )


def declared_hooks() -> TurnHooks:
    """Every installed app's ``AppConfig.turn_hooks()``, in ``INSTALLED_APPS`` order, as one :class:`TurnHooks`.

    Read from the apps each time it is called, so it holds nothing of its
    own: whoever needs the hooks for longer (a turn runner) keeps what it read.
    """
    after_turn: list[AfterTurn] = []
    builtin_tools: list[BuiltinTool] = []
    around_turn: list[AroundTurn] = []
    for config in apps.get_app_configs():
        contribute: Optional[Callable[[], TurnHooks]] = getattr(config, "turn_hooks", None)
        if contribute is None:
            continue
        hooks = contribute()
        after_turn.extend(hooks.after_turn)
        builtin_tools.extend(hooks.builtin_tools.values())
        around_turn.extend(hooks.around_turn)
    return TurnHooks.of(after_turn=after_turn, builtin_tools=builtin_tools, around_turn=around_turn)


def _hook_name(hook: object) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


def begin_turn(hooks: TurnHooks, org: Organization, seat: Seat, trigger: Trigger) -> TurnEnd:
    """Call every around-turn hook as ``trigger``'s turn starts; the callable that ends them all (in reverse order).

    Neither this nor what it returns raises for a hook: a failing one is
    logged and the turn goes on.
    """
    ends: list[TurnEnd] = []
    for hook in hooks.around_turn:
        try:
            end = hook(org, seat, trigger)
        except Exception:
            log.exception(
                "seat_around_turn_hook_failed",
                extra={"seat": seat.handle, "turn_id": trigger.turn_id, "hook": _hook_name(hook), "at": "start"},
            )
            continue
        if end is not None:
            ends.append(end)

    def end_all() -> None:
        for end in reversed(ends):
            try:
                end()
            except Exception:
                log.exception(
                    "seat_around_turn_hook_failed",
                    extra={"seat": seat.handle, "turn_id": trigger.turn_id, "hook": _hook_name(end), "at": "end"},
                )

    return end_all


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
    "AroundTurn",
    "BuiltinCall",
    "BuiltinTool",
    "BuiltinToolError",
    "TurnEnd",
    "TurnHooks",
    "begin_turn",
    "declared_hooks",
    "run_after_turn",
]
