"""Steering: a person's note to a seat's running turn, read at the turn's next round (``agent_turn_steered``).

``POST /api/seats/{handle}/steer`` (:func:`steer`) scatters the note over the
broker's ephemeral request/reply (:data:`~crewlet.queue.topics.TURN_STEER`:
core NATS, no stream, nothing stored). Every node serves that subject
(:class:`SteerServer`); only the node whose inbox loop holds the seat answers
— it offers the note to the running turn's :class:`~seats.turn_types.SteerBox`
and says so, or says the seat has no running turn — and the others decline.
Nobody answering within :data:`STEER_ASK_S` means no node runs the seat now.
So a steer the caller was told was accepted is in a running turn's box, and
one that was refused was never anywhere: nothing is recorded for it.

The turn reads its box before each round's provider call (:func:`deliver`):
each note becomes a user message in the conversation the model sees, marked
as a person's note, and ``agent_turn_steered`` ``delivered`` names the phase,
iteration and round that first read it. A turn that ends (or parks on a coding
run) with notes still waiting closes its box and records each as ``expired``
(:func:`expire`); a note offered after that is refused. The note crossed an
ephemeral scatter, so that event, published by the node that ran the turn, is
its only durable record.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone as dt_timezone
from typing import Any, Callable, Optional

from crewlet import events
from crewlet.engine import runtime
from crewlet.events.types import STEER_DELIVERED, STEER_EXPIRED, AgentTurnSteered
from crewlet.queue import topics
from crewlet.queue.contract import Closable, EventQueue
from crewlet.queue.errors import NoAnswer
from seats.provider_base import ROLE_USER, Message
from seats.turn_types import PHASE_RESPOND, Emit, Steer, Trigger, TurnState, TurnTags

log = logging.getLogger("crewlet.seats.steering")

#: How long a steer waits for the node running the seat to answer; none by then means no node runs it.
STEER_ASK_S = 2.0
#: The longest note a person may send (it is carried whole into the model's conversation and the event).
NOTE_MAX_CHARS = 4000

#: Why a steer is refused: the seat is held by a node, but no turn of it runs to read the note.
NO_RUNNING_TURN = "has no running turn to steer (a note is only read by a turn that is running)"
#: Why a steer is refused: no node answered for the seat (nobody holds it now, or its node is away).
NO_NODE = "is run by no node that answered"

#: The steer scatter's JSON keys (request and answer).
K_SEAT = "seat"
K_STEER = "steer"
K_ACCEPTED = "accepted"
K_NODE = "node"
K_TURN_ID = "turn_id"

#: What a running turn is for the steer server: whether this node holds the seat, and its running turn's trigger.
TurnOf = Callable[[str], tuple[bool, Optional[Trigger]]]


def note_text(steer: Steer) -> str:
    """The note as the model reads it: marked as a person's, so it is not taken for a tool's output or a new message."""
    who = steer.steered_by or steer.steered_by_seat or "a person"
    return f"[A note from {who}, a person steering this turn while it runs]\n{steer.note}"


def _body(tags: TurnTags, steer: Steer, status: str, *, phase: str = "", iteration: int = 0, round: int = 0) -> AgentTurnSteered:
    return AgentTurnSteered(
        **tags,
        phase=phase,
        iteration=iteration,
        round=round,
        status=status,
        note=steer.note,
        note_id=steer.note_id,
        steered_by=steer.steered_by,
        steered_by_seat=steer.steered_by_seat,
        sent_at=steer.sent_at,
    )


async def deliver(emit: Emit, loop: TurnState, tags: TurnTags, number: int) -> None:
    """Before round ``number``'s call: every waiting note into the conversation, each recorded as delivered at that round."""
    for steer in loop.trigger.notes.take():
        loop.messages.append(Message(role=ROLE_USER, text=note_text(steer)))
        await emit(_body(tags, steer, STEER_DELIVERED, phase=PHASE_RESPOND, iteration=1, round=number))
        log.info(
            "seat_turn_steered",
            extra={"seat": tags["seat"], "turn_id": tags["turn_id"], "note_id": steer.note_id, "round": number},
        )


