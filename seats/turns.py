"""The turn runner seam: ``TurnRunner.run(seat, trigger) -> TurnResult``: the tool loop.

A turn is a loop of rounds in one phase. Each round calls the model with the
seat's system prompt, the trigger (the digest, for a coalesced drain), the
conversation so far and the tools the seat is granted — its MCP tools, listed
by the :class:`~seats.tools.base.Toolbox`, and the built-ins it names
(:mod:`seats.hooks`) — then runs every tool call the model asked for and
feeds the results back. A tool that fails or times out is a result the model
reads, never a crashed turn. The loop ends on the model's ``end``; on
``refusal`` or ``max_tokens`` (the turn completes with what was said, the
phase's ``error_kind`` saying why); after a built-in that ends the turn
(``a2a_ask``); or, stopped, on the seat's ``max_rounds`` or its
``turn_token_budget`` (``agent_turn_stopped``, the trigger counted as worked).

A person's pause with ``stop_running`` ends the turn at its next round: the
inbox sets ``Trigger.stop``, and the loop reads it wherever it would start
something new — before each provider call and before each tool call — so
what is in flight (a provider call, a tool call) finishes and nothing
further starts. The round that does not run is recorded with
``stop_reason: paused`` and no provider call, and ``agent_turn_stopped``
names the person. A model that answers ``end`` on the call that was in flight
has ended its turn itself: that turn completes. A round that never ends (a
hung provider) is the inbox's to cancel after its grace.

Every provider call is one entry of ``agent_phase_completed.rounds[]``: its
timing, tokens, ``stop_reason`` and each tool call it led to (server, tool,
duration, ok/error, result bytes; the round's ``tool_count`` and
``tool_bytes``). The arguments are kept once, on the phase's ``tool_calls``
beside the prompts — the phase's own durable record — never in the rounds.
``prompt.size`` measures the opening prompt and the tool array.

Providers come from the company's ``providers.llm``, read per turn from the
holder (never a snapshot), and are tried in order on every round: each
hand-off publishes ``provider_fallback`` (``to_provider_key`` empty on the last
member) and an exhausted chain ``llm_unavailable``. A failed turn is the
caller's to NAK.

A redelivered trigger never runs a second turn, and that includes a turn
whose rounds already called tools and then died with its process: before the
first tool call of a turn runs, ``Trigger.before_tools`` (the inbox's
completion-ledger write) records the trigger as worked by this turn. A
ledger that cannot be written fails the turn before anything acted.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence, TypedDict

from crewlet.events import Event
from crewlet.queue.emit import Emitter
from crewlet.base.logfmt import short_reason
from crewlet.events.types import (
    ERROR_KIND_BUDGET_EXHAUSTED,
    A2AMessage,
    AgentPhaseCompleted,
    AgentPhaseStarted,
    AgentTurnCompleted,
    AgentTurnStarted,
    AgentTurnStopped,
    LLMUnavailable,
    PromptSize,
    ProviderFallback,
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_PAUSED,
    STOP_REFUSAL,
    STOP_TOOL_USE,
    TaskAssigned,
)
from crewlet.company.org import CompanyHolder, Organization, Provider as ProviderConfig, Seat
from crewlet.queue.contract import MAX_PAYLOAD_BYTES, EventQueue
from crewlet.events.tracing import trace_of
from seats.hooks import BuiltinCall, BuiltinToolError, builtin_tools
from seats.ledger import storable
from seats.providers import (
    ERR_AUTH,
    ERR_BAD_REQUEST,
    ERR_BAD_RESPONSE,
    ERR_RATE_LIMITED,
    ERR_SERVER,
    ERR_TIMEOUT,
    ERR_UNAVAILABLE,
    ERR_UNREACHABLE,
    ROLE_ASSISTANT,
    ROLE_TOOL,
    ROLE_USER,
    AnthropicProvider,
    Completion,
    EchoProvider,
    Message,
    ModelProvider,
    ModelRequest,
    OpenAIProvider,
    ProviderError,
    admitted,
    approx_tokens,
    build_provider,
    error_text,
)
from seats.tools.base import ToolCall, ToolResult, ToolSpec, Toolbox

log = logging.getLogger("crewlet.seats.turns")

PHASE_RESPOND = "respond"
OUTCOME_COMPLETED = "completed"
OUTCOME_FAILED = "failed"
OUTCOME_STOPPED = "stopped"

ERR_LLM_UNAVAILABLE = "llm_unavailable"
ERR_NO_PROVIDER = "no_provider"
#: The turn itself raised (a bug, or content nothing downstream could handle): not a provider kind.
ERR_CRASHED = "crashed"
#: The completion ledger could not record the trigger before the turn's first tool call ran.
ERR_LEDGER = "ledger_unavailable"
#: The seat's ``max_rounds`` ended the turn (an ``agent_turn_stopped`` reason and the phase's ``error_kind``).
STOP_MAX_ROUNDS = "max_rounds"
#: A turn fenced off its seat: the lease was gone (the node froze, the store was away) before its next call.
STOP_LEASE_LOST = "lease_lost"
#: Who ``agent_turn_stopped`` names when the engine, not a person, ended a turn.
STOPPED_BY_ENGINE = "engine"


# -- the trigger and the result -----------------------------------------------


class _TurnTags(TypedDict):
    """The fields every event of one turn carries, spread into each body."""

    seat: str
    role: str
    agent_id: str
    turn_id: str
    conversation_key: str


@dataclass(frozen=True)
class TurnStop:
    """A person's request that the running turn end at its next round (who, from which seat, and why)."""

    by: str
    by_seat: str = ""
    reason: str = ""


