"""This node's answer to a question: the checks, the dispatch by kind, and the events, series and trace answers.

The turn answers live in :mod:`eventstore.questions.turns`; every answer is
wrapped here with the node's ``coverage`` and the asker's ``at``.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable

from django.db import connections

from crewlet.events import CATEGORIES, format_timestamp
from eventstore.questions.cursor import EVENTS_CURSOR, decode_cursor, encode_cursor
from eventstore.questions.listing import list_row, list_sql
from eventstore.questions import model as kinds
from eventstore.questions.model import (
    MAX_BARS,
    MAX_DETAIL_ROWS,
    MAX_LIMIT,
    PROTOCOL_VERSION,
    K_KEPT,
    BadQuestion,
    MissingInstant,
    NodeScope,
    Question,
    QuestionRefused,
    UnsupportedVersion,
)
from eventstore.questions.sql import SETTLED, TABLE, Where, fetch, us_sql
from eventstore.questions.timefmt import from_us, to_us
from eventstore.questions.turns import answer_last_turns, answer_turn, answer_turn_rows, answer_turns


def coverage(node_id: str, *, answered: bool = True, error: str = "") -> dict[str, Any]:
    return {"nodes": [{"id": node_id, "answered": answered, "error": error}], "complete": answered}


def check(question: Question) -> datetime:
    """Refuse what this node must not answer; returns the instant."""
    if question.version != PROTOCOL_VERSION:
        raise UnsupportedVersion(
            f"question speaks protocol version {question.version}; this node speaks {PROTOCOL_VERSION}"
        )
    if question.at is None:
        raise MissingInstant("a question must carry the asker's instant")
    if question.at.tzinfo is None:
        raise BadQuestion("the instant must carry a time zone")
    if question.kind not in kinds.KINDS:
        raise BadQuestion(f"unknown question kind {question.kind!r}")
    bad = [c for c in question.filters.categories if c not in CATEGORIES]
    if bad:
        raise BadQuestion(f"unknown category {bad[0]!r}")
    return question.at.astimezone(timezone.utc)


def answer(question: Question, scope: NodeScope) -> dict[str, Any]:
    """This node's answer to ``question``; raises QuestionRefused rather than guessing."""
    at = check(question)
    answerer = _ANSWERERS.get(question.kind)
    if answerer is None:
        raise BadQuestion(f"question kind {question.kind!r} is asked of the fleet, not of one node's answer")
    body = answerer(question, at, scope)
    body["coverage"] = coverage(scope.node_id)
    body["at"] = format_timestamp(at)
    return body


def refusal(question: Question, scope: NodeScope, exc: QuestionRefused) -> dict[str, Any]:
    """What the asker records for a node that refused: named in the coverage, nothing counted."""
    at = question.at
    return {
        "coverage": coverage(scope.node_id, answered=False, error=f"{exc.reason}: {exc}"),
        "at": format_timestamp(at) if at is not None else None,
    }