async def expire(emit: Emit, trigger: Trigger, tags: TurnTags) -> None:
    """The turn ended (or parked): close its box, and record every note no round read as expired."""
    for steer in trigger.notes.close():
        await emit(_body(tags, steer, STEER_EXPIRED))
        log.info("seat_turn_steer_expired", extra={"seat": tags["seat"], "turn_id": tags["turn_id"], "note_id": steer.note_id})


def dropped(trigger: Trigger, handle: str) -> None:
    """A turn cancelled where it stood (its lease lost) publishes nothing more: its box closes, the count logged."""
    lost = trigger.notes.close()
    if lost:
        log.warning("seat_turn_steer_dropped", extra={"seat": handle, "turn_id": trigger.turn_id, "count": len(lost)})


# -- the node's side: serving the scatter -------------------------------------------------


class SteerServer:
    """Answers the fleet's steer scatter for the seats this node's inbox loops hold."""

    def __init__(self, queue: EventQueue, node_id: str, turn_of: TurnOf) -> None:
        self.queue = queue
        self.node_id = node_id
        self.turn_of = turn_of
        self._server: Optional[Closable] = None

    async def start(self) -> None:
        self._server = await self.queue.serve(topics.TURN_STEER, self.answer)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.close()
            self._server = None

    async def answer(self, raw: bytes) -> bytes:
        """Offer the note to the seat's running turn when this node holds the seat; decline otherwise."""
        request = json.loads(raw)
        handle = str(request[K_SEAT])
        held, trigger = self.turn_of(handle)
        if not held:
            raise NoAnswer(f"seat {handle!r} is not this node's")
        steer = Steer(**{k: str(v) for k, v in dict(request[K_STEER]).items() if k in Steer.__dataclass_fields__})
        accepted = trigger is not None and trigger.notes.offer(steer)
        turn_id = trigger.turn_id if trigger is not None and accepted else ""
        log.info("seat_steer_offered", extra={"seat": handle, "note_id": steer.note_id, "accepted": accepted, "turn_id": turn_id})
        return json.dumps({K_ACCEPTED: accepted, K_NODE: self.node_id, K_TURN_ID: turn_id}).encode()


# -- the asker's side: the API ---------------------------------------------------------------


@dataclass(frozen=True)
class SteerAnswer:
    """What became of a steer at once: accepted into a running turn (which node, which turn), or refused and why."""

    accepted: bool
    note_id: str
    node: str = ""
    turn_id: str = ""
    reason: str = ""


def steer(handle: str, note: str, *, by: str, by_seat: str = "", timeout_s: float = STEER_ASK_S) -> SteerAnswer:
    """Scatter a person's note to ``handle``'s running turn from a request thread; what the node running it said.

    :class:`~crewlet.engine.runtime.EngineAway` when this process has no engine to ask through.
    """
    sent_at = events.format_timestamp(datetime.now(dt_timezone.utc))
    note_id = str(uuid.uuid4())
    payload: dict[str, Any] = {
        K_SEAT: handle,
        K_STEER: asdict(Steer(note=note, note_id=note_id, steered_by=by, steered_by_seat=by_seat, sent_at=sent_at)),
    }
    answers = runtime.on_engine(
        lambda queue: queue.ask(topics.TURN_STEER, json.dumps(payload).encode(), 1, timeout_s), timeout_s + 5.0
    )
    if not answers:
        log.info("seat_steer_refused", extra={"seat": handle, "note_id": note_id, "reason": "no node answered"})
        return SteerAnswer(False, note_id, reason=f"seat {handle!r} {NO_NODE} within {timeout_s:g} s")
    reply = json.loads(answers[0])
    node = str(reply.get(K_NODE, ""))
    if not reply.get(K_ACCEPTED):
        log.info("seat_steer_refused", extra={"seat": handle, "note_id": note_id, "node": node, "reason": "no running turn"})
        return SteerAnswer(False, note_id, node=node, reason=f"seat {handle!r} {NO_RUNNING_TURN}")
    return SteerAnswer(True, note_id, node=node, turn_id=str(reply.get(K_TURN_ID, "")))


__all__ = [
    "NOTE_MAX_CHARS",
    "NO_NODE",
    "NO_RUNNING_TURN",
    "STEER_ASK_S",
    "SteerAnswer",
    "SteerServer",
    "deliver",
    "dropped",
    "expire",
    "note_text",
    "steer",
]
