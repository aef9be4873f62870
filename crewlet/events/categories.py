"""Event categories, what the store keeps, what the feed shows, and a row's label.

Design (event-system.md, Event Types): every wire type is filed under one
category from a CLOSED set — the same set the ``GET /events?category=`` filter
and the dashboard's category chips use — so a category is a wire contract and
an unknown one is a bug, not a new chip. The two exceptions to "every event is
a row, every row is in the feed" are declared once, here, beside the map,
because every reader of the store and the feed asks this module rather than
keeping its own copy:

* ``NOT_STORED`` — live-only types, each excluded for a stated reason (the
  durable record of what they say is another row, or the next report
  supersedes them).
* ``NOT_FED`` — types kept out of the activity feed: the not-stored ones
  (never rows at all) plus ``auxiliary_spend``, which is stored (accounting a
  turn's history and a trace must show) but would push the turns and failures
  a reader is watching out of the feed's ring.

This module imports nothing from the typed classes, so the store and the feed
can ask it without loading every event body.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Optional

# The closed category set (wire strings).
LIFECYCLE = "lifecycle"
TASK = "task"
A2A = "a2a"
DECISION = "decision"
NOTIFICATION = "notification"
LEARNING = "learning"
SYSTEM = "system"
WEBHOOK = "webhook"

CATEGORIES: tuple[str, ...] = (LIFECYCLE, TASK, A2A, DECISION, NOTIFICATION, LEARNING, SYSTEM, WEBHOOK)

# The one type whose rows are not filed under its own name (see store_label).
INBOUND_DELIVERY = "inbound_delivery"
AUXILIARY_SPEND = "auxiliary_spend"


def _group(category: str, names: str) -> dict[str, str]:
    return {name: category for name in names.split()}


# Wire type -> category, in the design's order. Every registered event type is
# here and everything here is registered (a test holds both directions, and
# holds this map to the design's list).
_CATEGORY_OF: dict[str, str] = {
    **_group(
        LIFECYCLE,
        """
        org_started org_stopped
        config_revision_activated config_revision_applied
        operator_acted backup_requested
        seat_paused seat_resumed
        agent_spawned agent_terminated
        """,
    ),
    **_group(
        TASK,
        """
        task_assigned
        sandbox_run_started sandbox_clarification_requested
        sandbox_run_completed sandbox_run_failed sandbox_run_answered
        sandbox_answer_given
        scheduled_task_fired
        """,
    ),
    **_group(
        A2A,
        """
        a2a_channel_opened a2a_message_sent a2a_channel_closed
        a2a_request a2a_message
        """,
    ),
    **_group(
        DECISION,
        """
        decision_requested decision_resolved
        contribution_requested contribution_received
        """,
    ),
    **_group(
        NOTIFICATION,
        """
        external_notification notification_skipped
        notifications_coalesced turn_trigger_skipped
        """,
    ),
    **_group(
        LEARNING,
        """
        turn_completed episode_written persist_decider_completed
        counterparty_profile_updated reflection_completed
        skill_synthesized skill_refined skill_promoted
        skill_used
        skill_staled skill_archived skill_revived
        prefetch_summary
        knowledge_read
        compaction_requested compaction_completed
        """,
    ),
    **_group(
        SYSTEM,
        """
        agent_turn_started agent_turn_completed
        agent_turn_stopped agent_turn_steered
        agent_turn_progress
        agent_phase_started agent_phase_completed
        auxiliary_spend
        budget_exhausted budget_meters
        turn.guard_breach
        llm_unavailable provider_fallback
        subagent_batched phase.tool_skill_blocked skill_telemetry_write_failed
        prompt.size
        message_dead_lettered
        """,
    ),
    **_group(
        WEBHOOK,
        """
        inbound_delivery raw_webhook
        """,
    ),
}
CATEGORY_OF: Mapping[str, str] = MappingProxyType(_CATEGORY_OF)

# Types this build adds to the design's list, each with the reason it exists.
# Every one is categorised, registered and stored like a design type; a test
# holds the map to the design's list plus exactly these.
EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {
        "message_dead_lettered": (
            "a dead letter left no row: the only record of poison was the dead-letter stream, "
            "which ages out and is not in any trace; the row names the entry and the event, never its bytes"
        ),
    }
)

# Live-only: never a row. Each for the design's stated reason —
#   agent_spawned, agent_terminated: placement moves seats on every rebalance;
#     they drive the live projection only.
#   agent_turn_progress: per-round signal; agent_phase_completed is the record.
#   budget_meters: a snapshot the next report supersedes.
#   raw_webhook: the delivery is already a row, as its inbound_delivery.
#   a2a_request, a2a_message: inbox wakes; a2a_channel_opened and
#     a2a_message_sent are their rows.
#   sandbox_answer_given: the operator route's inbox wake for a parked run's
#     answer, "not stored and never a turn"; sandbox_run_answered is its row.
NOT_STORED: frozenset[str] = frozenset(
    {
        "agent_spawned",
        "agent_terminated",
        "agent_turn_progress",
        "budget_meters",
        "raw_webhook",
        "a2a_request",
        "a2a_message",
        "sandbox_answer_given",
    }
)

# Never in the activity feed: everything not stored, plus the one type that is
# stored and is accounting rather than activity.
NOT_FED: frozenset[str] = NOT_STORED | {AUXILIARY_SPEND}

# inbound_delivery's surfaces and the label each files its rows under.
SURFACE_WEBHOOK = "webhook"
SURFACE_FORGE = "forge"
SURFACE_SOCKET = "socket"
SURFACES: tuple[str, ...] = (SURFACE_WEBHOOK, SURFACE_FORGE, SURFACE_SOCKET)
SOCKET_EVENT_POSTED = "posted"
UNNAMED_DELIVERY_EVENT = "unknown"


def category_of(event_type: str) -> Optional[str]:
    """The category a wire type is filed under, or None for a type this build does not know."""
    return _CATEGORY_OF.get(event_type)


def is_known(event_type: str) -> bool:
    return event_type in _CATEGORY_OF


def is_stored(event_type: str) -> bool:
    """Whether the event store keeps a row for this type.

    A type this build does not know IS stored: a newer build publishes it, and
    a row an operator can read beats silently losing the record of it.
    """
    return event_type not in NOT_STORED


def is_fed(event_type: str) -> bool:
    """Whether a row of this type takes a place in the activity feed (``feed_only``)."""
    return event_type not in NOT_FED


def types_in(category: str) -> tuple[str, ...]:
    """Every wire type filed under a category, in map order; refuses a category outside the closed set."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown event category {category!r}; the set is closed: {', '.join(CATEGORIES)}")
    return tuple(name for name, cat in _CATEGORY_OF.items() if cat == category)


