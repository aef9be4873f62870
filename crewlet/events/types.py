"""Every typed event body the design lists under Event Types, one class per wire type.

Each class is a dataclass registered with ``@register("<wire type>",
category=...)``, so its fields are marshalled flat beside the envelope and it
decodes back as itself. The registration is the one place a type is declared:
its category (the closed set in ``crewlet.events.registry``), ``stored=False``
for a live-only type (each class's docstring says why it is never a row),
``fed=False`` for a stored type kept out of the activity feed, and an
``extension`` reason for a type this build adds to the design's list.
The rules every class follows, because they are wire contracts:

* Every field has a default: changes are additive-only, and an event from an
  older build that lacks a newer field must still decode.
* No field shares a name with an envelope key (``id``, ``type``, ``source``,
  ``node``, the trace and delegation fields...): the envelope owns those and
  drops a colliding one, so such a field would silently never travel.
* Field names the event store promotes to tags are spelled exactly as it reads
  them: ``seat``, ``turn_id``, ``conversation_key``, ``partition_key``,
  ``actor_seat``, ``tool``, ``dir``. ``conversation_key`` is always the
  conversation IDENTITY; only ``notifications_coalesced`` carries a partition,
  and it spells it ``partition_key`` so one tag never means two things.
* Values are JSON-native (str, int, float, bool, list, dict, None): a body is
  written with ``json.dumps`` as it stands.

``summary()`` says who did what in a person's words; ``actor()`` names who,
by the design's precedence — the body's ``role``, then the envelope's
``source``, then the body's ``agent_id``, then "system" — with one documented
exception (``operator_acted``, whose actor is the token's own name).

``crewlet.events.categories`` derives the category map and the not-stored and
not-fed classes from these registrations.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.envelope import default_actor
from crewlet.events.labels import delivery_label
from crewlet.events.registry import (
    A2A,
    DECISION,
    LEARNING,
    LIFECYCLE,
    NOTIFICATION,
    SYSTEM,
    TASK,
    WEBHOOK,
    register,
)

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event

# --- fixed phrase sets ------------------------------------------------------

# notification_skipped reasons (design: Distributed Tracing, which fixes the
# phrases). A reader matches these exactly, so they are wire strings, defined
# here once; the particulars (a parser's error, the unmatched identity) go in
# ``detail``.
SKIP_PAYLOAD_UNREADABLE = "unreadable delivery payload"
SKIP_SOURCE_DISCONNECTED = "this source was disconnected"
SKIP_NO_PARSER = "no parser for this source"
SKIP_PARSER_REFUSED = "parse failed"
SKIP_NO_SEAT = "no seat matches this recipient"
SKIP_HUMAN_SEAT = "human seat"  # an info-level skip, not an undeliverable warning
SKIP_ROUTING_GATE_REFUSED = "self-action: the recipient caused this event"
SKIP_RATE_LIMITED = "rate limit exceeded"
SKIP_REASONS: tuple[str, ...] = (
    SKIP_PAYLOAD_UNREADABLE,
    SKIP_SOURCE_DISCONNECTED,
    SKIP_NO_PARSER,
    SKIP_PARSER_REFUSED,
    SKIP_NO_SEAT,
    SKIP_HUMAN_SEAT,
    SKIP_ROUTING_GATE_REFUSED,
    SKIP_RATE_LIMITED,
)

# sandbox_run_answered: what the answer became, and by which route.
ANSWER_RESUMED = "resumed"
ANSWER_NOT_AWAITING = "not_awaiting"
ANSWER_GONE = "gone"
ANSWER_DECLINED = "declined"
ANSWER_OUTCOMES: tuple[str, ...] = (ANSWER_RESUMED, ANSWER_NOT_AWAITING, ANSWER_GONE, ANSWER_DECLINED)
ROUTE_CHAT = "chat"
ROUTE_OPERATOR = "operator"
ANSWER_ROUTES: tuple[str, ...] = (ROUTE_CHAT, ROUTE_OPERATOR)

# agent_turn_started / agent_turn_completed: the rule that named the work item.
BASIS_TRIGGER = "trigger"
BASIS_ASKED_BY = "asked_by"
BASIS_RESUME = "resume"
BASIS_SOLE_WRITE = "sole_write"  # only a completion can conclude this one
WORK_ITEM_BASES: tuple[str, ...] = (BASIS_TRIGGER, BASIS_ASKED_BY, BASIS_RESUME, BASIS_SOLE_WRITE)

# agent_phase_completed rounds[].stop_reason.
STOP_END = "end"
STOP_TOOL_USE = "tool_use"
STOP_MAX_TOKENS = "max_tokens"
STOP_REFUSAL = "refusal"
STOP_CONTEXT_EXCEEDED = "context_exceeded"
STOP_PAUSED = "paused"
STOP_REASONS: tuple[str, ...] = (
    STOP_END,
    STOP_TOOL_USE,
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    STOP_CONTEXT_EXCEEDED,
    STOP_PAUSED,
)
ERROR_KIND_BUDGET_EXHAUSTED = "budget_exhausted"
ERROR_KIND_REFUSAL = "refusal"

# turn.guard_breach guards.
GUARD_STALL = "stall"
GUARD_MAX_ITER = "max_iter"
GUARD_DEPTH_CAP = "depth_cap"
GUARD_SCHEDULED_TIMEOUT = "scheduled_timeout"
GUARDS: tuple[str, ...] = (GUARD_STALL, GUARD_MAX_ITER, GUARD_DEPTH_CAP, GUARD_SCHEDULED_TIMEOUT)

# agent_turn_steered status.
STEER_DELIVERED = "delivered"
STEER_EXPIRED = "expired"
STEER_STATUSES: tuple[str, ...] = (STEER_DELIVERED, STEER_EXPIRED)

# knowledge_read via.
VIA_GET_PAGE = "get_page"
VIA_SEARCH = "search"
VIA_PREFETCH = "prefetch"
VIA_SKILL_LOADED = "skill_loaded"
VIA_SKILL_INJECTED = "skill_injected"
KNOWLEDGE_VIAS: tuple[str, ...] = (VIA_GET_PAGE, VIA_SEARCH, VIA_PREFETCH, VIA_SKILL_LOADED, VIA_SKILL_INJECTED)
QUERY_MAX_BYTES = 200

# auxiliary_spend stage.
STAGE_TURN = "turn"
STAGE_REFLECTION = "reflection"
STAGE_BACKGROUND = "background"
STAGE_OPERATOR = "operator"
AUX_STAGES: tuple[str, ...] = (STAGE_TURN, STAGE_REFLECTION, STAGE_BACKGROUND, STAGE_OPERATOR)

# inbound_delivery / raw_webhook body encodings.
BODY_TEXT = ""  # the body is the provider's bytes, which were valid UTF-8
BODY_BASE64 = "base64"  # the provider's bytes were not UTF-8; carried base64


def clip_query(text: str, limit: int = QUERY_MAX_BYTES) -> str:
    """A search query clipped to ``limit`` UTF-8 bytes without splitting a character."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore")


