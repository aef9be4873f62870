"""Tokens per model per company day, from the rounds the turns' phases recorded.

The usage domain's fleet-wide counts (``seats_token_usage``) are kept per
seat and per company, never per model: which model a round ran on is only in
the round itself, ``agent_phase_completed.rounds[]`` (``model``,
``input_tokens``, ``output_tokens``). The ``MODEL_SPEND`` question reads those
rows from each node's store, and each node sums its share by model and by the
company day its phase row fell on; the asker adds the nodes' sums up like the
``COUNTS`` question's.

The question's ``key`` is the company's zone (an IANA name) its days are read
in, ``filters.since`` the first day's start; the history ends at the instant.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Iterable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crewlet.company.budget import PERIOD_DAY, window_of
from eventstore.questions.counts import as_count
from eventstore.questions.model import BadQuestion, NodeScope, Question
from eventstore.questions.sql import TABLE, Where, fetch, us_sql
from eventstore.questions.timefmt import from_us
from eventstore.questions.turns import PHASE_COMPLETED

#: What a round's model is called when its backend named none (a failed call, an unnamed model).
UNNAMED_MODEL = ""


def round_tokens(round_: Any) -> tuple[str, int]:
    """One ``rounds[]`` entry's model and the tokens it billed (input plus output; 0 for a call that failed)."""
    if not isinstance(round_, dict):
        return UNNAMED_MODEL, 0
    model = round_.get("model")
    return (model if isinstance(model, str) else UNNAMED_MODEL), as_count(round_.get("input_tokens")) + as_count(
        round_.get("output_tokens")
    )


def add_rounds(into: dict[str, dict[str, int]], day: str, rounds: Iterable[Any]) -> int:
    """Each round's tokens into ``into[model][day]``; how many rounds billed any."""
    counted = 0
    for entry in rounds:
        model, tokens = round_tokens(entry)
        if tokens:
            per_day = into.setdefault(model, {})
            per_day[day] = per_day.get(day, 0) + tokens
            counted += 1
    return counted


def _zone(question: Question) -> str:
    try:
        ZoneInfo(question.key)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise BadQuestion(f"key {question.key[:64]!r} is not a time zone: {exc}") from None
    return question.key


def answer_model_spend(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """This node's part: ``{"models": {model: {day: tokens}}, "rounds": n}`` over its phase rows in the window."""
    zone = _zone(question)
    q = Where.of(scope)
    q.history(at, scope, question.filters.since)
    q.add("type = %s", PHASE_COMPLETED)
    models: dict[str, dict[str, int]] = {}
    counted = 0
    sql = f"SELECT {us_sql(q.connection.vendor)}, body FROM {TABLE} WHERE {q.where}"
    for ts_us, body in fetch(scope, sql, q.params):
        wire = json.loads(body)
        rounds = wire.get("rounds") if isinstance(wire, dict) else None
        day = window_of(PERIOD_DAY, from_us(int(ts_us)), zone).label
        counted += add_rounds(models, day, rounds if isinstance(rounds, list) else [])
    return {"models": models, "rounds": counted}


def merge_model_spend(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The nodes' sums added up, model by model and day by day."""
    models: dict[str, dict[str, int]] = {}
    counted = 0
    for part in parts:
        counted += int(part.get("rounds") or 0)
        for model, days in (part.get("models") or {}).items():
            mine = models.setdefault(str(model), {})
            for day, tokens in days.items():
                mine[str(day)] = mine.get(str(day), 0) + int(tokens)
    return {"models": models, "rounds": counted}


__all__ = ["UNNAMED_MODEL", "add_rounds", "answer_model_spend", "merge_model_spend", "round_tokens"]