def _field(event: Any, name: str) -> Any:
    """A body field read from the typed body, else the kept unknown keys, else the free-form payload.

    So a label comes out the same whether the event decoded as its class or
    arrived from a build that had not registered it.
    """
    data = getattr(event, "data", None)
    if data is not None and hasattr(data, name):
        return getattr(data, name)
    extra = getattr(event, "extra", None) or {}
    if name in extra:
        return extra[name]
    payload = getattr(event, "payload", None) or {}
    return payload.get(name) if isinstance(payload, dict) else None


def delivery_label(surface: Any, event_name: Any) -> str:
    """``webhook:<event>``, ``forge:<event>`` or ``socket:posted`` — the label an operator matches.

    A surface outside the known three is filed as ``webhook`` (the generic
    route) rather than minting a label no filter expects; a socket delivery
    names ``posted`` unless it says otherwise; a delivery that names no event
    is ``<surface>:unknown`` rather than an empty suffix.
    """
    surf = surface if isinstance(surface, str) and surface in SURFACES else SURFACE_WEBHOOK
    name = event_name.strip() if isinstance(event_name, str) else ""
    if not name:
        name = SOCKET_EVENT_POSTED if surf == SURFACE_SOCKET else UNNAMED_DELIVERY_EVENT
    return f"{surf}:{name}"


def store_label(event: Any) -> str:
    """The name a row is filed under: the event's type, except an inbound delivery's own label.

    ``inbound_delivery`` is the one type whose rows do not carry its name: each
    is filed under ``webhook:<event>``, ``forge:<event>`` or ``socket:posted``
    (read from the body's ``surface`` and ``event_name``), because that is what
    an operator matches against their provider's console.
    """
    etype = getattr(event, "type", "")
    if etype != INBOUND_DELIVERY:
        return etype
    return delivery_label(_field(event, "surface"), _field(event, "event_name"))


__all__ = [
    "A2A",
    "AUXILIARY_SPEND",
    "CATEGORIES",
    "CATEGORY_OF",
    "DECISION",
    "EXTENSIONS",
    "INBOUND_DELIVERY",
    "LEARNING",
    "LIFECYCLE",
    "NOTIFICATION",
    "NOT_FED",
    "NOT_STORED",
    "SOCKET_EVENT_POSTED",
    "SURFACES",
    "SURFACE_FORGE",
    "SURFACE_SOCKET",
    "SURFACE_WEBHOOK",
    "SYSTEM",
    "TASK",
    "WEBHOOK",
    "category_of",
    "delivery_label",
    "is_fed",
    "is_known",
    "is_stored",
    "store_label",
    "types_in",
]
