"""The turn side of A2A: an answering turn's response is the answer; a turn asks at its own depth.

:func:`answer_after_turn` is registered on ``seats.hooks.after_turn`` (from
``A2AConfig.ready``): when a completed turn was woken by an ``a2a_request``,
its response goes back through :func:`a2a.services.answer`. A refusal (the
channel closed meanwhile, a redelivery that somehow ran again) is logged: the
turn happened, and the record says why the reply bounced. An ``a2a_message``
wake at the asker is an ordinary turn and answers nothing.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from crewlet.events import Event
from crewlet.org import Seat
from crewlet.queue.contract import EventQueue
from crewlet.events import Trace
from seats.turns import Trigger, TurnResult

from a2a import services

log = logging.getLogger("crewlet.a2a.hooks")


async def answer_after_turn(queue: EventQueue, seat: Seat, trigger_events: Sequence[Event], result: TurnResult) -> None:
    for ev in trigger_events:
        if ev.type != "a2a_request":
            continue
        channel_id = str(ev.field("channel_id") or "")
        trace = Trace.of(ev)
        try:
            await services.answer(
                queue,
                channel_id,
                seat.handle,
                result.response,
                result.turn_id,
                services.conversation_key(channel_id),
                trace=trace.child() if trace is not None else None,
                role=seat.role,
                agent_id=seat.agent_id,
            )
        except services.A2AError as exc:
            log.warning(
                "a2a_answer_refused",
                extra={"seat": seat.handle, "channel_id": channel_id, "turn_id": result.turn_id, "reason": exc.reason},
            )


async def ask_from_turn(queue: EventQueue, seat: Seat, trigger: Trigger, to_handle: str, brief: str, **options: Any) -> object:
    """The seam an agent's ``a2a_ask`` tool calls: the ask carries the asking turn's place in the chain."""
    first = trigger.first
    trace = Trace.of(first)
    return await services.ask(
        queue,
        seat.handle,
        to_handle,
        brief,
        trace=trace.child() if trace is not None else None,
        parent_turn_id=trigger.turn_id,
        delegation_depth=first.delegation_depth,
        delegation_chain=list(first.delegation_chain),
        role=seat.role,
        agent_id=seat.agent_id,
        **options,
    )


__all__ = ["answer_after_turn", "ask_from_turn"]