def _encode_body(raw: bytes) -> tuple[str, str]:
    import base64

    try:
        return raw.decode("utf-8"), BODY_TEXT
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), BODY_BASE64


def _decode_body(body: str, encoding: str) -> bytes:
    import base64

    if encoding == BODY_BASE64:
        return base64.b64decode(body)
    return body.encode("utf-8")


# --- the shared behaviour ---------------------------------------------------


def _s(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _tail(value: Any, prefix: str = ": ") -> str:
    """An optional clause: empty when there is nothing to say (empty, None, zero, a bool)."""
    if value is None or isinstance(value, bool):
        return ""
    text = str(value) if isinstance(value, (int, float)) and value else _s(value)
    return f"{prefix}{text}" if text else ""


def _person(name: Any, seat: Any = "") -> str:
    """A person as a reader knows them: their name, else their seat, else "someone"."""
    return _s(name) or _s(seat) or "someone"


def _plural(n: Any, one: str, many: Optional[str] = None) -> str:
    count = n if isinstance(n, int) and not isinstance(n, bool) else 0
    return f"{count} {one if count == 1 else (many or one + 's')}"


class EventBody:
    """Behaviour every typed body shares: the actor rule and a fallback summary.

    Not a dataclass and holds no fields, so it adds nothing to the wire.
    """

    event_type: str  # set by @register

    def actor(self, event: Optional["Event"] = None) -> str:
        """Role, then the envelope's source, then agent id, then "system"."""
        return default_actor(
            getattr(self, "role", ""),
            event.source if event is not None else "",
            getattr(self, "agent_id", ""),
        )

    def _seat(self) -> str:
        """The seat by its handle ("grace"), or "a seat" when the body names none."""
        return _s(getattr(self, "seat", "")) or "a seat"

    def _seat_ref(self) -> str:
        """The seat as an object of a sentence: "seat grace", or "a seat"."""
        name = _s(getattr(self, "seat", ""))
        return f"seat {name}" if name else "a seat"

    def summary(self, event: Optional["Event"] = None) -> str:  # pragma: no cover - every class overrides
        return f"{self.actor(event)}: {self.event_type.replace('_', ' ')}"


# =============================================================================
# lifecycle
# =============================================================================


@register("org_started", category=LIFECYCLE)
@dataclass
class OrgStarted(EventBody):
    """The org came up on this node."""

    org: str = ""
    revision: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} started the org" + _tail(self.org, " ") + _tail(self.revision, " on revision ")


@register("org_stopped", category=LIFECYCLE)
@dataclass
class OrgStopped(EventBody):
    """The org went down on this node."""

    org: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} stopped the org" + _tail(self.org, " ") + _tail(self.reason)


@register("config_revision_activated", category=LIFECYCLE)
@dataclass
class ConfigRevisionActivated(EventBody):
    """A new revision is the one to serve."""

    revision: int = 0
    previous_revision: int = 0
    activated_by: str = ""
    activated_by_seat: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = _s(self.activated_by) or _s(self.activated_by_seat) or self.actor(event)
        prev = f" (was {self.previous_revision})" if self.previous_revision else ""
        return f"{who} activated config revision {self.revision}{prev}"


@register("config_revision_applied", category=LIFECYCLE)
@dataclass
class ConfigRevisionApplied(EventBody):
    """One node's outcome applying a revision, and how far it got (the node is the envelope's)."""

    revision: int = 0
    outcome: str = ""  # applied | partial | failed
    reached: str = ""  # the last step it completed
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        node = _s(event.node) if event is not None else ""
        where = f"node {node}" if node else self.actor(event)
        how = _s(self.outcome) or "applied"
        return f"{where} {how} config revision {self.revision}" + _tail(self.reached, ", reached ") + _tail(self.error)


