"""The turn side of A2A: a turn asks with the ``a2a_ask`` built-in; an answering turn's response is the answer.

:data:`A2A_ASK` is one of the built-in tools ``A2AConfig.turn_hooks``
declares (:class:`seats.hooks.TurnHooks`): a seat granted ``a2a_ask`` in its
``tools`` is offered it, and a call opens the channel through
:func:`ask_from_turn` — at the asking turn's depth, in its chain — and ends
the turn (the answer wakes the asker in a turn of its own). Asking an
unknown seat, a human seat or itself, or past the depth cap, is a tool error
the model reads.

:func:`answer_after_turn` is the after-turn hook ``A2AConfig.turn_hooks``
declares: when a completed turn was woken by an ``a2a_request``, its
response goes back through :func:`a2a.services.answer`. A refusal (the
channel closed meanwhile, a redelivery that somehow ran again) is logged: the
turn happened, and the record says why the reply bounced.

A chain of asks: a turn answering a channel that ends by asking someone else
is not the answer (its response is empty; "the answering agent's final
response is the reply"). The new channel keeps ``on_behalf_of`` — the
channel still owed — so the ``a2a_message`` wake that brings the answer back
runs a turn whose final response answers the owed channel, closed by that
turn; a turn that asks again defers it once more. The link lives on the
channel row, so the two turns may run on different nodes and a redelivery
finds it. An ``a2a_message`` wake that owes nothing is an ordinary turn and
answers nothing. A chain nobody finishes is closed by the idle sweep.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from crewlet.events import Event
from crewlet.events.types import A2AMessage, A2ARequest
from crewlet.company.org import A2A_ASK_TOOL, Seat
from crewlet.queue.contract import EventQueue
from crewlet.events import Trace
from seats.hooks import BuiltinCall, BuiltinTool, BuiltinToolError
from seats.tools.base import ToolSpec
from seats.turn_types import Trigger, TurnResult

from a2a import services
from a2a.models import Channel

log = logging.getLogger("crewlet.a2a.hooks")


async def owed_channel(seat: Seat, ev: Event) -> Optional[str]:
    """The channel ``seat`` owes an answer on because of wake ``ev``: the one it was asked on, or the one an answer serves."""
    if isinstance(ev.data, A2ARequest) and ev.data.channel_id and ev.data.to_seat in ("", seat.handle):
        return ev.data.channel_id
    if isinstance(ev.data, A2AMessage) and ev.data.channel_id:
        owed = ev.data.owed()  # the answer carries the ask it serves, read from the store when it was sent
        return owed.channel_id if owed is not None and owed.channel_id else None
    return None


async def answer_after_turn(queue: EventQueue, seat: Seat, trigger_events: Sequence[Event], result: TurnResult) -> None:
    for ev in trigger_events:
        channel_id = await owed_channel(seat, ev)
        if channel_id is None:
            continue
        fields = {"seat": seat.handle, "channel_id": channel_id, "turn_id": result.turn_id}
        if await services.asked_on_behalf(channel_id, seat.handle, result.turn_id):
            log.info("a2a_answer_deferred", extra=fields)  # the answer this turn asked for will finish it
            continue
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
            log.warning("a2a_answer_refused", extra={**fields, "reason": exc.reason})


async def ask_from_turn(queue: EventQueue, seat: Seat, trigger: Trigger, to_handle: str, brief: str, **options: Any) -> Channel:
    """The seam an agent's ``a2a_ask`` tool calls: the ask carries the asking turn's place in the chain.

    A turn that owes an answer (woken by an ask, or by the answer to an ask
    made on behalf of one) asks on behalf of that channel.
    """
    first = trigger.first
    trace = Trace.of(first)
    owed = None
    for ev in trigger.events:
        owed = await owed_channel(seat, ev)
        if owed is not None:
            break
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
        on_behalf_of=owed,
        **options,
    )


def _text_argument(call: BuiltinCall, name: str) -> str:
    value = call.call.arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        raise BuiltinToolError(f"{A2A_ASK_TOOL} needs {name!r} as a non-empty string")
    return value.strip()


async def a2a_ask(call: BuiltinCall) -> str:
    """The built-in: open the channel to ``to`` with ``brief``; what the model reads back says the turn ends."""
    to = _text_argument(call, "to")
    brief = _text_argument(call, "brief")
    target = call.org.resolve(to)
    agents = ", ".join(s.handle for s in call.org.agent_seats() if s.handle != call.seat.handle) or "none"
    if target is None:
        raise BuiltinToolError(f"no seat {to!r} in {call.org.org}; the agents you can ask are: {agents}")
    if target.handle == call.seat.handle:
        raise BuiltinToolError(f"{call.seat.handle} cannot ask itself; the agents you can ask are: {agents}")
    if not target.is_agent:
        raise BuiltinToolError(
            f"{target.handle} is a human seat and has no turn to answer in; reach people through your chat tools"
        )
    try:
        row = await ask_from_turn(
            call.queue, call.seat, call.trigger, target.handle, brief, request_id=f"{call.trigger.turn_id}/{call.call.id}"
        )
    except services.A2AError as exc:
        raise BuiltinToolError(exc.reason) from None
    return f"Asked {target.handle} on A2A channel {row.id}. This turn ends now; their answer will wake you."


A2A_ASK = BuiltinTool(
    spec=ToolSpec(
        name=A2A_ASK_TOOL,
        description=(
            "Ask another agent of the company one question in private. Your turn ends after the call; "
            "the agent's answer wakes you in a new turn."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "the handle of the agent to ask"},
                "brief": {"type": "string", "description": "the question, with everything the agent needs to answer it"},
            },
            "required": ["to", "brief"],
            "additionalProperties": False,
        },
    ),
    run=a2a_ask,
    ends_turn=True,
)


__all__ = ["A2A_ASK", "a2a_ask", "answer_after_turn", "ask_from_turn", "owed_channel"]