@dataclass
class Trigger:
    """What woke the seat: one partition's fresh events, oldest first.

    ``first_delivery`` says every event is on its first delivery: a failure
    then logs its traceback, and the same failure on a redelivery logs one line.
    ``before_tools`` is awaited once, before the turn's first tool call runs:
    the inbox records the triggers in the completion ledger there, so a turn
    that has begun to act is never run again for them. ``stop`` is set by
    the inbox while the turn runs, when a person's pause asks it to end.
    """

    events: list[Event]
    turn_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    partition_key: str = ""
    conversation_key: str = ""
    first_delivery: bool = True
    before_tools: Optional[Callable[[], Awaitable[None]]] = None
    stop: Optional[TurnStop] = None

    @property
    def first(self) -> Event:
        return self.events[0]

    def prompt(self) -> str:
        """The user prompt: each wake as its sender and body, a task as its title and instructions.

        An A2A answer that still owes an ask (a chain: this seat asked on
        behalf of the ask it was given) is preceded by that ask, who asked
        and what: this turn's final response is the answer to it.
        """
        lines = []
        for ev in self.events:
            owed = ev.data.owed() if isinstance(ev.data, A2AMessage) else None
            if owed is not None:
                lines.append(
                    f"{owed.from_seat} asked you: {owed.brief}\n(You asked {ev.data.from_seat} to help; "
                    f"their answer follows, and your final answer goes back to {owed.from_seat}.)"
                )
            if isinstance(ev.data, TaskAssigned):
                text = f"Task: {ev.data.title}".strip()
                if ev.data.instructions and ev.data.instructions != ev.data.title:
                    text += f"\n{ev.data.instructions}"
                lines.append(text)
                continue
            body = ev.field("body")
            sender = ev.field("sender")
            if body:
                lines.append(f"{sender}: {body}" if sender else str(body))
            else:
                lines.append(ev.summary())
        return storable("\n".join(lines))


@dataclass
class TurnResult:
    """How a turn ended. ``outcome`` is completed | failed | stopped."""

    turn_id: str
    outcome: str
    response: str = ""
    provider_key: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    error_kind: str = ""
    duration_ms: int = 0
    #: Every tool call the turn made, in order, as the phase records it (arguments included).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    #: Why the loop ended: a STOP_REASONS value, or STOP_MAX_ROUNDS / budget_exhausted / STOP_LEASE_LOST on a stopped turn.
    stop_reason: str = ""
    #: The seat stopped being this node's mid-turn: its mail goes back to the seat's next holder.
    fenced: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_COMPLETED


def system_prompt(org: Organization, seat: Seat, tools: Sequence[ToolSpec] = (), where: str = "") -> str:
    """Who the seat is; with tools, also where the message came from, so a chat tool can answer in place.

    ``where`` is the trigger's partition key — ``slack:<channel>:<thread
    root ts>`` for a chat thread, ``slack:<channel>`` for a direct message,
    ``jira:<issue>`` for a tracker item — the only place a model learns which
    channel and thread its reply belongs in.
    """
    role = f", the {seat.role}" if seat.role else ""
    text = f"You are {seat.display_name}{role} at {org.org}. Answer the message below."
    if tools:
        text += " Use your tools to act; your final answer ends the turn."
        if where:
            text += f" The message came from {where}; to answer there, use your own tools for it."
    return text


