"""Turns: one folded from its rows, a page of them, and one with its events.

A turn is not a stored row: it is folded (:func:`fold_turn`) from its starts,
completions, phases, stops and failures, and the live projection reads a
completion's outcome by the same rule.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Optional, Sequence

from crewlet.events import format_timestamp, types
from eventstore.questions.cursor import TURNS_CURSOR, decode_cursor, encode_cursor
from eventstore.questions.listing import LIST_COLUMNS, list_row, list_sql
from eventstore.questions.model import MAX_DETAIL_ROWS, MAX_LIMIT, Filters, NodeScope, Question
from eventstore.questions.sql import TABLE, Where, fetch, marks, us_sql
from eventstore.questions.timefmt import format_us, from_us, to_us

# The rows a turn is folded from (each wire name read off its registered class).
TURN_STARTED = types.AgentTurnStarted.event_type
TURN_COMPLETED = types.AgentTurnCompleted.event_type
PHASE_COMPLETED = types.AgentPhaseCompleted.event_type
TURN_STOPPED = types.AgentTurnStopped.event_type
TURN_FAILURES: tuple[str, ...] = tuple(
    cls.event_type for cls in (types.TurnGuardBreach, types.LLMUnavailable, types.BudgetExhausted)
)
FOLD_TYPES: tuple[str, ...] = (TURN_STARTED, TURN_COMPLETED, PHASE_COMPLETED, TURN_STOPPED, *TURN_FAILURES)
#: The fold reads bodies of these only: a phase's body holds whole prompts.
_BODY_TYPES: tuple[str, ...] = (TURN_STARTED, TURN_COMPLETED)

OUTCOME_OK = "ok"
OUTCOME_FAILED = "failed"
OUTCOME_STOPPED = "stopped"
OUTCOME_SUSPENDED = "suspended"
OUTCOME_RUNNING = "running"
TURN_OUTCOMES: tuple[str, ...] = (OUTCOME_OK, OUTCOME_FAILED, OUTCOME_STOPPED, OUTCOME_SUSPENDED, OUTCOME_RUNNING)


def fold_turn(turn_id: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One turn, folded from its rows in (timestamp, id) order.

    Each row: ``type``, ``timestamp`` (datetime), ``node``, ``seat``,
    ``conversation_key``, ``trace_id``, ``input_tokens``, ``output_tokens``,
    ``failed``, and ``body`` (the parsed event) for starts and completions.
    A turn resumed after parking on a coding run has several starts and
    completions under one id: it started at the first start and its outcome
    is the last segment's. Tokens are the completions' when they carry any,
    else the sum of the phases'.
    """
    starts = [r for r in rows if r["type"] == TURN_STARTED]
    completions = [r for r in rows if r["type"] == TURN_COMPLETED]
    phases = [r for r in rows if r["type"] == PHASE_COMPLETED]
    first_start = starts[0] if starts else None
    last_start = starts[-1] if starts else None
    last_completion = completions[-1] if completions else None
    since_start = (lambda r: last_start is None or r["timestamp"] >= last_start["timestamp"])

    ended: Optional[datetime] = None
    if last_completion is not None and since_start(last_completion):
        body = last_completion.get("body") or {}
        ended = last_completion["timestamp"]
        if last_completion["failed"] or body.get("failed") is True:
            outcome = OUTCOME_FAILED
        elif body.get("stopped") is True:
            outcome = OUTCOME_STOPPED
        elif body.get("suspended") is True:
            outcome = OUTCOME_SUSPENDED
        else:
            outcome = OUTCOME_OK
    else:
        failures = [r for r in rows if r["type"] in TURN_FAILURES and since_start(r)]
        stops = [r for r in rows if r["type"] == TURN_STOPPED and since_start(r)]
        if failures:
            outcome, ended = OUTCOME_FAILED, failures[-1]["timestamp"]
        elif stops:
            outcome, ended = OUTCOME_STOPPED, stops[-1]["timestamp"]
        else:
            outcome = OUTCOME_RUNNING

    tokens_in = sum(r["input_tokens"] for r in completions)
    tokens_out = sum(r["output_tokens"] for r in completions)
    if tokens_in == 0 and tokens_out == 0:
        tokens_in = sum(r["input_tokens"] for r in phases)
        tokens_out = sum(r["output_tokens"] for r in phases)

    start_body = (first_start or {}).get("body") or {}
    head = first_start or (rows[0] if rows else {})
    started = first_start["timestamp"] if first_start else None
    return {
        "turn_id": turn_id,
        "seat": head.get("seat", ""),
        "nodes": sorted({r["node"] for r in rows if r["node"]}),
        "conversation_key": head.get("conversation_key", ""),
        "trace_id": head.get("trace_id", ""),
        "trigger": {
            "type": start_body.get("trigger_type", ""),
            "event_id": start_body.get("trigger_event_id", ""),
        }
        if first_start
        else None,
        "work_item": start_body.get("work_item"),
        "started": format_timestamp(started) if started else None,
        "ended": format_timestamp(ended) if ended else None,
        "duration_ms": (ended - started) // timedelta(milliseconds=1) if started and ended else None,
        "outcome": outcome,
        "segments": len(starts),
        "phases": len(phases),
        "tokens": {"input": tokens_in, "output": tokens_out, "total": tokens_in + tokens_out},
    }


