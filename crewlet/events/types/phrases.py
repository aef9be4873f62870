"""The fixed phrase sets the typed bodies carry, and the helpers that keep a body's text inside its limits.

Each set is wire strings a reader matches exactly (a skip's reason, an
answer's outcome, a round's stop reason, a knowledge read's route, ...),
defined here once so a producer and a reader can never spell one two ways;
the particulars of one event go in its free-text fields instead.
"""
from __future__ import annotations


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

# turn_trigger_skipped reasons (design: the event list, turn_trigger_skipped): a
# redelivery the completion ledger had already worked, or a trigger whose turn
# was ABANDONED rather than redelivered. What the turn said goes in ``detail``.
TRIGGER_ALREADY_WORKED = "already worked"
#: A message a later turn was shown waiting in its thread block, and answered there (design: "And the failed one is
#: not answered twice"): its own delivery, coming round afterwards, is dropped rather than answered a second time.
TRIGGER_ANSWERED_IN_THREAD = "a later turn answered it in its thread"
TRIGGER_WROTE_BEFORE_BREAKING = "wrote outside the engine before breaking"
TRIGGER_PANICKED = "panicked"
TRIGGER_MODEL_DECLINED = "model declined"
TRIGGER_ABANDONED: tuple[str, ...] = (TRIGGER_WROTE_BEFORE_BREAKING, TRIGGER_PANICKED, TRIGGER_MODEL_DECLINED)
TRIGGER_SKIP_REASONS: tuple[str, ...] = (TRIGGER_ALREADY_WORKED, TRIGGER_ANSWERED_IN_THREAD, *TRIGGER_ABANDONED)

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

# budget_meters: each window's engine-computed state, and what published the report.
METER_OPEN = "open"
METER_EXHAUSTED = "exhausted"
METER_STATES: tuple[str, ...] = (METER_OPEN, METER_EXHAUSTED)
METERS_ON_TICK = "tick"
METERS_ON_REFUSAL = "refusal"
#: The keys of one ``budget_meters.windows[]`` entry (``budget_exhausted`` names its window with the same ones).
METER_KEYS: tuple[str, ...] = ("scope", "seat", "period", "window", "resets_at", "spend", "ceiling", "state")

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