@register("operator_acted", category=LIFECYCLE)
@dataclass
class OperatorActed(EventBody):
    """The runtime audit: one operator tool call that is not a proven read, whatever became of it.

    From the dashboard (``/operator/act``) or a person's assistant
    (``/operator/mcp``). Source "operator"; the actor is the token's own name
    and ``actor_seat`` the person it is bound to. Never the arguments.
    """

    token: str = ""
    actor_seat: str = ""
    tool: str = ""
    transport: str = ""  # act | mcp
    request_id: str = ""
    outcome: str = ""
    position: str = ""
    refusal: str = ""

    def actor(self, event: Optional[Event] = None) -> str:
        """The token's own name (design: the runtime audit), then the general rule."""
        return _s(self.token) or super().actor(event)

    def summary(self, event: Optional[Event] = None) -> str:
        who = self.actor(event)
        seat = f" ({_s(self.actor_seat)})" if _s(self.actor_seat) and _s(self.actor_seat) != who else ""
        result = f", refused: {_s(self.refusal)}" if _s(self.refusal) else _tail(self.outcome, ", ")
        return f"{who}{seat} called {_s(self.tool) or 'an operator tool'}{result}"


@register("backup_requested", category=LIFECYCLE)
@dataclass
class BackupRequested(EventBody):
    """A POST /backup that began copying. Which node's disk holds it is the envelope's ``node``."""

    dir: str = ""
    finished: bool = False
    streams: int = 0
    token: str = ""
    actor_seat: str = ""
    error: str = ""

    def actor(self, event: Optional[Event] = None) -> str:
        """Like the rest of the runtime audit, the token's own name first."""
        return _s(self.token) or super().actor(event)

    def summary(self, event: Optional[Event] = None) -> str:
        state = "finished" if self.finished else "did not finish"
        where = _tail(self.dir, " to ")
        return f"{self.actor(event)} backed up {_plural(self.streams, 'stream')}{where} ({state})" + _tail(self.error)


@register("seat_paused", category=LIFECYCLE)
@dataclass
class SeatPaused(EventBody):
    """A person paused a seat; published once per change by the caller whose compare-and-set won."""

    seat: str = ""
    paused_by: str = ""
    paused_by_seat: str = ""
    reason: str = ""
    stop_running: bool = False
    paused_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        stop = " and stopped its running turn" if self.stop_running else ""
        return f"{_person(self.paused_by, self.paused_by_seat)} paused {self._seat_ref()}{stop}" + _tail(self.reason)


@register("seat_resumed", category=LIFECYCLE)
@dataclass
class SeatResumed(EventBody):
    """The pause was lifted; names the pause it ended."""

    seat: str = ""
    resumed_by: str = ""
    resumed_by_seat: str = ""
    paused_by: str = ""
    paused_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        ended = f" (paused by {_s(self.paused_by)})" if _s(self.paused_by) else ""
        return f"{_person(self.resumed_by, self.resumed_by_seat)} resumed {self._seat_ref()}{ended}"


@register("agent_spawned", category=LIFECYCLE, stored=False)
@dataclass
class AgentSpawned(EventBody):
    """Not stored: this node acquired a seat. Placement moves seats on every rebalance; live projection only."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        node = _s(event.node) if event is not None else ""
        return f"{self.actor(event)} came up as {self._seat_ref()}" + _tail(node, " on ")


@register("agent_terminated", category=LIFECYCLE, stored=False)
@dataclass
class AgentTerminated(EventBody):
    """Not stored: this node released a seat. Placement moves seats on every rebalance; live projection only."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} stopped as {self._seat_ref()}" + _tail(self.reason)


# =============================================================================
# task
# =============================================================================


@register("task_assigned", category=TASK)
@dataclass
class TaskAssigned(EventBody):
    """Work published to a seat's inbox by the scheduler."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    schedule_id: str = ""
    title: str = ""
    instructions: str = ""
    work_item: Optional[dict[str, Any]] = None
    assigned_by: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        by = _s(self.assigned_by) or "the scheduler"
        return f"{by} assigned {self._seat()} a task" + _tail(self.title)


@dataclass
class _RunBody(EventBody):
    """Fields every coding-run event shares."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    run_id: str = ""
    turn_id: str = ""
    conversation_key: str = ""
    work_key: str = ""


@register("sandbox_run_started", category=TASK)
@dataclass
class SandboxRunStarted(_RunBody):
    """A detached coding run began executing."""

    task: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} started coding run" + _tail(self.run_id, " ") + _tail(self.task)


@register("sandbox_clarification_requested", category=TASK)
@dataclass
class SandboxClarificationRequested(_RunBody):
    """A run stopped to ask a person something; it holds nothing while it waits."""

    question: str = ""
    asked_in: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s coding run" + _tail(self.run_id, " ") + " asked" + _tail(self.question)


@register("sandbox_run_completed", category=TASK)
@dataclass
class SandboxRunCompleted(_RunBody):
    """A run settled."""

    outcome: str = ""
    result: str = ""
    duration_seconds: float = 0.0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} finished coding run" + _tail(self.run_id, " ") + _tail(self.outcome or self.result)