class NoTools:
    """The toolbox of a node that runs no MCP servers: no seat has an MCP tool."""

    async def specs(self, handle: str) -> list[ToolSpec]:
        return []

    async def call(self, handle: str, call: ToolCall) -> ToolResult:
        return ToolResult(ok=False, content="", bytes=0, server="", tool=call.name, duration_s=0.0, error=f"no tool {call.name!r}")


def admitted_result(res: ToolResult) -> ToolResult:
    """A tool's result made storable where it enters the turn: NUL and lone surrogates in its words escaped."""
    content, error = storable(res.content), storable(res.error or "")
    if content is res.content and error == (res.error or ""):
        return res
    return dataclasses.replace(res, content=content, error=error)


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


def _refused(call: ToolCall, why: str, *, server: str = "") -> ToolResult:
    return ToolResult(ok=False, content="", bytes=0, server=server, tool=call.name, duration_s=0.0, error=why)


@dataclass
class _Loop:
    """One turn's running state: the conversation, the tools offered, and what each round did."""

    seat: Seat
    trigger: Trigger
    org: Organization
    system: str
    user: str
    tools: list[ToolSpec]
    messages: list[Message] = field(default_factory=list)
    providers: dict[str, ModelProvider] = field(default_factory=dict)
    acted: bool = False
    ended_by_tool: bool = False
    #: The phase's start on the monotonic clock: each round's ``started_ms`` is measured from it.
    started: float = field(default_factory=time.monotonic)


