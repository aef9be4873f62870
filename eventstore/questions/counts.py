"""The row counters: how many rows, turns and tokens this node's store holds over a window.

The overview's counters (``turns_completed``, ``turns_failed``, ``tokens``,
``events``) are counted live by the projection and, for what happened before
it started, read from the store here. Both sides count by the same keys and
the same rule, so they live with the questions rather than with either
counter: the ``COUNTS`` question the fleet scatters is answered by
:func:`answer_counts`, and the live projection counts on with these keys.

``tokens`` is input plus output of turn completions — the sum of their
phases, so phases are not added again — and of ``auxiliary_spend``.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from crewlet.events import Event, types
from eventstore.questions.model import NodeScope, Question
from eventstore.questions.sql import TABLE, Where, fetch, marks
from eventstore.questions.turns import TURN_COMPLETED
from eventstore.rows import is_failed

C_EVENTS = "events"
C_TURNS_COMPLETED = "turns_completed"
C_TURNS_FAILED = "turns_failed"
C_TOKENS = "tokens"
COUNTER_KEYS: tuple[str, ...] = (C_TURNS_COMPLETED, C_TURNS_FAILED, C_TOKENS, C_EVENTS)
#: One seat's counters: the node's, less ``events``.
SEAT_COUNTER_KEYS: tuple[str, ...] = (C_TURNS_COMPLETED, C_TURNS_FAILED, C_TOKENS)

AUXILIARY_SPEND = types.AuxiliarySpend.event_type
#: Types whose tokens are spend: a turn's completion (the sum of its phases,
#: which are therefore not added again) and the auxiliary model's.
SPEND_TYPES: tuple[str, ...] = (TURN_COMPLETED, AUXILIARY_SPEND)


def new_counters() -> dict[str, int]:
    """Every counter at zero, so a live count and a stored one always carry the same keys."""
    return {name: 0 for name in COUNTER_KEYS}


def new_seat_counters() -> dict[str, int]:
    """One seat's counters at zero, live or stored alike."""
    return {name: 0 for name in SEAT_COUNTER_KEYS}


def as_count(value: Any) -> int:
    """A body's count as a live counter takes it: a positive whole number, else 0 (a bool is no count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def spent_tokens(event: Event) -> int:
    """The tokens a spend event (:data:`SPEND_TYPES`) reports: its input plus its output."""
    return as_count(event.field("input_tokens")) + as_count(event.field("output_tokens"))


def count_turn(counters: dict[str, int], event: Event, *, failed: bool) -> None:
    """Count one completed turn live: completed or failed, and the tokens it spent."""
    counters[C_TURNS_FAILED if failed else C_TURNS_COMPLETED] += 1
    counters[C_TOKENS] += spent_tokens(event)


def count_event(counters: dict[str, int], event: Event) -> None:
    """Count one live event into the node's counters, by the rule :func:`count_rows` counts stored rows with."""
    counters[C_EVENTS] += 1
    if event.type == TURN_COMPLETED:
        count_turn(counters, event, failed=is_failed(event))
    elif event.type in SPEND_TYPES:
        counters[C_TOKENS] += spent_tokens(event)


def count_rows(scope: NodeScope, since: datetime, at: datetime) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """The counters over ``[since, at]`` from the store: every row, completed and failed turns, spend."""
    every, spend = Where.of(scope), Where.of(scope)
    for q in (every, spend):
        q.add("ts >= %s", q.ts(since))
        q.add("ts <= %s", q.ts(at))
    spend.add(f"type IN ({marks(SPEND_TYPES)})", *SPEND_TYPES)
    sql = (
        f"SELECT type, seat, COUNT(*), SUM(CASE WHEN failed THEN 1 ELSE 0 END),"
        f" SUM(input_tokens + output_tokens) FROM {TABLE} WHERE {spend.where} GROUP BY type, seat"
    )
    [(total,)] = fetch(scope, f"SELECT COUNT(*) FROM {TABLE} WHERE {every.where}", every.params)
    grouped = fetch(scope, sql, spend.params)
    counters = new_counters()
    counters[C_EVENTS] = int(total or 0)
    per_seat: dict[str, dict[str, int]] = {}
    for etype, seat, count, failed, tokens in grouped:
        count, failed, tokens = int(count or 0), int(failed or 0), int(tokens or 0)
        counters[C_TOKENS] += tokens
        if etype != TURN_COMPLETED:
            continue
        counters[C_TURNS_FAILED] += failed
        counters[C_TURNS_COMPLETED] += count - failed
        if seat:
            mine = per_seat.setdefault(seat, new_seat_counters())
            mine[C_TURNS_FAILED] += failed
            mine[C_TURNS_COMPLETED] += count - failed
            mine[C_TOKENS] += tokens
    return counters, per_seat


def answer_counts(question: Question, at: Any, scope: NodeScope) -> dict[str, Any]:
    """This node's part of a ``COUNTS`` question: the counters over the ``window_us`` before ``at``, and per seat."""
    counters, per_seat = count_rows(scope, at - timedelta(microseconds=question.window_us), at)
    return {"counters": counters, "per_seat": per_seat}


__all__ = [
    "AUXILIARY_SPEND",
    "COUNTER_KEYS",
    "C_EVENTS",
    "C_TOKENS",
    "C_TURNS_COMPLETED",
    "C_TURNS_FAILED",
    "SEAT_COUNTER_KEYS",
    "SPEND_TYPES",
    "answer_counts",
    "as_count",
    "count_event",
    "count_rows",
    "count_turn",
    "new_counters",
    "new_seat_counters",
    "spent_tokens",
]
