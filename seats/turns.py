"""The turn runner seam: ``TurnRunner.run(seat, trigger) -> TurnResult``: the tool loop.

A turn is a loop of rounds in one phase. Each round calls the model with the
seat's system prompt, the trigger (the digest, for a coalesced drain), the
conversation so far and the tools the seat is granted — its MCP tools, listed
by the :class:`~seats.tools.base.Toolbox`, and the built-ins it names
(:mod:`seats.hooks`) — then runs every tool call the model asked for
(:mod:`seats.turn_tools`) and feeds the results back. A tool that fails or
times out is a result the model reads, never a crashed turn. The loop ends
on the model's ``end``; on ``refusal`` or ``max_tokens`` (the turn completes
with what was said, the phase's ``error_kind`` saying why); after a built-in
that ends the turn (``a2a_ask``); stopped, on its ``turn_token_budget``
(``agent_turn_stopped``, the trigger counted as worked); or failed, on the
seat's ``max_rounds`` — a guard breach (``turn.guard_breach`` ``max_iter``),
not a stop — or on a stall or a scheduled task's timeout (:mod:`seats.guards`),
or on a spent calendar budget (``budget_exhausted``: checked before each
round's call and each call charged, :mod:`seats.budget`).

A person's pause with ``stop_running`` ends the turn at its next round: the
inbox sets ``Trigger.stop``, and the loop reads it wherever it would start
something new — before each provider call and before each tool call — so
what is in flight (a provider call, a tool call) finishes and nothing
further starts. The round that does not run is recorded with
``stop_reason: paused`` and no provider call, and ``agent_turn_stopped``
names the person. A model that answers ``end`` on the call that was in flight
has ended its turn itself: that turn completes. A round that never ends (a
hung provider) is the inbox's to cancel after its grace. A person's note to
the running turn is read the same way, before each round's call
(:mod:`seats.steering`).

A turn woken by a chat message or a tracker comment is first shown the
conversation it belongs to, read from its backend with the seat's own
credentials (:mod:`seats.thread_block`); the waiting messages that block
showed it are in ``TurnResult.answered_in_thread``, for the inbox to write to
the completion ledger once the turn completes. A read that fails leaves the
block out and is said in the phase; it never fails the turn.

Every provider call is one entry of ``agent_phase_completed.rounds[]``, with
each tool call it led to; the phase, ``prompt.size`` and the turn's closing
events are :mod:`seats.turn_record`. The trigger, the result and the turn's
running state are :mod:`seats.turn_types`.

Providers come from the seat's own ``providers``, else the company's
``providers.llm`` (``Organization.providers_of``), read per turn from the
holder (never a snapshot), and are tried in order on every round: a transient
failure is first retried on the same entry within its ``retry`` bound
(:mod:`seats.retry`, each retry in the round's ``retries``), then each
hand-off publishes ``provider_fallback`` (``to_provider_key`` empty on the last
member) and an exhausted chain ``llm_unavailable``. Before every provider call
— a retry and a hand-off included — the turn checks its seat is still this
node's and nobody asked it to stop.

A redelivered trigger never runs a second turn once the first changed the
world, and that includes a turn that died with its process mid-tool: before
the turn's first call of a tool not marked read-only (``ToolSpec.read_only``)
runs, ``Trigger.before_write`` (the inbox's completion-ledger write) records
the trigger as worked by this turn, and ``TurnResult.wrote`` says so. A turn
that failed having only read is the caller's to NAK (worked again); one that
failed after a write is the caller's to abandon. A ledger that cannot be
written fails the turn before the write.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, Optional, Sequence

from crewlet.queue.emit import Emitter
from crewlet.base.logfmt import short_reason
from crewlet.company.conf import TURN_STALL_S
from crewlet.company.provider_retry import retry_policy
from crewlet.events.types import (
    ERROR_KIND_BUDGET_EXHAUSTED,
    GUARD_MAX_ITER,
    AgentPhaseStarted,
    AgentTurnCompleted,
    AgentTurnStarted,
    AgentTurnStopped,
    LLMUnavailable,
    ProviderFallback,
    STOP_MAX_TOKENS,
    STOP_PAUSED,
    STOP_REFUSAL,
)
from crewlet.company.org import CompanyHolder, Organization, Provider as ProviderConfig, Seat
from crewlet.queue.contract import EventQueue
from crewlet.events.tracing import trace_of
from seats import episodes, steering
from seats.guards import guarded
from seats.budget import BudgetKeeper
from seats.hooks import TurnHooks, declared_hooks
from seats.memory.block import memory_block, sized
from seats.provider_base import (
    ERR_BAD_REQUEST,
    ERR_UNAVAILABLE,
    ROLE_ASSISTANT,
    ROLE_TOOL,
    ROLE_USER,
    Completion,
    Message,
    ModelProvider,
    ModelRequest,
    ProviderError,
    admitted,
    error_text,
)
from seats.provider_sdk import DEFAULT_TIMEOUT_S
from seats.providers import build_provider
from seats.reply_target import with_reply_target
from seats.retry import Retrier
from seats.thread_block import read_thread_block, with_thread_block
from seats.tools.base import ToolResult, ToolSpec, Toolbox
from seats.turn_record import cache_tokens, finish, progress, prompt_size, record_calls
from seats.turn_tools import NoTools, act, granted, writes
from seats.turn_types import (
    ERR_CRASHED,
    ERR_LEDGER,
    ERR_LLM_UNAVAILABLE,
    ERR_NO_PROVIDER,
    OUTCOME_COMPLETED,
    OUTCOME_FAILED,
    OUTCOME_STOPPED,
    PHASE_RESPOND,
    STOP_LEASE_LOST,
    Trigger,
    TurnResult,
    TurnState,
    TurnTags,
)

log = logging.getLogger("crewlet.seats.turns")


def system_prompt(org: Organization, seat: Seat, tools: Sequence[ToolSpec] = (), where: str = "") -> str:
    """Who the seat is; with tools, also where the message came from, so a chat tool can answer in place; then its instructions.

    ``where`` is the trigger's partition key — ``slack:<channel>:<thread
    root ts>`` for a chat thread, ``slack:<channel>`` for a direct message,
    ``jira:<issue>`` for a tracker item — the only place a model learns which
    channel and thread its reply belongs in. The seat's own instructions
    (``seats[].instructions`` or its file) follow the engine's framing,
    after a blank line, so what the company says about the seat's job is
    read with the facts of this turn already given.
    """
    role = f", the {seat.role}" if seat.role else ""
    text = f"You are {seat.display_name}{role} at {org.org}. Answer the message below."
    if tools:
        text += " Use your tools to act; your final answer ends the turn."
        if where:
            text += f" The message came from {where}; to answer there, use your own tools for it."
    if seat.instructions:
        text += "\n\n" + seat.instructions
    return text


class TurnRunner:
    """Runs one turn for one seat and publishes what it did.

    ``provider_factory`` builds a provider from a company entry (tests swap
    it); the chain is read from the holder at the start of every turn, so an
    applied company's providers serve the very next turn. ``toolbox`` reaches
    the seats' MCP tools (none unless the engine gives it one). ``hooks`` are
    the built-in tools its turns offer and the after-turn hooks: the apps'
    declarations (:func:`~seats.hooks.declared_hooks`), read once here, unless
    given. ``retrier`` waits between a provider entry's retries (its scale and
    sleep are what a test shrinks).
    """

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        provider_factory: Callable[[ProviderConfig], ModelProvider] = build_provider,
        emitter: Optional[Emitter] = None,
        toolbox: Optional[Toolbox] = None,
        owns: Callable[[str], bool] = lambda handle: True,
        hooks: Optional[TurnHooks] = None,
        retrier: Optional[Retrier] = None,
        stall_s: float = TURN_STALL_S,
        budget: Optional[BudgetKeeper] = None,
    ) -> None:
        self.queue = queue
        #: ``node.turn_stall_s``: no provider answer or tool result for this long is a ``stall`` guard breach.
        self.stall_s = stall_s
        self.holder = holder
        self.provider_factory = provider_factory
        #: Whether this node may still do a seat's work at this instant (its lease, on its own clock):
        #: asked before every provider call and every tool call, so a node that wakes after its
        #: lease moved to another node makes no call for a seat that is no longer its own.
        self.owns = owns
        #: The seat runtime's telemetry publisher, shared by its inbox loops.
        self.emitter = emitter or Emitter(queue)
        self.toolbox: Toolbox = toolbox or NoTools()
        self.hooks: TurnHooks = declared_hooks() if hooks is None else hooks
        self.retrier = retrier or Retrier()
        #: The company's and the seats' token budgets (:mod:`seats.budget`), checked before each round's call.
        self.budget = budget
        #: What built-ins are handed by name (``BuiltinCall.services``): the seat runtime adds its sandbox coordinator.
        self.services: dict[str, object] = {}

    async def _emit(self, body: Any, extras: Optional[dict[str, Any]] = None) -> None:
        """Telemetry never fails a turn: a publish that fails is logged (and retried while the broker is away)."""
        await self.emitter.emit(body, trace_of(), extras=extras, log_event="turn_event_publish_failed")

    def _tags(self, seat: Seat, trigger: Trigger) -> TurnTags:
        return {
            "seat": seat.handle,
            "role": seat.role,
            "agent_id": seat.agent_id,
            "turn_id": trigger.turn_id,
            "conversation_key": trigger.conversation_key,
        }

    async def run(self, seat: Seat, trigger: Trigger) -> TurnResult:
        """One turn of ``seat`` woken by ``trigger``, published as it goes; how it ended is the result, never a raise."""
        org = self.holder.current()
        tags = self._tags(seat, trigger)
        started = time.monotonic()
        await self._emit(
            AgentTurnStarted(**tags, trigger_type=trigger.first.type, trigger_event_id=trigger.first.id)
        )
        await self._emit(AgentPhaseStarted(**tags, phase=PHASE_RESPOND, iteration=1))
        tools = await granted(self.toolbox, self.hooks.builtin_tools, seat)
        block = await read_thread_block(org, seat, trigger)
        memory = await memory_block(seat, trigger)
        user = with_reply_target(with_thread_block(trigger.prompt(), block), trigger, org, seat, tools)
        user = memory.text + await episodes.recall(org, seat, trigger, user)
        loop = TurnState(seat=seat, trigger=trigger, org=org, system=system_prompt(org, seat, tools, trigger.partition_key), user=user, tools=tools, thread_block=block.record)
        loop.messages.append(Message(role=ROLE_USER, text=user))
        await self._emit(sized(prompt_size(tags, loop), memory))
        result = TurnResult(turn_id=trigger.turn_id, outcome=OUTCOME_FAILED, answered_in_thread=block.waiting)
        try:
            await guarded(self._rounds(loop, result, tags), loop, result, stall_s=self.stall_s)
        except Exception as exc:
            # The turn may already have acted (its triggers are in the ledger
            # before its first write), so it must still end on record:
            # a failure the operator sees, never a silent skip on redelivery.
            log.error(
                "agent_turn_crashed",
                extra={"seat": seat.handle, "turn_id": trigger.turn_id, "error": short_reason(exc)},
                exc_info=trigger.first_delivery,
            )
            result.outcome, result.error_kind, result.error = OUTCOME_FAILED, ERR_CRASHED, error_text(short_reason(exc, 1000))
        finally:
            for provider in loop.providers.values():
                try:
                    await provider.aclose()
                except Exception as exc:  # closing a client never fails the turn it served
                    log.debug("provider_close_failed", extra={"provider": provider.key, "error": short_reason(exc)})
        result.duration_ms = int((time.monotonic() - started) * 1000)
        await steering.expire(self._emit, trigger, tags)
        await finish(self._emit, loop, result, tags)
        await episodes.remember(self._emit, loop, result, tags)
        return result

    async def _rounds(self, loop: TurnState, result: TurnResult, tags: TurnTags) -> None:
        """Call, act, feed back — until the model ends, a limit stops it, or the chain is exhausted."""
        seat = loop.seat
        chain: Sequence[ProviderConfig] = loop.org.providers_of(seat)
        if not chain:
            result.error_kind = ERR_NO_PROVIDER
            result.error = "no model provider: neither the seat's providers nor the company's providers.llm names one"
            return
        number = 0
        while True:
            if self._stopped(loop, result, number + 1):
                return
            if number >= seat.max_rounds:
                result.outcome, result.guard = OUTCOME_FAILED, GUARD_MAX_ITER
                result.error_kind = GUARD_MAX_ITER
                result.error = f"{GUARD_MAX_ITER}: no answer after {seat.max_rounds} rounds (the seat's max_rounds)"
                return
            budget = seat.turn_token_budget
            if budget and result.input_tokens + result.output_tokens >= budget:
                result.outcome, result.stop_reason = OUTCOME_STOPPED, ERROR_KIND_BUDGET_EXHAUSTED
                result.error_kind = ERROR_KIND_BUDGET_EXHAUSTED
                result.error = (
                    f"{result.input_tokens + result.output_tokens} tokens spent; "
                    f"the seat's turn_token_budget is {budget}"
                )
                return
            if self._fenced(loop, result) or await self._refused(loop, result, tags):
                return
            number += 1
            await steering.deliver(self._emit, loop, tags, number)
            await progress(self._emit, tags, result, number)
            answer = await self._call_chain(loop, result, tags, number)
            if answer is None:
                return
            loop.moved()
            if self.budget is not None:
                await self.budget.charge(seat, answer)
            result.input_tokens += answer.input_tokens
            result.output_tokens += answer.output_tokens
            result.cache_read_tokens += answer.cache_read_tokens
            result.cache_write_tokens += answer.cache_write_tokens
            result.response = answer.text
            result.stop_reason = answer.stop_reason
            round_record = result.rounds[-1]
            if answer.stop_reason in (STOP_REFUSAL, STOP_MAX_TOKENS) or not answer.calls:
                result.outcome = OUTCOME_COMPLETED
                result.error = result.error_kind = ""
                if answer.stop_reason in (STOP_REFUSAL, STOP_MAX_TOKENS):
                    result.error_kind = answer.stop_reason
                return
            results: list[tuple[str, ToolResult]] = []
            for call in answer.calls:
                if loop.trigger.stop is not None:
                    break  # nothing new starts once a person asked the turn to stop
                if self._fenced(loop, result):
                    break
                if not loop.wrote and writes(loop, call, answer) and not await self._before_write(loop, result):
                    break
                done = await act(self.queue, self.toolbox, self.hooks.builtin_tools, loop, call, answer, self.services)
                loop.moved()
                results.append((call.id, done))
            record_calls(result, round_record, number, answer.calls, results)
            if result.fenced or result.error_kind == ERR_LEDGER:
                return
            loop.messages.append(Message(role=ROLE_ASSISTANT, text=answer.text, calls=answer.calls))
            loop.messages.append(Message(role=ROLE_TOOL, results=tuple(results)))
            if loop.ended_by_tool:
                result.outcome = OUTCOME_COMPLETED
                result.error = result.error_kind = ""
                return

    async def _refused(self, loop: TurnState, result: TurnResult, tags: TurnTags) -> bool:
        """End the turn here, failed with ``budget_exhausted``, when a spent calendar window refuses its next call."""
        meter = await self.budget.refuse(loop.seat) if self.budget is not None else None
        if meter is None:
            return False
        await self._emit(meter.exhausted_body(tags))
        result.outcome, result.error_kind, result.error = OUTCOME_FAILED, ERROR_KIND_BUDGET_EXHAUSTED, meter.reason()
        return True

    async def _before_write(self, loop: TurnState, result: TurnResult) -> bool:
        """The completion ledger's row, before the turn's first call that can change the world; False if it could not be."""
        if loop.trigger.before_write is not None:
            try:
                await loop.trigger.before_write()
            except Exception as exc:
                result.error_kind, result.error = ERR_LEDGER, short_reason(exc, 1000)
                log.warning(
                    "seat_turn_unrecorded", extra={"seat": loop.seat.handle, "turn_id": loop.trigger.turn_id, "error": result.error}
                )
                return False
        loop.wrote = result.wrote = True
        return True

    def _complete(
        self,
        loop: TurnState,
        config: ProviderConfig,
        provider: ModelProvider,
        request: ModelRequest,
        retries: list[dict[str, Any]],
    ) -> Awaitable[Completion]:
        """One entry's call, retried within its ``retry`` bound while the seat is this node's and nobody stopped the turn."""
        return self.retrier.call(
            lambda: provider.complete(request),
            retry_policy(config.options),
            deadline_s=float(config.options.get("timeout_s", DEFAULT_TIMEOUT_S)),
            proceed=lambda: loop.trigger.stop is None and self.owns(loop.seat.handle),
            retries=retries,
            where={"seat": loop.seat.handle, "turn_id": loop.trigger.turn_id, "provider": config.key},
        )

    def _fenced(self, loop: TurnState, result: TurnResult) -> bool:
        """End the turn here, as stopped and handed back, when its seat is no longer this node's."""
        if self.owns(loop.seat.handle):
            return False
        result.outcome, result.stop_reason, result.error_kind = OUTCOME_STOPPED, STOP_LEASE_LOST, STOP_LEASE_LOST
        result.error = "the seat's lease was no longer this node's before the turn's next call"
        result.fenced = True
        log.warning("agent_turn_fenced", extra={"seat": loop.seat.handle, "turn_id": loop.trigger.turn_id})
        return True

    @staticmethod
    def _stopped(loop: TurnState, result: TurnResult, number: int) -> bool:
        """End the turn here, before round ``number``, when a person asked it to stop; that round is recorded as paused."""
        stop = loop.trigger.stop
        if stop is None:
            return False
        result.outcome, result.stop_reason = OUTCOME_STOPPED, STOP_PAUSED
        result.error_kind = STOP_PAUSED
        result.error = f"stopped by {stop.by or stop.by_seat or 'a person'}" + (f": {stop.reason}" if stop.reason else "")
        result.rounds.append(
            {
                "round": number,
                "started_ms": int((time.monotonic() - loop.started) * 1000),
                "duration_ms": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "stop_reason": STOP_PAUSED,
                "tool_count": 0,
                "tool_bytes": 0,
                "tool_calls": [],
            }
        )
        log.info("seat_turn_stopped_at_round", extra={"seat": loop.seat.handle, "turn_id": loop.trigger.turn_id, "round": number})
        return True

    async def _call_chain(self, loop: TurnState, result: TurnResult, tags: TurnTags, number: int) -> Optional[Completion]:
        """One round: the chain in order, each failure a hand-off; None (and ``llm_unavailable``) when all failed."""
        chain: Sequence[ProviderConfig] = loop.org.providers_of(loop.seat)
        request = ModelRequest(system=loop.system, messages=list(loop.messages), tools=loop.tools, seat=loop.seat.handle)
        for i, config in enumerate(chain):
            call_started = time.monotonic()
            retries: list[dict[str, Any]] = []
            try:
                provider = loop.providers.get(config.key)
                if provider is None:
                    provider = loop.providers[config.key] = self.provider_factory(config)
                answer = await self._complete(loop, config, provider, request, retries)
            except ProviderError as exc:
                kind, message = exc.kind, error_text(str(exc))
            except (ValueError, TypeError) as exc:  # a provider that cannot even be built is a hand-off too
                kind, message = ERR_BAD_REQUEST, error_text(str(exc))
            except Exception as exc:  # a provider's own bug still hands off; its traceback once per message
                log.warning(
                    "provider_call_crashed",
                    extra={"seat": loop.seat.handle, "provider": config.key, "error": short_reason(exc)},
                    exc_info=loop.trigger.first_delivery,
                )
                if not loop.trigger.first_delivery:
                    log.debug("provider_call_crashed_traceback", extra={"seat": loop.seat.handle}, exc_info=True)
                kind, message = ERR_UNAVAILABLE, error_text(short_reason(exc, 1000))
            else:
                answer = admitted(answer)
                entry: dict[str, Any] = {
                    "round": number,
                    "provider_key": config.key,
                    "model": answer.model,
                    "started_ms": int((call_started - loop.started) * 1000),
                    "duration_ms": int((time.monotonic() - call_started) * 1000),
                    "input_tokens": answer.input_tokens,
                    "output_tokens": answer.output_tokens,
                    "stop_reason": answer.stop_reason,
                    "tool_count": 0,
                    "tool_bytes": 0,
                    "tool_calls": [],
                }
                entry.update(cache_tokens(answer))
                if answer.refusal is not None:
                    entry["refusal"] = answer.refusal
                if retries:
                    entry["retries"] = retries
                result.rounds.append(entry)
                result.provider_key = config.key
                return answer
            result.rounds.append(
                {
                    "round": number,
                    "provider_key": config.key,
                    "started_ms": int((call_started - loop.started) * 1000),
                    "duration_ms": int((time.monotonic() - call_started) * 1000),
                    "error_kind": kind,
                    **({"retries": retries} if retries else {}),
                }
            )
            result.error_kind, result.error = kind, message
            if self._fenced(loop, result) or self._stopped(loop, result, number):
                return None  # no hand-off either: the next call is not this node's to make, or a person stopped the turn
            to_key = chain[i + 1].key if i + 1 < len(chain) else ""
            log.warning(
                "provider_fallback",
                extra={"seat": loop.seat.handle, "turn_id": loop.trigger.turn_id, "from": config.key, "to": to_key, "kind": kind},
            )
            await self._emit(
                ProviderFallback(
                    **tags,
                    phase=PHASE_RESPOND,
                    iteration=1,
                    from_provider_key=config.key,
                    to_provider_key=to_key,
                    error_kind=kind,
                    error=message[:1000],
                )
            )
        await self._emit(
            LLMUnavailable(**tags, phase=PHASE_RESPOND, providers=[c.key for c in chain], error=result.error[:1000])
        )
        result.error_kind = ERR_LLM_UNAVAILABLE
        result.outcome = OUTCOME_FAILED
        return None

    async def stopped(self, seat: Seat, trigger: Trigger, *, by: str, by_seat: str = "", reason: str = "") -> TurnResult:
        """A person's pause with ``stop_running`` ended this turn: say so, and close it as stopped."""
        tags = self._tags(seat, trigger)
        await steering.expire(self._emit, trigger, tags)
        await self._emit(AgentTurnStopped(**tags, stopped_by=by, stopped_by_seat=by_seat, reason=reason))
        await self._emit(AgentTurnCompleted(**tags, iterations=1, stopped=True), extras={"outcome": OUTCOME_STOPPED})
        log.info("agent_turn_stopped", extra={"seat": seat.handle, "turn_id": trigger.turn_id, "by": by})
        return TurnResult(turn_id=trigger.turn_id, outcome=OUTCOME_STOPPED)


__all__ = ["TurnRunner", "system_prompt"]