def _fold_columns(vendor: str) -> str:
    return f"turn_id, type, {us_sql(vendor)}, id, node, seat, conversation_key, trace_id, input_tokens, output_tokens, failed"


def _body_case(params: list[Any]) -> str:
    params.extend(_BODY_TYPES)
    return f"CASE WHEN type IN ({marks(_BODY_TYPES)}) THEN body END"


def _fold_row(values: Sequence[Any]) -> dict[str, Any]:
    turn_id, etype, ts, eid, node, seat, conv, trace, tin, tout, failed, body = values
    return {
        "turn_id": turn_id,
        "type": etype,
        "timestamp": from_us(ts),
        "id": eid,
        "node": node,
        "seat": seat,
        "conversation_key": conv,
        "trace_id": trace,
        "input_tokens": int(tin or 0),
        "output_tokens": int(tout or 0),
        "failed": bool(failed),
        "body": json.loads(body) if body else None,
    }


def _fold_rows(scope: NodeScope, turn_ids: Sequence[str], at: datetime) -> dict[str, list[dict[str, Any]]]:
    """Every fold row of exactly these turns (whatever the page's filters), grouped by turn."""
    if not turn_ids:
        return {}
    params: list[Any] = []
    body = _body_case(params)
    q = Where.of(scope)
    q.among("turn_id", turn_ids)
    q.add("turn_id > ''")
    q.add(f"type IN ({marks(FOLD_TYPES)})", *FOLD_TYPES)
    q.history(at, scope)
    sql = f"SELECT {_fold_columns(q.connection.vendor)}, {body} FROM {TABLE} WHERE {q.where} ORDER BY ts, id"
    grouped: dict[str, list[dict[str, Any]]] = {t: [] for t in turn_ids}
    for values in fetch(scope, sql, [*params, *q.params]):
        grouped[values[0]].append(_fold_row(values))
    return grouped


def _started_where(scope: NodeScope, f: Filters, at: datetime) -> Where:
    """The starts a turns page lists a turn by: in the history, passing the page's filters."""
    q = Where.of(scope)
    q.add("type = %s", TURN_STARTED)
    q.add("turn_id > ''")
    q.history(at, scope)
    q.filters(Filters(seat=f.seat, node=f.node, trace_id=f.trace_id, conversation_key=f.conversation_key, since=f.since, until=f.until))
    return q


def turn_page(question: Question, at: datetime, scope: NodeScope) -> tuple[list[tuple[str, int]], bool]:
    """This node's page of turns: (turn id, earliest listed start in microseconds), newest first; and whether more follow.

    A turn is listed where this node's share says it starts (its earliest
    start passing the filters), within one microsecond by its id.
    """
    limit = max(1, min(int(question.limit), MAX_LIMIT))
    q = _started_where(scope, question.filters, at)
    having = ""
    params = list(q.params)
    if question.cursor:
        ts, key = decode_cursor(TURNS_CURSOR, question.cursor)
        having = " HAVING (MIN(ts), turn_id) < (%s, %s)"
        params += [q.ts(ts), key]
    sql = (
        f"SELECT turn_id, {us_sql(q.connection.vendor, 'MIN(ts)')} FROM {TABLE} WHERE {q.where}"
        f" GROUP BY turn_id{having} ORDER BY MIN(ts) DESC, turn_id DESC LIMIT %s"
    )
    page = fetch(scope, sql, [*params, limit + 1])
    return [(turn_id, int(started)) for turn_id, started in page[:limit]], len(page) > limit


def listed_starts(scope: NodeScope, turn_ids: Sequence[str], f: Filters, at: datetime) -> dict[str, int]:
    """Where this node's share lists each of ``turn_ids`` (its earliest start passing ``f``), in microseconds."""
    if not turn_ids:
        return {}
    q = _started_where(scope, f, at)
    q.among("turn_id", turn_ids)
    sql = f"SELECT turn_id, {us_sql(q.connection.vendor, 'MIN(ts)')} FROM {TABLE} WHERE {q.where} GROUP BY turn_id"
    return {turn_id: int(started) for turn_id, started in fetch(scope, sql, q.params)}