@register("sandbox_run_failed", category=TASK)
@dataclass
class SandboxRunFailed(_RunBody):
    """A run lost, once: republished under the id and instant its ending recorded on the row."""

    error: str = ""
    ended_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s coding run" + _tail(self.run_id, " ") + " failed" + _tail(self.error)


@register("sandbox_run_answered", category=TASK)
@dataclass
class SandboxRunAnswered(_RunBody):
    """What an answer to a parked run's question became, by which route, and from whom."""

    outcome: str = ""  # one of ANSWER_OUTCOMES
    route: str = ""  # one of ANSWER_ROUTES
    answered_by: str = ""
    answered_by_seat: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        via = f" via {_s(self.route)}" if _s(self.route) else ""
        return (
            f"{_person(self.answered_by, self.answered_by_seat)} answered {self._seat()}'s coding run"
            + _tail(self.run_id, " ") + via + _tail(self.outcome)
        )


@register("sandbox_answer_given", category=TASK, stored=False)
@dataclass
class SandboxAnswerGiven(_RunBody):
    """Not stored: the operator route's answer to a parked run, travelling as an inbox wake; never a turn."""

    answer: str = ""
    answered_by: str = ""
    answered_by_seat: str = ""
    request_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_person(self.answered_by, self.answered_by_seat)} answered coding run" + _tail(self.run_id, " ")


@register("scheduled_task_fired", category=TASK)
@dataclass
class ScheduledTaskFired(EventBody):
    """A schedule fired and created a task for its target seat."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    schedule_id: str = ""
    schedule_name: str = ""
    task_event_id: str = ""
    fired_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        name = _s(self.schedule_name) or _s(self.schedule_id)
        return (f"schedule {name}" if name else "a schedule") + f" fired for {self._seat()}"


# =============================================================================
# a2a
# =============================================================================


@register("a2a_channel_opened", category=A2A)
@dataclass
class A2AChannelOpened(EventBody):
    """An agent asked another one something: the channel and its brief (content lives only in events)."""

    channel_id: str = ""
    participants: list[str] = field(default_factory=list)
    opened_by: str = ""
    target: str = ""
    brief: str = ""
    turn_id: str = ""
    work_key: str = ""
    role: str = ""
    agent_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = _s(self.opened_by) or self.actor(event)
        return f"{who} asked {_s(self.target) or 'another agent'} over A2A" + _tail(self.brief)


@register("a2a_message_sent", category=A2A)
@dataclass
class A2AMessageSent(EventBody):
    """A message on an A2A channel (the answer, in practice)."""

    channel_id: str = ""
    from_seat: str = ""
    to_seat: str = ""
    message: str = ""
    message_count: int = 0
    turn_id: str = ""
    role: str = ""
    agent_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = _s(self.from_seat) or self.actor(event)
        return f"{who} replied to {_s(self.to_seat) or 'another agent'} over A2A" + _tail(self.message)


#: How a close with no ``closed_by`` (the sweep's) reads: no participant and no turn behind it.
SYSTEM_CLOSED_A2A = "system closed A2A channel"


@register("a2a_channel_closed", category=A2A)
@dataclass
class A2AChannelClosed(EventBody):
    """A channel closed, by its answering turn or by the sweep.

    A close by the answering turn names that seat in ``closed_by`` and that
    run in ``turn_id`` / ``work_key``; the sweep's names neither, which is the
    whole signal. ``open_seconds`` is the record's own closed_at - opened_at,
    never a difference of two nodes' clocks.
    """

    channel_id: str = ""
    participants: list[str] = field(default_factory=list)
    message_count: int = 0
    open_seconds: float = 0.0
    closed_by: str = ""
    turn_id: str = ""
    work_key: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        head = f"{_s(self.closed_by)} closed A2A channel" if _s(self.closed_by) else SYSTEM_CLOSED_A2A
        between = " and ".join(_s(p) for p in self.participants if _s(p))
        return (
            head + _tail(self.channel_id, " ") + _tail(between, " between ")
            + f" after {_plural(self.message_count, 'message')}"
        )


@register("a2a_request", category=A2A, stored=False)
@dataclass
class A2ARequest(EventBody):
    """Not stored: the ask, as a wake in the target's inbox (its row is a2a_channel_opened)."""

    channel_id: str = ""
    from_seat: str = ""
    to_seat: str = ""
    brief: str = ""
    turn_id: str = ""
    conversation_key: str = ""
    role: str = ""
    agent_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.from_seat) or self.actor(event)} asked {_s(self.to_seat) or 'another agent'}" + _tail(self.brief)


@register("a2a_message", category=A2A, stored=False)
@dataclass
class A2AMessage(EventBody):
    """Not stored: the answer, as a wake in the asker's inbox (its row is a2a_message_sent)."""

    channel_id: str = ""
    from_seat: str = ""
    to_seat: str = ""
    message: str = ""
    turn_id: str = ""
    conversation_key: str = ""
    role: str = ""
    agent_id: str = ""
    #: In a chain of asks, the ask the receiver still owes an answer on (the channel it asked this one on
    #: behalf of), as that ask's ``a2a_request`` fields: the turn this answer wakes answers THAT ask, so
    #: its prompt must show what was asked beside the answer that came back. Empty when nothing is owed.
    owed_ask: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def owing(request: A2ARequest) -> dict[str, Any]:
        """``owed_ask``'s value for the still-owed ask ``request``."""
        return asdict(request)

    def owed(self) -> Optional[A2ARequest]:
        """The ask the receiver still owes an answer on (``owed_ask`` read back), or None when it owes none."""
        if not isinstance(self.owed_ask, dict) or not self.owed_ask:
            return None
        known = {f.name for f in fields(A2ARequest)}
        return A2ARequest(**{k: str(v) for k, v in self.owed_ask.items() if k in known and v is not None})

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.from_seat) or self.actor(event)} answered {_s(self.to_seat) or 'another agent'}" + _tail(
            self.message
        )


