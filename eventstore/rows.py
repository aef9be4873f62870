"""What one event becomes as a row: the promoted tags, the derived columns, the exact body.

Pure (no Django, no database), so the writer, the benchmark's raw baseline and
the tests derive a row by the same rule. The store keeps an event's whole JSON
as text rather than as ``jsonb``: text keeps the wire bytes exactly (key order,
a provider's body with a NUL escaped in it) and costs nothing to insert, and
the tags a read filters on are columns of their own.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from crewlet.events import Event, category_of, is_stored, store_label
from crewlet.base.jsontext import storable
from crewlet.queue import topics

#: The event store's one table (the model's ``db_table``).
TABLE = "eventstore_event"
#: The column marking a row of a custody batch its keeper has not settled yet ('' once it has, and on every other row).
CUSTODY_COLUMN = "custody_batch"

#: Columns of ``eventstore_event`` in insert order (the model declares the same).
COLUMNS: tuple[str, ...] = (
    "id",
    "ts",
    "type",
    "category",
    "node",
    "source",
    "trace_id",
    "span_id",
    "parent_span_id",
    "seat",
    "turn_id",
    "conversation_key",
    "partition_key",
    "actor_seat",
    "tool",
    "dir",
    "delegation_depth",
    "parent_turn_id",
    "failed",
    "input_tokens",
    "output_tokens",
    "actor",
    "summary",
    "body",
)

#: Body fields promoted to tags of the same name (design: Event Types, the runtime audit;
#: Inbox Batching for partition_key, which only notifications_coalesced carries).
PROMOTED: tuple[str, ...] = ("seat", "turn_id", "conversation_key", "partition_key", "actor_seat", "tool", "dir")

#: Types that are a failure by being published at all (design: system category).
FAILURE_TYPES: frozenset[str] = frozenset(
    {
        "turn.guard_breach",
        "llm_unavailable",
        "budget_exhausted",
        "sandbox_run_failed",
        "skill_telemetry_write_failed",
        "message_dead_lettered",
        "tool_server_unavailable",
    }
)

#: Subject namespaces whose publishes are not records of what happened: a seat's
#: memory rows are state replicated through the broker, and a dead letter is a
#: relay of a message already published. Everything else of a stored type is a row.
_NOT_RECORDS: tuple[str, ...] = (f"{topics.PREFIX}.memory.", f"{topics.DLQ_PREFIX}.")

#: A summary longer than this is cut: it is a listing's one line, not the record.
SUMMARY_MAX = 500


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, dict, list)):
        return ""
    return str(value)


#: The largest count a BIGINT column holds: a body that claims more is clamped, not refused by the store.
COUNT_MAX = 2**63 - 1


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(max(value, 0), COUNT_MAX)


def is_failed(event: Event) -> bool:
    """The one rule for a row's ``failed`` flag (the axis's failed count, the turn outcome).

    A failure type; or a body that says ``failed: true`` (a turn, a phase); or an
    outcome of ``failed`` (a config revision one node could not apply). An
    ``error`` string alone is not a failure: a provider fallback carries one and
    the chain carried on.
    """
    return _failed(event.type, _fields(event))


def _failed(etype: str, fields: dict[str, Any]) -> bool:
    return etype in FAILURE_TYPES or fields.get("failed") is True or fields.get("outcome") == "failed"


def is_record_topic(topic: str) -> bool:
    return not topic.startswith(_NOT_RECORDS)


def _safe(fn: Any, fallback: str) -> str:
    """A typed body's summary/actor, never able to cost the row (a body from an odd build)."""
    try:
        value = fn()
    except Exception:
        return fallback
    return value if isinstance(value, str) else fallback


def _fields(event: Event) -> dict[str, Any]:
    """Every body field by name: the typed body's first, then a kept unknown key, then the free-form payload's.

    So a tag reads the same whether the event decoded as its class or came from
    a build that had not registered it. Built once per row: the writer reads a
    dozen fields of every event it stores.
    """
    payload = event.payload if isinstance(event.payload, dict) else {}
    merged = {**payload, **event.extra}
    data = event.data
    if data is not None:
        merged.update(getattr(data, "__dict__", None) or {f: getattr(data, f) for f in getattr(data, "__slots__", ())})
    return merged


def row_for(topic: str, event: Event) -> Optional[tuple[Any, ...]]:
    """The row ``event`` becomes, in COLUMNS order; None when the store keeps none.

    ``ts`` is the event's own timestamp (UTC, microseconds): a row is ordered by
    when it happened, not by when this node got round to writing it.
    """
    if not is_stored(event.type) or not is_record_topic(topic):
        return None
    fields = _fields(event)
    get = fields.get
    failed = _failed(event.type, fields)
    summary = _safe(event.summary, event.type.replace("_", " "))
    if len(summary) > SUMMARY_MAX:
        summary = summary[: SUMMARY_MAX - 1] + "…"
    ts: datetime = event.timestamp
    row = (
        event.id,
        ts,
        store_label(event),
        category_of(event.type) or "",
        event.node,
        event.source,
        event.trace_id,
        event.span_id,
        event.parent_span_id,
        *(_text(get(name)) for name in PROMOTED),
        int(event.delegation_depth or 0),
        event.parent_turn_id,
        failed,
        _count(get("input_tokens")),
        _count(get("output_tokens")),
        _safe(event.actor, "system"),
        summary,
        event.to_json().decode("utf-8"),
    )
    # Any text column may hold what came from outside (a model's answer, a
    # provider's error, a vendor's field): a NUL or a lone surrogate is written
    # as its escape, since PostgreSQL refuses the one and no driver encodes the other.
    return tuple(storable(value) if type(value) is str else value for value in row)