def fold_listed(listed: Sequence[tuple[str, int]], grouped: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The page's turns, each folded from its rows and placed where the page lists it."""
    turns = []
    for turn_id, started in listed:
        folded = fold_turn(turn_id, grouped.get(turn_id, []))
        # Paged where this page lists it: the earliest start that passed the filters.
        folded["listed_at"] = format_us(started)
        turns.append(folded)
    return turns


def answer_turns(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """A page of turns, newest first by (earliest listed start, turn id), each folded whole."""
    listed, more = turn_page(question, at, scope)
    grouped = _fold_rows(scope, [t for t, _ in listed], at)
    next_cursor = None
    if more:
        turn_id, started = listed[-1]
        next_cursor = encode_cursor(TURNS_CURSOR, started, turn_id)
    return {"turns": fold_listed(listed, grouped), "next_cursor": next_cursor}


def detail_rows(scope: NodeScope, turn_id: str, at: datetime) -> tuple[list[dict[str, Any]], bool]:
    """Every row of one turn, oldest first, cut at MAX_DETAIL_ROWS: listing rows carrying what the fold reads.

    Each is the listing row plus ``ts_us``, ``input_tokens``, ``output_tokens``
    and ``body`` (the parsed event, for starts and completions only) — JSON
    as it stands, so a node sends it to the asker unchanged.
    """
    params: list[Any] = []
    body = _body_case(params)
    q = Where.of(scope)
    q.add("turn_id = %s", turn_id)
    q.add("turn_id > ''")
    q.history(at, scope)
    sql = (
        f"SELECT {list_sql(q.connection.vendor)}, input_tokens, output_tokens, {body} FROM {TABLE}"
        f" WHERE {q.where} ORDER BY ts, id LIMIT %s"
    )
    fetched = fetch(scope, sql, [*params, *q.params, MAX_DETAIL_ROWS + 1])
    width = len(LIST_COLUMNS)
    rows = []
    for values in fetched[:MAX_DETAIL_ROWS]:
        row = list_row(values[:width])
        tin, tout, raw = values[width:]
        row["ts_us"] = int(values[1])
        row["input_tokens"] = int(tin or 0)
        row["output_tokens"] = int(tout or 0)
        row["body"] = json.loads(raw) if raw else None
        rows.append(row)
    return rows, len(fetched) > MAX_DETAIL_ROWS


#: What :func:`detail_rows` adds to a listing row; the turn's ``events`` leave them out.
DETAIL_EXTRAS: tuple[str, ...] = ("ts_us", "input_tokens", "output_tokens", "body")


def fold_detail(turn_id: str, rows: Sequence[dict[str, Any]], truncated: bool) -> Optional[dict[str, Any]]:
    """One turn with its events, folded from :func:`detail_rows` rows in (timestamp, id) order; None without rows."""
    if not rows:
        return None
    events, fold = [], []
    for row in rows:
        listing = {k: v for k, v in row.items() if k not in DETAIL_EXTRAS}
        events.append(listing)
        if listing["type"] in FOLD_TYPES:
            fold.append({**listing, **{k: row[k] for k in DETAIL_EXTRAS}, "timestamp": from_us(row["ts_us"])})
    turn = fold_turn(turn_id, fold)
    turn["events"] = events
    turn["truncated"] = truncated
    return turn


def answer_turn(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    rows, truncated = detail_rows(scope, question.key, at)
    return {"turn": fold_detail(question.key, rows, truncated)}


def fold_wire(row: dict[str, Any]) -> dict[str, Any]:
    """A fold row as it travels: the timestamp as microseconds (:func:`fold_unwire` reverses it)."""
    return {**row, "timestamp": to_us(row["timestamp"])}


def fold_unwire(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "timestamp": from_us(int(row["timestamp"]))}


def answer_turn_rows(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """This node's share of exactly ``question.keys``: where it lists each, and its rows of each.

    ``detail``: every row (:func:`detail_rows`, for one turn's page and the
    seed); else the fold's rows only (a page of turns). The listing position is
    this node's earliest start of the turn passing the page's filters, so the
    asker places a turn whose halves sit on two nodes at the earlier one.
    """
    keys = list(dict.fromkeys(question.keys))
    listed = listed_starts(scope, keys, question.filters, at)
    turns: dict[str, dict[str, Any]] = {}
    if question.detail:
        for turn_id in keys:
            rows, truncated = detail_rows(scope, turn_id, at)
            if rows:
                turns[turn_id] = {"rows": rows, "truncated": truncated}
    else:
        for turn_id, rows in _fold_rows(scope, keys, at).items():
            if rows:
                turns[turn_id] = {"rows": [fold_wire(r) for r in rows], "truncated": False}
    for turn_id, entry in turns.items():
        entry["listed_us"] = listed.get(turn_id)
    return {"turns": turns}


def answer_last_turns(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """Each seat of ``question.keys``: this node's newest listed turn of it, as ``[turn id, start us]``."""
    seats: dict[str, list[Any]] = {}
    for handle in question.keys:
        page, _ = turn_page(Question(kind=question.kind, at=at, filters=Filters(seat=handle), limit=1), at, scope)
        if page:
            seats[handle] = list(page[0])
    return {"seats": seats}
