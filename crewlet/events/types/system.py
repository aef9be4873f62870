"""System bodies: a turn and its phases as they run, spend and budgets, guards and provider trouble, and the engine's own failures.

Beside the design's list, this build's extensions are here: a message
dead-lettered, a seat no live node may run, a tool server restarted or
unavailable, and a history read's partial answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.registry import LIFECYCLE, SYSTEM, register
from crewlet.events.types.base import (
    EventBody,
    _ActorTags,
    _CachedTokens,
    _Failure,
    _IterationBody,
    _person,
    _PhaseBody,
    _plural,
    _RoundBody,
    _s,
    _SeatBody,
    _tail,
    _Tokens,
    _TurnBody,
    _WorkItemTags,
)
from crewlet.events.types.phrases import STEER_EXPIRED

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@register("agent_turn_started", category=SYSTEM)
class AgentTurnStarted(_TurnBody, _WorkItemTags):
    """A turn, or a resumed segment of one, beginning — before its context is assembled.

    ``work_item`` is ``{backend, id, key, project}`` or None when nothing named
    one; ``work_item_basis`` one of WORK_ITEM_BASES. Its depth is the
    envelope's ``delegation_depth``. ``resumed`` marks a parked coding run's
    resumed segment under the same ``turn_id``.
    """

    trigger_type: str = ""
    trigger_event_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        verb = "resumed" if self.resumed else "started"
        woke = _tail(self.trigger_type, " on ")
        item = _tail((self.work_item or {}).get("key") if isinstance(self.work_item, dict) else "", " for ")
        return f"{self.actor(event)} {verb} a turn{item}{woke}"


@register("agent_turn_completed", category=SYSTEM)
class AgentTurnCompleted(_TurnBody, _WorkItemTags, _CachedTokens):
    """A full reasoning cycle with tokens and tools.

    ``suspended`` on a segment that parked on a coding run; ``stopped`` (never
    with ``failed``) on a turn a person ended.
    """

    tools: list[str] = field(default_factory=list)
    tool_calls: int = 0
    iterations: int = 0
    duration_ms: int = 0
    failed: bool = False
    error: str = ""
    suspended: bool = False
    stopped: bool = False

    def summary(self, event: Optional[Event] = None) -> str:
        who = self.actor(event)
        if self.failed:
            return f"{who}'s turn failed" + _tail(self.error)
        if self.stopped:
            return f"{who}'s turn was stopped"
        if self.suspended:
            return f"{who} parked its turn on a coding run"
        tokens = self.input_tokens + self.output_tokens
        return f"{who} finished a turn ({tokens} tokens, {_plural(self.tool_calls, 'tool call')})"


@register("agent_turn_stopped", category=SYSTEM)
class AgentTurnStopped(_TurnBody):
    """A pause with stop_running ended this turn at its next round; its trigger counts as worked."""

    stopped_by: str = ""
    stopped_by_seat: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_person(self.stopped_by, self.stopped_by_seat)} stopped {self._seat()}'s turn" + _tail(self.reason)


@register("agent_turn_steered", category=SYSTEM)
class AgentTurnSteered(_RoundBody):
    """What became of a person's note to a running turn; the note's only durable record."""

    status: str = ""  # one of STEER_STATUSES
    note: str = ""
    note_id: str = ""
    steered_by: str = ""
    steered_by_seat: str = ""
    sent_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = _person(self.steered_by, self.steered_by_seat)
        if _s(self.status) == STEER_EXPIRED:
            return f"{who}'s note to {self._seat()} expired before it was read" + _tail(self.note)
        return f"{who} steered {self._seat()}'s turn" + _tail(self.note)


@register("agent_turn_progress", category=SYSTEM, stored=False)
class AgentTurnProgress(_RoundBody, _Tokens):
    """Not stored: a live per-round signal; agent_phase_completed is the durable record."""

    tool: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} is working" + _tail(self.phase, " on ") + _tail(self.tool, ", using ")


@register("agent_phase_started", category=SYSTEM)
class AgentPhaseStarted(_IterationBody):

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} began phase" + _tail(self.phase, " ")


@register("agent_phase_completed", category=SYSTEM)
class AgentPhaseCompleted(_IterationBody, _CachedTokens, _Failure):
    """One phase's durable record: prompts, response, tool calls and ``rounds[]``.

    Each round is ``{timing, tokens, stop_reason}`` (STOP_REASONS; absent where
    the backend reported none). A failed phase carries ``error_kind``; a phase
    whose model declined carries ``refusal`` ``{category, explanation}`` beside
    ``error_kind: refusal``.
    """

    system_prompt: str = ""
    user_prompt: str = ""
    response: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    duration_ms: int = 0
    failed: bool = False
    refusal: Optional[dict[str, Any]] = None
    #: The parts cut to fit the record on the wire (``response``, ``user_prompt``,
    #: ``system_prompt``, ``tool_calls.arguments``), largest first; empty when whole.
    truncated: list[str] = field(default_factory=list)
    #: What the turn read of its conversation (``surface``, ``status``: read | failed | unread, ``shown``,
    #: ``left_out``, ``waiting``, ``error``); None for a trigger from no conversation.
    thread_block: Optional[dict[str, Any]] = None

    def summary(self, event: Optional[Event] = None) -> str:
        who = self.actor(event)
        if self.failed or _s(self.error_kind):
            return f"{who}'s phase" + _tail(self.phase, " ") + " failed" + _tail(self.error_kind)
        return f"{who} completed phase" + _tail(self.phase, " ") + f" in {_plural(len(self.rounds), 'round')}"


@register("auxiliary_spend", category=SYSTEM, fed=False)
class AuxiliarySpend(EventBody, _Tokens, _ActorTags):
    """What the auxiliary model cost for one key, coalesced over one flush of the node's ledger.

    Stored and NOT fed: accounting, not activity. No prompt, no response, and
    deliberately no ``failed`` key (``failed_calls`` counts them).
    """

    stage: str = ""  # one of AUX_STAGES
    purpose: str = ""
    seat: str = ""
    person: str = ""
    turn_id: str = ""
    model: str = ""
    provider_key: str = ""
    company_day: str = ""
    calls: int = 0
    failed_calls: int = 0
    first_started_at: str = ""
    last_ended_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        for_whom = _s(self.seat) or _s(self.person) or "the company"
        return (
            f"{for_whom} spent {self.input_tokens + self.output_tokens} auxiliary tokens over"
            f" {_plural(self.calls, 'call')}" + _tail(self.purpose, " on ")
        )


@register("budget_exhausted", category=SYSTEM)
class BudgetExhausted(_TurnBody):
    """A charge the token budget refused ended a turn; names the refusing window."""

    scope: str = ""
    period: str = ""
    window: str = ""
    resets_at: str = ""
    spend: int = 0
    ceiling: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} ran out of {_s(self.period) or 'token'} budget ({self.spend}/{self.ceiling})" + _tail(
            self.resets_at, ", resets "
        )


@register("budget_meters", category=SYSTEM, stored=False)
class BudgetMeters(EventBody):
    """Not stored: the fleet's shared token counters, every capped window with its state.

    Published on a tick and at once when a window first turns work away; the
    next report supersedes it, and the live projection reads it. Each of
    ``windows`` has the :data:`~crewlet.events.types.phrases.METER_KEYS`:
    ``scope`` (company | seat), ``seat`` ("" for the company's), ``period``
    (day | month), ``window`` (its label in the company's timezone),
    ``resets_at``, ``spend``, ``ceiling`` and ``state`` (open | exhausted).
    """

    windows: list[dict[str, Any]] = field(default_factory=list)
    trigger: str = ""  # METERS_ON_TICK | METERS_ON_REFUSAL

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} reported {_plural(len(self.windows), 'budget window')}"


@register(
    "history_partial",
    category=SYSTEM,
    stored=False,
    extension=(
        "the design's history_partial alarm counts the history reads that came back without every node; "
        "this is the record each such read publishes, naming who did not answer and why"
    ),
)
class HistoryPartial(EventBody):
    """Not stored: a history read that came back without every live node (an extension to the design's list).

    Live-only because a read of the event log that wrote a row would grow the
    log every time somebody looked at it; the alarm and a live tab read it
    from the stream. ``missing`` is ``[{"id", "error"}]`` for each node that
    did not answer, ``asked`` how many live nodes the read asked.
    """

    question: str = ""
    asked: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, event: Optional[Event] = None) -> str:
        names = ", ".join(_s(m.get("id")) for m in self.missing if isinstance(m, dict)) or "a node"
        return f"a {_s(self.question) or 'history'} read came back without {names}"


@register("turn.guard_breach", category=SYSTEM)
class TurnGuardBreach(_TurnBody):
    """A runtime invariant fired (GUARDS). A failed turn: the seat's last_error, never a stop."""

    guard: str = ""
    detail: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s turn broke a guard" + _tail(self.guard) + _tail(self.detail, " — ")


@register("llm_unavailable", category=SYSTEM)
class LLMUnavailable(_PhaseBody):
    """The fallback chain is exhausted."""

    providers: list[str] = field(default_factory=list)
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} could reach no model provider" + _tail(self.error)


@register("provider_fallback", category=SYSTEM)
class ProviderFallback(_IterationBody, _Failure):
    """The chain moved to its next provider: one per provider call; empty ``to_provider_key`` on the last."""

    from_provider_key: str = ""
    to_provider_key: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        to = _s(self.to_provider_key) or "nothing left"
        return f"{self.actor(event)} fell back from {_s(self.from_provider_key) or '?'} to {to}" + _tail(self.error_kind)


@register("subagent_batched", category=SYSTEM)
class SubagentBatched(_PhaseBody):
    count: int = 0
    tasks: list[str] = field(default_factory=list)

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} ran {_plural(self.count, 'subagent')} together"


@register("phase.tool_skill_blocked", category=SYSTEM)
class PhaseToolSkillBlocked(_PhaseBody):
    tool: str = ""
    skill: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} was kept from {_s(self.tool) or _s(self.skill) or 'a tool'}" + _tail(self.reason)