class TurnRunner:
    """Runs one turn for one seat and publishes what it did.

    ``provider_factory`` builds a provider from a company entry (tests swap
    it); the chain is read from the holder at the start of every turn, so an
    applied company's providers serve the very next turn. ``toolbox`` reaches
    the seats' MCP tools (none unless the engine gives it one).
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
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.provider_factory = provider_factory
        #: Whether this node may still do a seat's work at this instant (its lease, on its own clock):
        #: asked before every provider call and every tool call, so a node that wakes after its
        #: lease moved to another node makes no call for a seat that is no longer its own.
        self.owns = owns
        #: The seat runtime's telemetry publisher, shared by its inbox loops.
        self.emitter = emitter or Emitter(queue)
        self.toolbox: Toolbox = toolbox or NoTools()

    async def _emit(self, body: Any, extras: Optional[dict[str, Any]] = None) -> None:
        """Telemetry never fails a turn: a publish that fails is logged (and retried while the broker is away)."""
        await self.emitter.emit(body, trace_of(), extras=extras, log_event="turn_event_publish_failed")

    def _tags(self, seat: Seat, trigger: Trigger) -> _TurnTags:
        return {
            "seat": seat.handle,
            "role": seat.role,
            "agent_id": seat.agent_id,
            "turn_id": trigger.turn_id,
            "conversation_key": trigger.conversation_key,
        }

    async def _granted(self, seat: Seat) -> list[ToolSpec]:
        """The seat's MCP tools, then the built-ins it names; a toolbox that fails to list offers none."""
        try:
            specs = list(await self.toolbox.specs(seat.handle))
        except Exception as exc:
            log.warning("seat_tools_unlisted", extra={"seat": seat.handle, "error": short_reason(exc)})
            specs = []
        specs.extend(builtin_tools[name].spec for name in seat.tools if name in builtin_tools)
        return specs

    async def run(self, seat: Seat, trigger: Trigger) -> TurnResult:
        org = self.holder.current()
        tags = self._tags(seat, trigger)
        started = time.monotonic()
        await self._emit(
            AgentTurnStarted(**tags, trigger_type=trigger.first.type, trigger_event_id=trigger.first.id)
        )
        await self._emit(AgentPhaseStarted(**tags, phase=PHASE_RESPOND, iteration=1))
        tools = await self._granted(seat)
        user = trigger.prompt()
        loop = _Loop(seat=seat, trigger=trigger, org=org, system=system_prompt(org, seat, tools, trigger.partition_key), user=user, tools=tools)
        loop.messages.append(Message(role=ROLE_USER, text=user))
        await self._emit(self._prompt_size(tags, loop))
        result = TurnResult(turn_id=trigger.turn_id, outcome=OUTCOME_FAILED)
        try:
            await self._rounds(loop, result, tags)
        except Exception as exc:
            # The turn may already have acted (its triggers are in the ledger
            # before its first tool call), so it must still end on record:
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
        await self._finish(loop, result, tags)
        return result

    @staticmethod
    def _prompt_size(tags: _TurnTags, loop: _Loop) -> PromptSize:
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

    async def _rounds(self, loop: _Loop, result: TurnResult, tags: _TurnTags) -> None:
        """Call, act, feed back — until the model ends, a limit stops it, or the chain is exhausted."""
        seat = loop.seat
        chain: Sequence[ProviderConfig] = loop.org.providers
        if not chain:
            result.error_kind, result.error = ERR_NO_PROVIDER, "the company configures no model provider"
            return
        number = 0
        while True:
            if self._stopped(loop, result, number + 1):
                return
            if number >= seat.max_rounds:
                result.outcome, result.stop_reason = OUTCOME_STOPPED, STOP_MAX_ROUNDS
                result.error_kind = STOP_MAX_ROUNDS
                result.error = f"no answer after {seat.max_rounds} rounds (the seat's max_rounds)"
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
            if self._fenced(loop, result):
                return
            number += 1
            answer = await self._call_chain(loop, result, tags, number)
            if answer is None:
                return
            result.input_tokens += answer.input_tokens
            result.output_tokens += answer.output_tokens
            result.response = answer.text
            result.stop_reason = answer.stop_reason
            round_record = result.rounds[-1]
            if answer.stop_reason in (STOP_REFUSAL, STOP_MAX_TOKENS) or not answer.calls:
                result.outcome = OUTCOME_COMPLETED
                result.error = result.error_kind = ""
                if answer.stop_reason in (STOP_REFUSAL, STOP_MAX_TOKENS):
                    result.error_kind = answer.stop_reason
                return
            if not loop.acted and loop.trigger.before_tools is not None:
                try:
                    await loop.trigger.before_tools()
                except Exception as exc:
                    result.error_kind, result.error = ERR_LEDGER, short_reason(exc, 1000)
                    log.warning("seat_turn_unrecorded", extra={"seat": seat.handle, "turn_id": loop.trigger.turn_id, "error": result.error})
                    return
            loop.acted = True
            results: list[tuple[str, ToolResult]] = []
            for call in answer.calls:
                if loop.trigger.stop is not None:
                    break  # nothing new starts once a person asked the turn to stop
                if self._fenced(loop, result):
                    break
                results.append((call.id, await self._act(loop, call, answer)))
            self._record_calls(result, round_record, number, answer.calls, results)
            if result.fenced:
                return
            loop.messages.append(Message(role=ROLE_ASSISTANT, text=answer.text, calls=answer.calls))
            loop.messages.append(Message(role=ROLE_TOOL, results=tuple(results)))
            if loop.ended_by_tool:
                result.outcome = OUTCOME_COMPLETED
                result.error = result.error_kind = ""
                return

    def _fenced(self, loop: _Loop, result: TurnResult) -> bool:
        """End the turn here, as stopped and handed back, when its seat is no longer this node's."""
        if self.owns(loop.seat.handle):
            return False
        result.outcome, result.stop_reason, result.error_kind = OUTCOME_STOPPED, STOP_LEASE_LOST, STOP_LEASE_LOST
        result.error = "the seat's lease was no longer this node's before the turn's next call"
        result.fenced = True
        log.warning("agent_turn_fenced", extra={"seat": loop.seat.handle, "turn_id": loop.trigger.turn_id})
        return True

    @staticmethod
    def _stopped(loop: _Loop, result: TurnResult, number: int) -> bool:
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

    async def _call_chain(self, loop: _Loop, result: TurnResult, tags: _TurnTags, number: int) -> Optional[Completion]:
        """One round: the chain in order, each failure a hand-off; None (and ``llm_unavailable``) when all failed."""
        chain: Sequence[ProviderConfig] = loop.org.providers
        request = ModelRequest(system=loop.system, messages=list(loop.messages), tools=loop.tools, seat=loop.seat.handle)
        for i, config in enumerate(chain):
            call_started = time.monotonic()
            try:
                provider = loop.providers.get(config.key)
                if provider is None:
                    provider = loop.providers[config.key] = self.provider_factory(config)
                answer = await provider.complete(request)
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
                if answer.refusal is not None:
                    entry["refusal"] = answer.refusal
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
                }
            )
            result.error_kind, result.error = kind, message
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

    async def _act(self, loop: _Loop, call: ToolCall, answer: Completion) -> ToolResult:
        """Run one call: a built-in here, an MCP tool through the toolbox; every failure is a result."""
        offered = {t.name for t in loop.tools}
        if call.id in answer.invalid:
            return _refused(call, answer.invalid[call.id])
        if call.name not in offered:
            return _refused(call, f"no tool named {call.name!r} was offered; the tools are: {', '.join(sorted(offered)) or 'none'}")
        builtin = builtin_tools.get(call.name) if call.name in loop.seat.tools else None
        started = time.monotonic()
        if builtin is None:
            try:
                return admitted_result(await self.toolbox.call(loop.seat.handle, call))
            except Exception as exc:  # the toolbox promises results; one that raised is still only a failed call
                log.warning("seat_tool_call_raised", extra={"seat": loop.seat.handle, "tool": call.name, "error": short_reason(exc)})
                return _refused(call, storable(short_reason(exc, 1000)))
        try:
            content = await builtin.run(BuiltinCall(queue=self.queue, org=loop.org, seat=loop.seat, trigger=loop.trigger, call=call))
        except BuiltinToolError as exc:
            return ToolResult(
                ok=False, content="", bytes=0, server="", tool=call.name, duration_s=time.monotonic() - started,
                error=storable(str(exc)),
            )
        except Exception as exc:  # a built-in's own failure (its store, its publish) is a failed call the model reads
            log.warning("seat_builtin_raised", extra={"seat": loop.seat.handle, "tool": call.name, "error": short_reason(exc)})
            return _refused(call, storable(short_reason(exc, 1000)))
        loop.ended_by_tool = loop.ended_by_tool or builtin.ends_turn
        return ToolResult(
            ok=True,
            content=content,
            bytes=len(content.encode("utf-8")),
            server="",
            tool=call.name,
            duration_s=time.monotonic() - started,
        )

    @staticmethod
    def _record_calls(
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

    async def _finish(self, loop: _Loop, result: TurnResult, tags: _TurnTags) -> None:
        seat = loop.seat
        stopped = result.outcome == OUTCOME_STOPPED
        failed = result.outcome == OUTCOME_FAILED
        refusal = next((r["refusal"] for r in reversed(result.rounds) if "refusal" in r), None)
        await self._emit(
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
                duration_ms=result.duration_ms,
                failed=failed,
                error_kind=result.error_kind,
                error=result.error[:1000],
                refusal=refusal if result.error_kind == STOP_REFUSAL else None,
            ))
        )
        stop = loop.trigger.stop
        if stopped and result.stop_reason == STOP_PAUSED and stop is not None:
            await self._emit(AgentTurnStopped(**tags, stopped_by=stop.by, stopped_by_seat=stop.by_seat, reason=stop.reason))
        elif stopped:
            await self._emit(
                AgentTurnStopped(**tags, stopped_by=STOPPED_BY_ENGINE, reason=f"{result.stop_reason}: {result.error}"[:1000])
            )
        await self._emit(
            AgentTurnCompleted(
                **tags,
                input_tokens=result.input_tokens,
                output_tokens=result.output_tokens,
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

    async def stopped(self, seat: Seat, trigger: Trigger, *, by: str, by_seat: str = "", reason: str = "") -> TurnResult:
        """A person's pause with ``stop_running`` ended this turn: say so, and close it as stopped."""
        tags = self._tags(seat, trigger)
        await self._emit(AgentTurnStopped(**tags, stopped_by=by, stopped_by_seat=by_seat, reason=reason))
        await self._emit(AgentTurnCompleted(**tags, iterations=1, stopped=True), extras={"outcome": OUTCOME_STOPPED})
        log.info("agent_turn_stopped", extra={"seat": seat.handle, "turn_id": trigger.turn_id, "by": by})
        return TurnResult(turn_id=trigger.turn_id, outcome=OUTCOME_STOPPED)


__all__ = [
    "AnthropicProvider",
    "Completion",
    "EchoProvider",
    "ModelProvider",
    "NoTools",
    "OpenAIProvider",
    "ProviderError",
    "Trigger",
    "TurnResult",
    "TurnRunner",
    "TurnStop",
    "build_provider",
    "system_prompt",
    "ERR_AUTH",
    "ERR_BAD_REQUEST",
    "ERR_BAD_RESPONSE",
    "ERR_CRASHED",
    "STOP_LEASE_LOST",
    "ERR_LEDGER",
    "ERR_RATE_LIMITED",
    "ERR_SERVER",
    "ERR_TIMEOUT",
    "ERR_UNAVAILABLE",
    "ERR_UNREACHABLE",
    "OUTCOME_COMPLETED",
    "OUTCOME_FAILED",
    "OUTCOME_STOPPED",
    "STOPPED_BY_ENGINE",
    "STOP_MAX_ROUNDS",
]