# =============================================================================
# decision — published by nothing in this build; the seam an extension writes through
# =============================================================================


@register("decision_requested", category=DECISION)
@dataclass
class DecisionRequested(EventBody):
    decision_id: str = ""
    title: str = ""
    options: list[str] = field(default_factory=list)
    requested_by: str = ""
    driver: str = ""
    approver: str = ""
    contributors: list[str] = field(default_factory=list)
    informed: list[str] = field(default_factory=list)
    work_item: Optional[dict[str, Any]] = None

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.requested_by) or self.actor(event)} asked for a decision" + _tail(self.title)


@register("decision_resolved", category=DECISION)
@dataclass
class DecisionResolved(EventBody):
    decision_id: str = ""
    title: str = ""
    choice: str = ""
    resolved_by: str = ""
    rationale: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.resolved_by) or self.actor(event)} decided" + _tail(
            _s(self.title) or _s(self.decision_id), " "
        ) + _tail(self.choice)


@register("contribution_requested", category=DECISION)
@dataclass
class ContributionRequested(EventBody):
    decision_id: str = ""
    requested_by: str = ""
    requested_from: str = ""
    question: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.requested_by) or self.actor(event)} asked {_s(self.requested_from) or 'someone'} for input" + _tail(
            self.question
        )


@register("contribution_received", category=DECISION)
@dataclass
class ContributionReceived(EventBody):
    decision_id: str = ""
    contributed_by: str = ""
    contribution: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.contributed_by) or self.actor(event)} gave input" + _tail(self.contribution)


# =============================================================================
# notification
# =============================================================================


@register("external_notification", category=NOTIFICATION)
@dataclass
class ExternalNotification(EventBody):
    """Inbound from a third-party app webhook or chat socket, as the wake a seat receives.

    The envelope's ``source`` names the app. Per the design, the partition key
    and the conversation identity ride the free-form ``payload`` map
    (``partition_key``, ``conversation_identity``, and an engine-raised
    notification's ``trigger_position``) — not typed fields here, because
    ``partition_key`` as a promoted tag belongs to notifications_coalesced
    alone.
    """

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    event_name: str = ""
    delivery_id: str = ""
    sender: str = ""
    title: str = ""
    body: str = ""
    url: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(event.source) if event is not None else ""
        who = _s(self.sender) or app or "someone"
        what = _s(self.title) or _s(self.event_name) or "a notification"
        via = f" via {app}" if app and app != who else ""
        return f"{who} notified {self._seat()}{via}: {what}"


@register("notification_skipped", category=NOTIFICATION)
@dataclass
class NotificationSkipped(EventBody):
    """A delivery addressed to somebody was dropped. ``reason`` is one of SKIP_REASONS; ``detail`` the particulars."""

    reason: str = ""
    detail: str = ""
    seat: str = ""
    recipient: str = ""
    event_name: str = ""
    delivery_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(event.source) if event is not None else ""
        what = f"a {app} delivery" if app else "a delivery"
        to = _s(self.seat) or _s(self.recipient)
        return f"skipped {what}" + _tail(to, " for ") + _tail(self.reason) + _tail(self.detail, " — ")


@register("notifications_coalesced", category=NOTIFICATION)
@dataclass
class NotificationsCoalesced(EventBody):
    """N same-partition inbox events merged into one digest trigger.

    Names the PARTITION that merged (``partition_key``), the only event that
    carries one; ``conversation_key`` elsewhere is the conversation identity.
    """

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    partition_key: str = ""
    count: int = 0
    event_ids: list[str] = field(default_factory=list)
    duplicates_collapsed: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} merged {_plural(self.count, 'notification')} into one turn" + _tail(
            self.partition_key, " on "
        )


@register("turn_trigger_skipped", category=NOTIFICATION)
@dataclass
class TurnTriggerSkipped(EventBody):
    """A trigger not run: already worked (ledger), answered by a later turn in its thread, or abandoned."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    trigger_event_id: str = ""
    turn_id: str = ""
    conversation_key: str = ""
    reason: str = ""
    detail: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} skipped a trigger" + _tail(self.reason) + _tail(self.detail, " — ")


# =============================================================================
# learning
# =============================================================================


@dataclass
class _TurnBody(EventBody):
    """Fields every event about one seat's turn shares (tags the store promotes)."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
    turn_id: str = ""
    conversation_key: str = ""


@register("turn_completed", category=LEARNING)
@dataclass
class TurnCompleted(_TurnBody):
    """A finished turn handed to reflection on the node holding the seat."""

    work_item: Optional[dict[str, Any]] = None

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} handed a finished turn to reflection"


@register("episode_written", category=LEARNING)
@dataclass
class EpisodeWritten(_TurnBody):
    episode_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} recorded an episode" + _tail(self.conversation_key, " for ")