@register("skill_telemetry_write_failed", category=SYSTEM)
class SkillTelemetryWriteFailed(_SeatBody):
    skill_id: str = ""
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} could not record use of skill {_s(self.skill_id) or '?'}" + _tail(self.error)


@register("prompt.size", category=SYSTEM)
class PromptSize(_PhaseBody):
    """One phase's OPENING prompt in bytes, plus a token approximation."""

    system_bytes: int = 0
    user_bytes: int = 0
    message_bytes: int = 0
    tool_bytes: int = 0
    tool_count: int = 0
    approx_tokens: int = 0
    #: The memory block inside the user prompt (its bytes are counted in ``user_bytes`` too) and its rows.
    memory_bytes: int = 0
    memory_rows: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        total = self.system_bytes + self.user_bytes + self.message_bytes + self.tool_bytes
        return f"{self.actor(event)} opened phase" + _tail(self.phase, " ") + f" with a {total}-byte prompt"


# dead_lettered reasons: the delivery budget ran out, or the bytes decode as no event.
DEAD_LETTER_MAX_DELIVERIES = "max_deliveries"
DEAD_LETTER_UNDECODABLE = "undecodable"
DEAD_LETTER_REASONS: tuple[str, ...] = (DEAD_LETTER_MAX_DELIVERIES, DEAD_LETTER_UNDECODABLE)


