"""Operator tools that change the runtime, each audited as exactly one ``operator_acted``.

The design's runtime audit: one event per call, whatever became of it —
replayed, refused, or failed — with source "operator", the token's own name as
the actor and the person it is bound to as ``actor_seat``; the tool, the
transport (``act`` for the dashboard's ``/operator/act``), the request id, the
outcome and either a position (where the call left things) or a refusal. Never
the arguments: a dead letter's ref is the operator's input, not the record.

The event is published on ``topics.event("operator_acted")`` with the queue's
own publish, so the event store's publish listener records it like every other
event this node publishes. These coroutines run on the engine's loop; a request
thread reaches them through :func:`crewlet.engine.runtime.on_engine`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from crewlet.engine import runtime
from crewlet.events.types import OperatorActed
from crewlet.queue.contract import DEAD_LETTER_REF_RULE, EventQueue, dead_letter_seq
from crewlet.queue.errors import Gone, InvalidArgument, NotLive, Unavailable
from crewlet.events.tracing import trace_of

log = logging.getLogger("crewlet.eventstore.actions")

#: The tool that puts a dead letter back onto its original topic.
TOOL_DEAD_LETTER_REPLAY = "dead_letter_replay"
#: Every tool ``/operator/act`` knows.
TOOLS: frozenset[str] = frozenset({TOOL_DEAD_LETTER_REPLAY})

#: Transports an operator call arrives by (design: the runtime audit).
TRANSPORT_ACT = "act"
TRANSPORT_MCP = "mcp"

#: Outcomes: the call did what it was asked; it was refused; the broker could not be reached.
OUTCOME_REPLAYED = "replayed"
OUTCOME_REFUSED = "refused"
OUTCOME_FAILED = "failed"

#: Refusals, each a phrase an audit listing and an HTTP answer both carry.
REFUSAL_GONE = "gone"
REFUSAL_NO_SUBSCRIPTION = "no_subscription"
REFUSAL_UNAVAILABLE = "unavailable"
REFUSAL_UNKNOWN_TOOL = "unknown_tool"
REFUSAL_BAD_ARGS = "bad_args"

#: What an answer says when the broker could not be reached: its own words stay in the log.
DETAIL_UNAVAILABLE = "the broker could not be reached; the dead letter stays where it was, and a replay may be tried again"
#: What an answer says of a dead letter whose mailbox no durable subscription reads any more.
DETAIL_NO_SUBSCRIPTION = "no durable subscription reads the dead letter's topic any more: a replay would drop it, so it stays"

#: The audit keeps at most this much of a caller-supplied string (an unknown tool name, a request id).
_AUDIT_TEXT_MAX = 128


@dataclass(frozen=True)
class Caller:
    """Who made an operator call, and how: what its audit row says besides the outcome."""

    actor: str
    actor_seat: str = ""
    transport: str = TRANSPORT_ACT
    request_id: str = ""


@dataclass(frozen=True)
class ActResult:
    """What became of one operator call: the outcome, and the position or the refusal."""

    tool: str
    outcome: str
    refusal: str = ""
    topic: str = ""
    event_id: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_REPLAYED


def ref_refusal(ref: object) -> str:
    """Why ``ref`` cannot name a dead letter ("" when it can): checked before any broker is asked."""
    if dead_letter_seq(ref):
        return ""
    return f"args.ref={str(ref)[:40]!r} names no dead letter: {DEAD_LETTER_REF_RULE}"


def _clip(text: str) -> str:
    text = str(text or "")
    return text if len(text) <= _AUDIT_TEXT_MAX else text[: _AUDIT_TEXT_MAX - 1] + "…"


async def audit(queue: EventQueue, result: ActResult, caller: Caller) -> None:
    """Publish the one ``operator_acted`` of a call; an audit that cannot be published is logged, not raised.

    The call's outcome stands either way: failing an operator's replay because
    its audit could not be written would leave them unsure whether it happened.
    """
    body = OperatorActed(
        token=caller.actor,
        actor_seat=caller.actor_seat,
        tool=_clip(result.tool),
        transport=caller.transport,
        request_id=_clip(caller.request_id),
        outcome=result.outcome,
        position=result.topic,
        refusal=result.refusal,
    )
    await runtime.emitter_for(queue).emit(
        body,
        trace_of(),
        source="operator",
        log_event="operator_acted_publish_failed",
        level=logging.ERROR,
        tool=body.tool,
        actor=caller.actor,
        outcome=body.outcome,
        refusal=body.refusal,
    )


async def replay_dead_letter(queue: EventQueue, ref: str, caller: Caller) -> ActResult:
    """Replay dead letter ``ref`` onto its original topic; audited once whatever became of it.

    A result's ``detail`` is written for the caller: the broker's own words
    (which can name its internals) go to the log, never into an answer.
    """
    refused = ref_refusal(ref)
    if refused:
        result = ActResult(TOOL_DEAD_LETTER_REPLAY, OUTCOME_REFUSED, REFUSAL_BAD_ARGS, detail=refused)
        await audit(queue, result, caller)
        return result
    try:
        letter = await queue.replay_dead_letter(ref)
    except Gone:
        result = ActResult(
            TOOL_DEAD_LETTER_REPLAY, OUTCOME_REFUSED, REFUSAL_GONE,
            detail=f"no dead letter {ref}: it was replayed, or is no longer kept",
        )
    except InvalidArgument as exc:
        log.warning("operator_dead_letter_replay_refused", extra={"ref": ref, "error": str(exc)})
        result = ActResult(TOOL_DEAD_LETTER_REPLAY, OUTCOME_REFUSED, REFUSAL_NO_SUBSCRIPTION, detail=DETAIL_NO_SUBSCRIPTION)
    except (Unavailable, NotLive) as exc:
        log.warning("operator_dead_letter_replay_failed", extra={"ref": ref, "error": str(exc)})
        result = ActResult(TOOL_DEAD_LETTER_REPLAY, OUTCOME_FAILED, REFUSAL_UNAVAILABLE, detail=DETAIL_UNAVAILABLE)
    else:
        try:
            event_id = letter.event.id
        except Exception:  # bytes from another build: the replay still happened
            event_id = ""
        result = ActResult(TOOL_DEAD_LETTER_REPLAY, OUTCOME_REPLAYED, topic=letter.topic, event_id=event_id)
    await audit(queue, result, caller)
    log.info(
        "operator_dead_letter_replay",
        extra={
            "actor": caller.actor,
            "outcome": result.outcome,
            "refusal": result.refusal,
            "topic": result.topic,
            "event_id": result.event_id,
            "request_id": caller.request_id,
        },
    )
    return result


__all__ = [
    "ActResult",
    "Caller",
    "DETAIL_NO_SUBSCRIPTION",
    "DETAIL_UNAVAILABLE",
    "OUTCOME_FAILED",
    "OUTCOME_REFUSED",
    "OUTCOME_REPLAYED",
    "REFUSAL_BAD_ARGS",
    "REFUSAL_GONE",
    "REFUSAL_NO_SUBSCRIPTION",
    "REFUSAL_UNAVAILABLE",
    "REFUSAL_UNKNOWN_TOOL",
    "TOOLS",
    "TOOL_DEAD_LETTER_REPLAY",
    "TRANSPORT_ACT",
    "TRANSPORT_MCP",
    "audit",
    "ref_refusal",
    "replay_dead_letter",
]