def answer_events(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    limit = max(1, min(int(question.limit), MAX_LIMIT))
    q = Where.of(scope)
    q.history(at, scope)
    q.filters(question.filters)
    if question.cursor:
        ts, key = decode_cursor(EVENTS_CURSOR, question.cursor)
        q.before("ts", "id", ts, key)
    sql = f"SELECT {list_sql(q.connection.vendor)} FROM {TABLE} WHERE {q.where} ORDER BY ts DESC, id DESC LIMIT %s"
    fetched = fetch(scope, sql, [*q.params, limit + 1])
    rows = [list_row(values) for values in fetched[:limit]]
    next_cursor = None
    if len(fetched) > limit:
        last = fetched[limit - 1]
        next_cursor = encode_cursor(EVENTS_CURSOR, last[1], last[0])
    return {"events": rows, "next_cursor": next_cursor}


def answer_event(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    q = Where.of(scope)
    q.add("id = %s", question.key)
    q.history(at, scope)
    fetched = fetch(scope, f"SELECT {list_sql(q.connection.vendor)}, body FROM {TABLE} WHERE {q.where}", q.params)
    if not fetched:
        return {"event": None}
    values = fetched[0]
    row = list_row(values[:-1])
    wire = json.loads(values[-1])
    row["wire"] = wire
    if wire.get("type") == "inbound_delivery":
        # The provider's exact bytes, as the operator matches them against their console.
        row["provider_body"] = wire.get("body", "")
        row["provider_body_encoding"] = wire.get("body_encoding", "")
    return {"event": row}


def series_grid(at: datetime, window_us: int, bucket_us: int, retention_hours: float) -> tuple[int, int, int]:
    """(lower_us, origin_us, bars): where counting starts, the first bar's start, how many bars.

    Bars sit on a grid aligned to the Unix epoch; the first is the bucket the
    window's lower edge falls in — the window clipped to the history when it
    reaches past it, and to the latest :data:`MAX_BARS` bars when it holds
    more — and the last is the bucket holding ``at``, cut there.
    """
    at_us = to_us(at)
    latest_bars = at_us - at_us % bucket_us - (MAX_BARS - 1) * bucket_us
    lower = max(at_us - window_us, to_us(at - timedelta(hours=retention_hours)), latest_bars)
    origin = lower - lower % bucket_us
    bars = (at_us - at_us % bucket_us - origin) // bucket_us + 1
    return lower, origin, bars


def _bucket_sql(vendor: str) -> str:
    """The bar index of a row's ``ts`` given (origin_us, bucket_us) parameters, in exact integers."""
    return f"({us_sql(vendor)} - %s) / %s"


def answer_series(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    window_us, bucket_us = question.window_us, question.bucket_us
    if window_us <= 0 or bucket_us <= 0:
        raise BadQuestion("a series needs a positive window and bucket")
    if bucket_us > window_us:
        raise BadQuestion("the bucket must not be longer than the window")
    lower_us, origin_us, count = series_grid(at, window_us, bucket_us, scope.retention_hours)
    q = Where.of(scope)
    q.history(at, scope, floor=from_us(lower_us))
    q.filters(question.filters)
    bucket = _bucket_sql(q.connection.vendor)
    sql = (
        f"SELECT {bucket} AS bar, category, COUNT(*), SUM(CASE WHEN failed THEN 1 ELSE 0 END)"
        f" FROM {TABLE} WHERE {q.where} GROUP BY 1, 2"
    )
    at_us = to_us(at)
    bars: list[dict[str, Any]] = []
    for i in range(count):
        start = origin_us + i * bucket_us
        bars.append(
            {
                "start": format_timestamp(from_us(start)),
                "end": format_timestamp(from_us(min(start + bucket_us, at_us))),
                "total": 0,
                "failed": 0,
                "by_category": {},
                "partial": i == 0 and lower_us > origin_us,
            }
        )
    for index, category, total, failed in fetch(scope, sql, [origin_us, bucket_us, *q.params]):
        bar = bars[int(index)]
        bar["total"] += int(total)
        bar["failed"] += int(failed or 0)
        if category in CATEGORIES:
            bar["by_category"][category] = bar["by_category"].get(category, 0) + int(total)
    return {"bars": bars, "window_us": window_us, "bucket_us": bucket_us}


def finish_series(merged: dict[str, Any]) -> dict[str, Any]:
    """The asker's last step: drop a partial first bar, after every node's bars are summed."""
    bars = merged.get("bars") or []
    if bars and bars[0].get("partial"):
        bars = bars[1:]
    merged["bars"] = [{k: v for k, v in bar.items() if k != "partial"} for bar in bars]
    return merged


def _detail_rows(scope: NodeScope, column: str, value: str, at: datetime) -> tuple[list[tuple[Any, ...]], bool]:
    """Every listing row whose ``column`` is ``value``, oldest first, cut at MAX_DETAIL_ROWS."""
    q = Where.of(scope)
    q.add(f"{column} = %s", value)
    q.history(at, scope)
    sql = f"SELECT {list_sql(q.connection.vendor)} FROM {TABLE} WHERE {q.where} ORDER BY ts, id LIMIT %s"
    fetched = fetch(scope, sql, [*q.params, MAX_DETAIL_ROWS + 1])
    return fetched[:MAX_DETAIL_ROWS], len(fetched) > MAX_DETAIL_ROWS


def span_tree(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Listing rows grouped into spans (``span_id``), hung under their parents (``parent_span_id``).

    A span whose parent is not in the trace is a root; so is any span caught
    in a parent loop, so no row is ever lost from the tree. Events inside a
    span and spans under a parent are in (timestamp, id) order.
    """
    spans: dict[str, dict[str, Any]] = {}
    for row in rows:
        span = spans.get(row["span_id"])
        if span is None:
            span = spans[row["span_id"]] = {
                "span_id": row["span_id"],
                "parent_span_id": row["parent_span_id"],
                "events": [],
                "children": [],
            }
        span["events"].append(row)
    roots: list[dict[str, Any]] = []
    for span_id, span in spans.items():
        parent = span["parent_span_id"]
        if parent and parent != span_id and parent in spans and not _loops(spans, span_id):
            spans[parent]["children"].append(span)
        else:
            roots.append(span)

    def first(span: dict[str, Any]) -> tuple[str, str]:
        head = span["events"][0]
        return head["timestamp"], head["id"]
    for span in spans.values():
        span["children"].sort(key=first)
    roots.sort(key=first)
    return roots



def _loops(spans: dict[str, dict[str, Any]], start: str) -> bool:
    """Whether following parents from ``start`` comes back to it (a malformed trace).

    Every span on such a loop becomes a root; a span whose ancestry merely
    runs into a loop hangs under it as usual.
    """
    seen = {start}
    current = spans[start]["parent_span_id"]
    while current in spans:
        if current == start:
            return True
        if current in seen:
            return False
        seen.add(current)
        current = spans[current]["parent_span_id"]
    return False


def trace_rows(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """This node's rows of the trace, oldest first, flat: the asker hangs every node's rows in one tree."""
    fetched, truncated = _detail_rows(scope, "trace_id", question.key, at)
    return {"rows": [list_row(values) for values in fetched], "truncated": truncated}


def trace_answer(trace_id: str, rows: list[dict[str, Any]], truncated: bool) -> dict[str, Any]:
    """The trace from its rows in (timestamp, id) order, cut at MAX_DETAIL_ROWS (oldest kept)."""
    if len(rows) > MAX_DETAIL_ROWS:
        rows, truncated = rows[:MAX_DETAIL_ROWS], True
    return {"trace_id": trace_id, "total": len(rows), "truncated": truncated, "spans": span_tree(rows)}


def answer_trace(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    part = trace_rows(question, at, scope)
    return trace_answer(question.key, part["rows"], part["truncated"])


def answer_kept(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """Which of ``keys`` (ids other nodes named as unsettled) this node keeps settled in the history, sorted.

    The asker skips those: this node counted them already, as its own.
    """
    keys = list(dict.fromkeys(question.keys))
    if not keys:
        return {K_KEPT: []}
    q = Where(connections[scope.using])
    q.among("id", keys)
    q.add(SETTLED)
    q.history(at, scope)
    return {K_KEPT: sorted(str(row[0]) for row in fetch(scope, f"SELECT id FROM {TABLE} WHERE {q.where}", q.params))}


_ANSWERERS: dict[str, Callable[[Question, datetime, NodeScope], dict[str, Any]]] = {
    kinds.EVENTS: answer_events,
    kinds.EVENT: answer_event,
    kinds.EVENT_SERIES: answer_series,
    kinds.TRACE: answer_trace,
    kinds.TURNS: answer_turns,
    kinds.TURN: answer_turn,
    kinds.TURN_ROWS: answer_turn_rows,
    kinds.LAST_TURNS: answer_last_turns,
}