@register(
    "seats_unplaceable",
    category=LIFECYCLE,
    extension=(
        "a seat whose placement no live node matches runs nowhere while its mail waits on the broker; "
        "the row is how an operator finds out which seats and why, after the fact"
    ),
)
class SeatsUnplaceable(EventBody):
    """Agent seats no live node may run, each with why (an extension to the design's list).

    Published by the fleet's placement sweep (one node, under a duty lease)
    each time the set changes. ``seats`` holds ``{seat, reason, placement}``:
    ``reason`` is one of :mod:`crewlet.fleet.placement`'s reason phrases and
    ``placement`` what the seat asks for in the company file's words. Their
    mail waits on the broker and drains once a matching node appears.
    """

    seats: list[dict[str, str]] = field(default_factory=list)
    count: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        named = ", ".join(f"{_s(s.get('seat'))} ({_s(s.get('reason'))})" for s in self.seats if isinstance(s, dict))
        return f"{self.count} seat(s) no live node may run: {named}"


@dataclass
class _QueueRecord(EventBody):
    """What the queue publishes about a message it settled: where it came from and what it was, never its bytes."""

    topic: str = ""
    group: str = ""
    seat: str = ""
    original_id: str = ""
    original_type: str = ""


@register(
    "message_dead_lettered",
    category=SYSTEM,
    extension=(
        "a dead letter left no row: the only record of poison was the dead-letter stream, "
        "which ages out and is not in any trace; the row names the entry and the event, never its bytes"
    ),
)
class MessageDeadLettered(_QueueRecord):
    """A message the queue copied to CREWLET_DLQ and terminated (an extension to the design's list).

    Published by the node whose consume loop decided it, under the trace of
    the event it buried, so the poison shows in the history and in the trace of
    the work it belonged to rather than only on the dead-letter stream. Names
    where it came from, the entry to replay (``ref``), how often it was tried
    and what it was (``original_id``, ``original_type``), never its bytes:
    those stay on CREWLET_DLQ.
    """

    ref: str = ""
    deliveries: int = 0
    reason: str = ""  # DEAD_LETTER_REASONS

    def summary(self, event: Optional[Event] = None) -> str:
        what = _s(self.original_type) or "a message"
        where = f"{_s(self.seat)}'s inbox" if _s(self.seat) else (_s(self.topic) or "its topic")
        tries = f" after {_plural(self.deliveries, 'delivery', 'deliveries')}" if self.deliveries else ""
        return f"{what} dead-lettered from {where}{tries}" + _tail(self.reason, " — ")


