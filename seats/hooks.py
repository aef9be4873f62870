"""Post-turn hooks: what other apps do with a finished turn, without the inbox knowing them.

``after_turn`` holds async callables ``(queue, seat, trigger_events, result)``;
the inbox loop calls every one after a turn that completed and before its
triggers go to the completion ledger (so a hook runs once per worked
trigger, never on a skip). A hook that raises is logged and the others still
run: the turn happened, and redoing it is the duplicate the ledger prevents.
The a2a app registers the one that sends an answering turn's response back.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Sequence

from crewlet.events import Event
from crewlet.org import Seat
from crewlet.queue.contract import EventQueue
from seats.turns import TurnResult

log = logging.getLogger("crewlet.seats.hooks")

AfterTurn = Callable[[EventQueue, Seat, Sequence[Event], TurnResult], Awaitable[None]]

#: The registry; register with :func:`register_after_turn` (idempotent).
after_turn: list[AfterTurn] = []


def register_after_turn(hook: AfterTurn) -> None:
    if hook not in after_turn:
        after_turn.append(hook)


async def run_after_turn(queue: EventQueue, seat: Seat, trigger_events: Sequence[Event], result: TurnResult) -> None:
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


__all__ = ["AfterTurn", "after_turn", "register_after_turn", "run_after_turn"]