@register("persist_decider_completed", category=LEARNING)
@dataclass
class PersistDeciderCompleted(_TurnBody):
    persisted: bool = False
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        verdict = "kept" if self.persisted else "did not keep"
        return f"{self.actor(event)} {verdict} what it learned" + _tail(self.reason)


@register("counterparty_profile_updated", category=LEARNING)
@dataclass
class CounterpartyProfileUpdated(_TurnBody):
    counterparty: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} updated what it knows about {_s(self.counterparty) or 'someone'}"


@register("reflection_completed", category=LEARNING)
@dataclass
class ReflectionCompleted(_TurnBody):
    insights: int = 0
    duration_ms: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} reflected on a turn ({_plural(self.insights, 'insight')})"


@dataclass
class _SkillBody(EventBody):
    seat: str = ""
    role: str = ""
    agent_id: str = ""
    skill_id: str = ""
    skill_name: str = ""
    version: int = 0
    turn_id: str = ""
    reason: str = ""

    def _skill(self) -> str:
        return _s(self.skill_name) or _s(self.skill_id) or "a skill"

    _verb = "changed"

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} {self._verb} skill {self._skill()}" + _tail(self.reason)


@register("skill_synthesized", category=LEARNING)
@dataclass
class SkillSynthesized(_SkillBody):
    _verb = "wrote"


@register("skill_refined", category=LEARNING)
@dataclass
class SkillRefined(_SkillBody):
    _verb = "refined"


@register("skill_promoted", category=LEARNING)
@dataclass
class SkillPromoted(_SkillBody):
    _verb = "promoted"


@register("skill_used", category=LEARNING)
@dataclass
class SkillUsed(_SkillBody):
    """A seat loaded a skill; a company-published one names the page it was read from.

    ``source_page_id`` / ``source_container`` are absent (empty) on a skill the
    seat synthesized for itself.
    """

    phase: str = ""
    source_page_id: str = ""
    source_container: str = ""
    _verb = "used"


@register("skill_staled", category=LEARNING)
@dataclass
class SkillStaled(_SkillBody):
    _verb = "marked stale"


@register("skill_archived", category=LEARNING)
@dataclass
class SkillArchived(_SkillBody):
    _verb = "archived"


@register("skill_revived", category=LEARNING)
@dataclass
class SkillRevived(_SkillBody):
    _verb = "revived"


@register("prefetch_summary", category=LEARNING)
@dataclass
class PrefetchSummary(_TurnBody):
    """The turn-start knowledge block: how much was put in front of the seat."""

    pages: int = 0
    bytes: int = 0
    duration_ms: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} started its turn with {_plural(self.pages, 'page')} of context"


@register("knowledge_read", category=LEARNING)
@dataclass
class KnowledgeRead(_TurnBody):
    """One act of reading the knowledge base, listing the pages it reached.

    ``pages`` is ``[{id, container, title, rank}]`` (rank on a ranked answer
    only), ``backend`` the store their ids address, ``via`` one of
    KNOWLEDGE_VIAS, ``query`` a search's text clipped to QUERY_MAX_BYTES (use
    ``clip_query``). A read reaching no page, or with no seat, publishes nothing.
    """

    pages: list[dict[str, Any]] = field(default_factory=list)
    backend: str = ""
    phase: str = ""
    via: str = ""
    query: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        how = {VIA_SEARCH: "searched and read", VIA_GET_PAGE: "read"}.get(_s(self.via), "read")
        q = f' for "{_s(self.query)}"' if _s(self.query) else ""
        return f"{self.actor(event)} {how} {_plural(len(self.pages), 'page')}{q}"


@register("compaction_requested", category=LEARNING)
@dataclass
class CompactionRequested(_TurnBody):
    phase: str = ""
    reason: str = ""
    tokens: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} asked to compact its context" + _tail(self.reason)


@register("compaction_completed", category=LEARNING)
@dataclass
class CompactionCompleted(_TurnBody):
    phase: str = ""
    tokens_before: int = 0
    tokens_after: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} compacted its context from {self.tokens_before} to {self.tokens_after} tokens"


# =============================================================================
# system
# =============================================================================


@register("agent_turn_started", category=SYSTEM)
@dataclass
class AgentTurnStarted(_TurnBody):
    """A turn, or a resumed segment of one, beginning — before its context is assembled.

    ``work_item`` is ``{backend, id, key, project}`` or None when nothing named
    one; ``work_item_basis`` one of WORK_ITEM_BASES. Its depth is the
    envelope's ``delegation_depth``. ``resumed`` marks a parked coding run's
    resumed segment under the same ``turn_id``.
    """

    work_item: Optional[dict[str, Any]] = None
    work_item_basis: str = ""
    trigger_type: str = ""
    trigger_event_id: str = ""
    resumed: bool = False

    def summary(self, event: Optional[Event] = None) -> str:
        verb = "resumed" if self.resumed else "started"
        woke = _tail(self.trigger_type, " on ")
        item = _tail((self.work_item or {}).get("key") if isinstance(self.work_item, dict) else "", " for ")
        return f"{self.actor(event)} {verb} a turn{item}{woke}"