@register(
    "message_retry_scheduled",
    category=SYSTEM,
    extension=(
        "a failed delivery's wait left no record: which of its 25 deliveries a seat's mail had spent and when the "
        "broker brings it back were the broker's alone, so 'why is it waiting?' could not be answered from the "
        "history; the row names the message and its next attempt, never its bytes"
    ),
)
class MessageRetryScheduled(_QueueRecord):
    """A seat's inbox message a handler failed, handed back to come again after its backoff (an extension).

    Published by the node whose consume loop settled it, under the failed
    event's trace, beside the ``message_dead_lettered`` its last failure
    becomes instead. ``delivery`` counts the deliveries spent, this one
    included, of ``max_deliveries``; ``retry_at`` is when the broker offers it
    again (behind the mail waiting then).
    """

    delivery: int = 0
    max_deliveries: int = 0
    retry_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        what = _s(self.original_type) or "a message"
        return f"{what} for {_s(self.seat)} comes again at {_s(self.retry_at)} (delivery {self.delivery} of {self.max_deliveries} spent)"


@dataclass
class _ToolServerBody(_SeatBody):
    """One seat's session with one MCP server: whose, which server, over what, and what went wrong."""

    server: str = ""
    transport: str = ""  # stdio | http (crewlet.company.org.MCP_STDIO / MCP_HTTP)
    error: str = ""
    attempt: int = 0
    retry_in_s: float = 0.0


@register(
    "tool_server_restarted",
    category=SYSTEM,
    extension=(
        "a seat's MCP server died under it and was started again: without a row the only trace of a "
        "crashing tool server is tool calls that failed while it was down"
    ),
)
class ToolServerRestarted(_ToolServerBody):
    """A seat's session with an MCP server ended on its own (the process died, the connection dropped) and was opened again.

    ``error`` is why the old session ended, ``attempt`` how many starts it
    took since then and ``retry_in_s`` the backoff waited before the start
    that succeeded. Published by the node holding the seat.
    """

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s tool server {_s(self.server) or '?'} restarted" + _tail(self.error)


@register(
    "tool_server_unavailable",
    category=SYSTEM,
    extension=(
        "a seat's MCP server could not be started: the seat's turns run without its tools, and this row "
        "says why once instead of a failure on every turn"
    ),
)
class ToolServerUnavailable(_ToolServerBody):
    """A seat's MCP server could not be started (a missing program, a refused connection, a failed handshake).

    Published once per outage, not per attempt: the seat's turns run without
    the server's tools meanwhile, and starts are retried with backoff
    (``retry_in_s``) until one succeeds, which a ``tool_server_restarted``
    then reports.
    """

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s tool server {_s(self.server) or '?'} could not start" + _tail(self.error)
