"""What the drawn screens read: phase bodies, a trace placed on its axis, a merged trigger's wakes, the spend days,
the overview's per-seat charts and its live strip.

Each asks what its ``/api/`` twin asks (one event's body, the trace, the
series), so a chart and the API never disagree; the spend days are the usage
domain's fleet-wide counts (:class:`seats.budget_models.TokenUsage`: every
node charges the same rows, so a seat's day is one number however many nodes
ran its turns).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from django.http import QueryDict

from crewlet.company.budget import PERIOD_DAY, SCOPE_SEAT, window_of
from crewlet.events.types import AgentTurnCompleted, NotificationsCoalesced
from eventstore import api as store_api
from eventstore.console import timeline
from seats.budget_models import TokenUsage

#: The most phase bodies a trace or turn page reads (each is one fleet read).
MAX_PHASES = 20
#: The most constituents of a coalesced trigger a turn page names.
MAX_COALESCED = 20
#: How many company days the spend screen shows, newest last.
SPEND_DAYS = 14
#: The overview's small charts: this many hours, in bars of this length.
OVERVIEW_WINDOW = "6h"
OVERVIEW_BUCKET = "30m"
#: The type whose rows the overview's per-seat charts count (turns, and the failed ones among them).
TURNS_TYPE = AgentTurnCompleted.event_type


def event(event_id: str) -> Optional[dict[str, Any]]:
    found: Optional[dict[str, Any]] = store_api.event_detail(QueryDict(), event_id).get("event")
    return found


def phase_bodies(ids: list[str]) -> dict[str, dict[str, Any]]:
    """The published bodies of these ``agent_phase_completed`` rows (the first MAX_PHASES), by event id."""
    bodies = {}
    for event_id in ids[:MAX_PHASES]:
        found = event(event_id)
        if found is not None:
            bodies[event_id] = found.get("wire") or {}
    return bodies


def trace_context(answer: dict[str, Any]) -> dict[str, Any]:
    """The trace page's timeline: its spans placed on one axis, turns opened into their rounds."""
    return timeline.trace_timeline(answer, phase_bodies(timeline.phase_ids(answer.get("spans") or [])))


def coalesced(trace_id: str, seat: str) -> list[dict[str, Any]]:
    """The wakes a merged trigger stood for: the constituents of the seat's ``notifications_coalesced`` rows in the
    turn's trace (a merged trigger carries its first constituent's trace)."""
    if not trace_id or not seat:
        return []
    query = QueryDict(mutable=True)
    query.update({"type": NotificationsCoalesced.event_type, "trace_id": trace_id, "seat": seat, "limit": "10"})
    out: list[dict[str, Any]] = []
    for row in store_api.events_page(query)["events"]:
        body = (event(row["id"]) or {}).get("wire") or {}
        ids = [str(i) for i in body.get("event_ids") or []]
        for constituent in ids[:MAX_COALESCED]:
            found = event(constituent)
            out.append(found or {"id": constituent, "summary": "(not in the history)", "type": ""})
    return out


def spend_days(now: datetime, zone: str, days: int = SPEND_DAYS) -> dict[str, Any]:
    """Tokens per seat per company day (the usage domain's counts), the last ``days`` days in ``zone``."""
    labels = [window_of(PERIOD_DAY, now - timedelta(days=n), zone).label for n in range(days - 1, -1, -1)]
    prefix = f"{SCOPE_SEAT}:"
    rows = TokenUsage.objects.filter(period=PERIOD_DAY, window__in=labels, scope__startswith=prefix)
    grid: dict[str, dict[str, int]] = {}
    for row in rows:
        grid.setdefault(row.scope[len(prefix):], {})[row.window] = int(row.tokens)
    peak = max([v for per in grid.values() for v in per.values()] + [1])
    seats = []
    for handle in sorted(grid):
        counts = [grid[handle].get(d, 0) for d in labels]
        cells = [{"day": d, "tokens": n, "pct": round(n * 100 / peak, 2)} for d, n in zip(labels, counts)]
        seats.append({"seat": handle, "days": cells, "today": counts[-1], "total": sum(counts)})
    totals = [sum(grid[h].get(d, 0) for h in grid) for d in labels]
    rows = [
        {"day": d, "cells": [grid[h].get(d, 0) for h in sorted(grid)], "total": t}
        for d, t in reversed(list(zip(labels, totals)))
    ]
    return {"labels": labels, "seats": seats, "rows": rows, "totals": totals, "total": sum(totals), "today": totals[-1]}


def spend_models(now: datetime, zone: str, labels: list[str]) -> dict[str, Any]:
    """Tokens per model per company day (``labels``), from every node's phase rounds, and which nodes answered.

    The usage domain counts per seat and per company only; which model a
    round ran on is in the round (``agent_phase_completed.rounds[]``), so this
    is a fleet read of the history (the ``model_spend`` question), covered like
    the event log's reads: a node that did not answer is named, not guessed.
    """
    answer = store_api.model_spend(zone, window_of(PERIOD_DAY, now - timedelta(days=len(labels) - 1), zone).starts_at)
    grid: dict[str, dict[str, int]] = answer.get("models") or {}
    peak = max([v for per in grid.values() for v in per.values()] + [1])
    models = []
    for model in sorted(grid, key=lambda m: (-sum(grid[m].values()), m)):
        counts = [int(grid[model].get(d, 0)) for d in labels]
        cells = [{"day": d, "tokens": n, "pct": round(n * 100 / peak, 2)} for d, n in zip(labels, counts)]
        models.append({"model": model or "(unnamed)", "key": model, "days": cells, "today": counts[-1], "total": sum(counts)})
    coverage = answer.get("coverage") or {}
    missing = [n for n in coverage.get("nodes") or [] if not n.get("answered")]
    return {"models": models, "total": sum(m["total"] for m in models), "today": sum(m["today"] for m in models),
            "rounds": int(answer.get("rounds") or 0),
            "complete": bool(coverage.get("complete", True)), "missing": missing}


def seat_charts(handles: list[str]) -> list[dict[str, Any]]:
    """Each seat's turns over the last hours (``agent_turn_completed`` rows per bar, the failed ones drawn over them).

    ``query`` is the ``/api/events/series`` query each chart was drawn from: the page asks it again as a turn ends.
    """
    charts = []
    for handle in handles:
        query = QueryDict(mutable=True)
        query.update({"seat": handle, "type": TURNS_TYPE, "window": OVERVIEW_WINDOW, "bucket": OVERVIEW_BUCKET})
        bars = store_api.event_series(query)["bars"]
        charts.append({"seat": handle, "query": query.urlencode(), **timeline.spark(bars)})
    return charts


def running_now(seats: list[dict[str, Any]], at: Optional[datetime] = None) -> list[dict[str, Any]]:
    """The live strip: each seat running a turn, which turn, the round it is on, since when (the turn's start row) and for how long."""
    now = at or datetime.now(timezone.utc)
    out = []
    for s in seats:
        last = s.get("last_turn") or {}
        if not s.get("turn_id"):
            continue
        since = last.get("timestamp") if last.get("turn_id") == s["turn_id"] else None
        took_s = (now - timeline.parse_timestamp(since)).total_seconds() if since else None
        out.append({"seat": s["handle"], "turn_id": s["turn_id"], "since": since, "for_s": took_s, "round": s.get("round") or 0})
    return out


__all__ = [
    "coalesced", "event", "phase_bodies", "running_now", "seat_charts", "spend_days", "spend_models", "trace_context",
]