@register("agent_turn_completed", category=SYSTEM)
@dataclass
class AgentTurnCompleted(_TurnBody):
    """A full reasoning cycle with tokens and tools.

    ``suspended`` on a segment that parked on a coding run; ``stopped`` (never
    with ``failed``) on a turn a person ended.
    """

    work_item: Optional[dict[str, Any]] = None
    work_item_basis: str = ""
    resumed: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
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
@dataclass
class AgentTurnStopped(_TurnBody):
    """A pause with stop_running ended this turn at its next round; its trigger counts as worked."""

    stopped_by: str = ""
    stopped_by_seat: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_person(self.stopped_by, self.stopped_by_seat)} stopped {self._seat()}'s turn" + _tail(self.reason)


@register("agent_turn_steered", category=SYSTEM)
@dataclass
class AgentTurnSteered(_TurnBody):
    """What became of a person's note to a running turn; the note's only durable record."""

    status: str = ""  # one of STEER_STATUSES
    phase: str = ""
    iteration: int = 0
    round: int = 0
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
@dataclass
class AgentTurnProgress(_TurnBody):
    """Not stored: a live per-round signal; agent_phase_completed is the durable record."""

    phase: str = ""
    iteration: int = 0
    round: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} is working" + _tail(self.phase, " on ") + _tail(self.tool, ", using ")


@register("agent_phase_started", category=SYSTEM)
@dataclass
class AgentPhaseStarted(_TurnBody):
    phase: str = ""
    iteration: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} began phase" + _tail(self.phase, " ")


@register("agent_phase_completed", category=SYSTEM)
@dataclass
class AgentPhaseCompleted(_TurnBody):
    """One phase's durable record: prompts, response, tool calls and ``rounds[]``.

    Each round is ``{timing, tokens, stop_reason}`` (STOP_REASONS; absent where
    the backend reported none). A failed phase carries ``error_kind``; a phase
    whose model declined carries ``refusal`` ``{category, explanation}`` beside
    ``error_kind: refusal``.
    """

    phase: str = ""
    iteration: int = 0
    system_prompt: str = ""
    user_prompt: str = ""
    response: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    duration_ms: int = 0
    failed: bool = False
    error_kind: str = ""
    error: str = ""
    refusal: Optional[dict[str, Any]] = None
    #: The parts cut to fit the record on the wire (``response``, ``user_prompt``,
    #: ``system_prompt``, ``tool_calls.arguments``), largest first; empty when whole.
    truncated: list[str] = field(default_factory=list)

    def summary(self, event: Optional[Event] = None) -> str:
        who = self.actor(event)
        if self.failed or _s(self.error_kind):
            return f"{who}'s phase" + _tail(self.phase, " ") + " failed" + _tail(self.error_kind)
        return f"{who} completed phase" + _tail(self.phase, " ") + f" in {_plural(len(self.rounds), 'round')}"


@register("auxiliary_spend", category=SYSTEM, fed=False)
@dataclass
class AuxiliarySpend(EventBody):
    """What the auxiliary model cost for one key, coalesced over one flush of the node's ledger.

    Stored and NOT fed: accounting, not activity. No prompt, no response, and
    deliberately no ``failed`` key (``failed_calls`` counts them).
    """

    stage: str = ""  # one of AUX_STAGES
    purpose: str = ""
    seat: str = ""
    person: str = ""
    role: str = ""
    agent_id: str = ""
    turn_id: str = ""
    model: str = ""
    provider_key: str = ""
    company_day: str = ""
    calls: int = 0
    failed_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    first_started_at: str = ""
    last_ended_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        for_whom = _s(self.seat) or _s(self.person) or "the company"
        return (
            f"{for_whom} spent {self.input_tokens + self.output_tokens} auxiliary tokens over"
            f" {_plural(self.calls, 'call')}" + _tail(self.purpose, " on ")
        )


@register("budget_exhausted", category=SYSTEM)
@dataclass
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
@dataclass
class BudgetMeters(EventBody):
    """Not stored: the fleet's shared token counters, every capped window with its state.

    Published on a tick and at once when a window first turns work away; the
    next report supersedes it, and the live projection reads it.
    """

    windows: list[dict[str, Any]] = field(default_factory=list)
    trigger: str = ""  # tick | refusal

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
@dataclass
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
@dataclass
class TurnGuardBreach(_TurnBody):
    """A runtime invariant fired (GUARDS). A failed turn: the seat's last_error, never a stop."""

    guard: str = ""
    detail: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s turn broke a guard" + _tail(self.guard) + _tail(self.detail, " — ")


@register("llm_unavailable", category=SYSTEM)
@dataclass
class LLMUnavailable(_TurnBody):
    """The fallback chain is exhausted."""

    phase: str = ""
    providers: list[str] = field(default_factory=list)
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} could reach no model provider" + _tail(self.error)


@register("provider_fallback", category=SYSTEM)
@dataclass
class ProviderFallback(_TurnBody):
    """The chain moved to its next provider: one per provider call; empty ``to_provider_key`` on the last."""

    phase: str = ""
    iteration: int = 0
    from_provider_key: str = ""
    to_provider_key: str = ""
    error_kind: str = ""
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        to = _s(self.to_provider_key) or "nothing left"
        return f"{self.actor(event)} fell back from {_s(self.from_provider_key) or '?'} to {to}" + _tail(self.error_kind)


@register("subagent_batched", category=SYSTEM)
@dataclass
class SubagentBatched(_TurnBody):
    phase: str = ""
    count: int = 0
    tasks: list[str] = field(default_factory=list)

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} ran {_plural(self.count, 'subagent')} together"


