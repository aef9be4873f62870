"""A turn's record: every round, every tool call, the phase that holds them, and how the turn ended.

Every provider call is one entry of ``agent_phase_completed.rounds[]``: its
timing, tokens (``input_tokens`` as billed; ``cache_read_tokens`` and
``cache_write_tokens``, raw, when the prompt cache served or stored any:
:func:`cache_tokens`), ``stop_reason`` and each tool call it led to (server, tool,
duration, ok/error, result bytes; the round's ``tool_count`` and
``tool_bytes``). The arguments are kept once, on the phase's ``tool_calls``
beside the prompts — the phase's own durable record — never in the rounds.
``prompt.size`` measures the opening prompt and the tool array. A phase too
heavy for the wire gives up its largest texts first (:func:`fit_phase`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Sequence

from crewlet.events.types import (
    AgentPhaseCompleted,
    AgentTurnCompleted,
    AgentTurnProgress,
    AgentTurnStopped,
    PromptSize,
    STOP_PAUSED,
    STOP_REFUSAL,
    TurnGuardBreach,
)
from crewlet.queue.contract import MAX_PAYLOAD_BYTES
from seats.provider_base import Completion, approx_tokens
from seats.tools.base import ToolCall, ToolResult
from seats.turn_types import (
    OUTCOME_FAILED,
    OUTCOME_STOPPED,
    PHASE_RESPOND,
    STOPPED_BY_ENGINE,
    Emit,
    TurnResult,
    TurnState,
    TurnTags,
)

log = logging.getLogger("crewlet.seats.turns")

#: The most a phase record may weigh on the wire before its largest parts are cut
#: (the broker refuses a message over MAX_PAYLOAD_BYTES; headers and the envelope need room too).
PHASE_RECORD_MAX_BYTES = MAX_PAYLOAD_BYTES // 2
#: How much of a cut text is kept, from its start.
CUT_KEEP_CHARS = 64 * 1024
#: What marks where a text was cut.
CUT_MARK = "\n…[cut]"
#: The name ``truncated`` gives the tool calls' arguments once they were dropped.
CUT_ARGUMENTS = "tool_calls.arguments"


def _weight(phase: AgentPhaseCompleted) -> int:
    return len(json.dumps(dataclasses.asdict(phase), ensure_ascii=False, default=str).encode("utf-8", "backslashreplace"))


def fit_phase(phase: AgentPhaseCompleted) -> AgentPhaseCompleted:
    """``phase`` cut to fit the wire: its largest texts (and then the calls' arguments) give way, each named in ``truncated``.

    A model that answered megabytes must still leave its turn's record, as a
    fleet read's reply gives up rows rather than fail: dropped by the broker
    (``TooLarge``), the whole record would be missing.
    """
    if _weight(phase) <= PHASE_RECORD_MAX_BYTES:
        return phase
    cut: list[str] = []
    for name in sorted(("response", "user_prompt", "system_prompt"), key=lambda n: -len(getattr(phase, n))):
        text = getattr(phase, name)
        if len(text) > CUT_KEEP_CHARS:
            phase = dataclasses.replace(phase, **{name: text[:CUT_KEEP_CHARS] + CUT_MARK})
            cut.append(name)
            if _weight(phase) <= PHASE_RECORD_MAX_BYTES:
                return dataclasses.replace(phase, truncated=cut)
    calls = [{k: v for k, v in c.items() if k != "arguments"} for c in phase.tool_calls]
    return dataclasses.replace(phase, tool_calls=calls, truncated=[*cut, CUT_ARGUMENTS])


def prompt_size(tags: TurnTags, loop: TurnState) -> PromptSize:
    """``prompt.size``: what the opening prompt and the tool array weigh, before the first round is sent."""
    tool_bytes = len(
        json.dumps(
            [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in loop.tools]
        ).encode("utf-8")
    ) if loop.tools else 0
    return PromptSize(
        **tags,
        phase=PHASE_RESPOND,
        system_bytes=len(loop.system.encode("utf-8")),
        user_bytes=len(loop.user.encode("utf-8")),
        tool_bytes=tool_bytes,
        tool_count=len(loop.tools),
        approx_tokens=approx_tokens(loop.system) + approx_tokens(loop.user) + tool_bytes // 4,
    )


def cache_tokens(answer: Completion) -> dict[str, int]:
    """A round's cached input, raw, under the keys the turn's totals use; nothing when the cache served and stored none."""
    counts = {"cache_read_tokens": answer.cache_read_tokens, "cache_write_tokens": answer.cache_write_tokens}
    return counts if any(counts.values()) else {}


def record_calls(
    result: TurnResult,
    round_record: dict[str, Any],
    number: int,
    calls: Sequence[ToolCall],
    results: Sequence[tuple[str, ToolResult]],
) -> None:
    """Each call into its round (no arguments) and into the phase's ``tool_calls`` (with them)."""
    for call, (_, res) in zip(calls, results):
        seen = {
            "id": call.id,
            "name": call.name,
            "server": res.server,
            "tool": res.tool,
            "duration_ms": int(res.duration_s * 1000),
            "ok": res.ok,
            "error": (res.error or "")[:1000],
            "bytes": res.bytes,
        }
        round_record["tool_calls"].append(seen)
        round_record["tool_count"] += 1
        round_record["tool_bytes"] += res.bytes
        result.tool_calls.append({**seen, "round": number, "arguments": call.arguments})


async def progress(emit: Emit, tags: TurnTags, result: TurnResult, number: int) -> None:
    """``agent_turn_progress`` as round ``number`` begins: the round and the tokens the turn spent before it.

    Live only (never stored, never fed): the dashboard's live strip shows which
    round a running turn is on; the durable record of the rounds is the phase's.
    """
    await emit(
        AgentTurnProgress(
            **tags,
            phase=PHASE_RESPOND,
            iteration=1,
            round=number,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
        )
    )


async def finish(emit: Emit, loop: TurnState, result: TurnResult, tags: TurnTags) -> None:
    """The turn's record: its phase (cut to fit the wire), ``agent_turn_stopped`` if it stopped, ``turn.guard_breach``
    if a guard ended it (a failed turn, never a stop), then ``agent_turn_completed``."""
    seat = loop.seat
    stopped = result.outcome == OUTCOME_STOPPED
    failed = result.outcome == OUTCOME_FAILED
    refusal = next((r["refusal"] for r in reversed(result.rounds) if "refusal" in r), None)
    await emit(
        fit_phase(AgentPhaseCompleted(
            **tags,
            phase=PHASE_RESPOND,
            iteration=1,
            system_prompt=loop.system,
            user_prompt=loop.user,
            response=result.response,
            tool_calls=result.tool_calls,
            rounds=result.rounds,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            cache_read_tokens=result.cache_read_tokens,
            cache_write_tokens=result.cache_write_tokens,
            duration_ms=result.duration_ms,
            failed=failed,
            error_kind=result.error_kind,
            error=result.error[:1000],
            refusal=refusal if result.error_kind == STOP_REFUSAL else None,
            thread_block=loop.thread_block,
        ))
    )
    stop = loop.trigger.stop
    if stopped and result.stop_reason == STOP_PAUSED and stop is not None:
        await emit(AgentTurnStopped(**tags, stopped_by=stop.by, stopped_by_seat=stop.by_seat, reason=stop.reason))
    elif stopped:
        await emit(
            AgentTurnStopped(**tags, stopped_by=STOPPED_BY_ENGINE, reason=f"{result.stop_reason}: {result.error}"[:1000])
        )
    if result.guard:
        detail = result.error.removeprefix(f"{result.guard}: ")[:1000]
        await emit(TurnGuardBreach(**tags, guard=result.guard, detail=detail))
        log.warning("turn_guard_breach", extra={"seat": seat.handle, "turn_id": loop.trigger.turn_id, "guard": result.guard})
    await emit(
        AgentTurnCompleted(
            **tags,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            cache_read_tokens=result.cache_read_tokens,
            cache_write_tokens=result.cache_write_tokens,
            tools=list(dict.fromkeys(c["name"] for c in result.tool_calls)),
            tool_calls=len(result.tool_calls),
            iterations=1,
            duration_ms=result.duration_ms,
            failed=failed,
            stopped=stopped,
            error=result.error[:1000] if failed else "",
        ),
        extras={"outcome": result.outcome},
    )
    log.info(
        "agent_turn_finished",
        extra={
            "seat": seat.handle,
            "turn_id": loop.trigger.turn_id,
            "outcome": result.outcome,
            "provider": result.provider_key,
            "rounds": len({r["round"] for r in result.rounds}),
            "tool_calls": len(result.tool_calls),
            "stop_reason": result.stop_reason,
            "duration_ms": result.duration_ms,
        },
    )


__all__ = [
    "CUT_ARGUMENTS",
    "CUT_KEEP_CHARS",
    "CUT_MARK",
    "PHASE_RECORD_MAX_BYTES",
    "cache_tokens",
    "finish",
    "fit_phase",
    "progress",
    "prompt_size",
    "record_calls",
]