@register("phase.tool_skill_blocked", category=SYSTEM)
@dataclass
class PhaseToolSkillBlocked(_TurnBody):
    phase: str = ""
    tool: str = ""
    skill: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} was kept from {_s(self.tool) or _s(self.skill) or 'a tool'}" + _tail(self.reason)


@register("skill_telemetry_write_failed", category=SYSTEM)
@dataclass
class SkillTelemetryWriteFailed(EventBody):
    seat: str = ""
    role: str = ""
    agent_id: str = ""
    skill_id: str = ""
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} could not record use of skill {_s(self.skill_id) or '?'}" + _tail(self.error)


@register("prompt.size", category=SYSTEM)
@dataclass
class PromptSize(_TurnBody):
    """One phase's OPENING prompt in bytes, plus a token approximation."""

    phase: str = ""
    system_bytes: int = 0
    user_bytes: int = 0
    message_bytes: int = 0
    tool_bytes: int = 0
    tool_count: int = 0
    approx_tokens: int = 0

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
@dataclass
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


@register(
    "message_dead_lettered",
    category=SYSTEM,
    extension=(
        "a dead letter left no row: the only record of poison was the dead-letter stream, "
        "which ages out and is not in any trace; the row names the entry and the event, never its bytes"
    ),
)
@dataclass
class MessageDeadLettered(EventBody):
    """A message the queue copied to CREWLET_DLQ and terminated (an extension to the design's list).

    Published by the node whose consume loop decided it, under the trace of
    the event it buried, so the poison shows in the history and in the trace of
    the work it belonged to rather than only on the dead-letter stream. Names
    where it came from, the entry to replay (``ref``), how often it was tried
    and what it was (``original_id``, ``original_type``), never its bytes:
    those stay on CREWLET_DLQ.
    """

    topic: str = ""
    group: str = ""
    seat: str = ""
    ref: str = ""
    deliveries: int = 0
    reason: str = ""  # DEAD_LETTER_REASONS
    original_id: str = ""
    original_type: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        what = _s(self.original_type) or "a message"
        where = f"{_s(self.seat)}'s inbox" if _s(self.seat) else (_s(self.topic) or "its topic")
        tries = f" after {_plural(self.deliveries, 'delivery', 'deliveries')}" if self.deliveries else ""
        return f"{what} dead-lettered from {where}{tries}" + _tail(self.reason, " — ")


@dataclass
class _ToolServerBody(EventBody):
    """One seat's session with one MCP server: whose, which server, over what, and what went wrong."""

    seat: str = ""
    role: str = ""
    agent_id: str = ""
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
@dataclass
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
@dataclass
class ToolServerUnavailable(_ToolServerBody):
    """A seat's MCP server could not be started (a missing program, a refused connection, a failed handshake).

    Published once per outage, not per attempt: the seat's turns run without
    the server's tools meanwhile, and starts are retried with backoff
    (``retry_in_s``) until one succeeds, which a ``tool_server_restarted``
    then reports.
    """

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s tool server {_s(self.server) or '?'} could not start" + _tail(self.error)


# =============================================================================
# webhook
# =============================================================================


@dataclass
class _DeliveryBody(EventBody):
    """A delivery as the provider sent it: ``body`` is the provider's exact bytes.

    As UTF-8 text when they were (``body_encoding`` ""), else base64
    (``body_encoding`` "base64"); ``raw_bytes()`` gives the bytes back either way.
    """

    surface: str = ""  # webhook | forge | socket (see labels.SURFACES)
    event_name: str = ""
    provider: str = ""
    delivery_id: str = ""
    route: str = ""
    content_type: str = ""
    body: str = ""
    body_encoding: str = BODY_TEXT

    def raw_bytes(self) -> bytes:
        return _decode_body(self.body, self.body_encoding)

    def set_raw_bytes(self, raw: bytes) -> None:
        self.body, self.body_encoding = _encode_body(raw)

    def label(self) -> str:
        return delivery_label(self.surface, self.event_name)


@register("inbound_delivery", category=WEBHOOK)
@dataclass
class InboundDelivery(_DeliveryBody):
    """One delivery presented to one seat, counted once across the fleet.

    Its row is filed under the delivery's own label (``webhook:<event>``,
    ``forge:<event>``, ``socket:posted``; ``categories.store_label``) with
    the provider's exact bytes as the payload.
    """

    seat: str = ""
    role: str = ""
    agent_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(self.provider) or (_s(event.source) if event is not None else "")
        frm = f" from {app}" if app else ""
        return f"{self._seat()} received {self.label()}{frm}"


@register("raw_webhook", category=WEBHOOK, stored=False)
@dataclass
class RawWebhook(_DeliveryBody):
    """Not stored: the delivery as the edge took it (its row is the inbound_delivery beside it)."""

    headers: dict[str, str] = field(default_factory=dict)

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(self.provider) or (_s(event.source) if event is not None else "")
        return f"{app or 'a provider'} delivered {self.label()}"


# Every registered class and phrase constant, for ``from crewlet.events.types import *``.
__all__ = sorted(
    name
    for name, value in list(globals().items())
    if not name.startswith("_")
    and (
        (isinstance(value, type) and issubclass(value, EventBody))
        or (name.isupper() and isinstance(value, (str, int, tuple)))
    )
) + ["clip_query"]
