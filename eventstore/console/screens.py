"""The dashboard's drawn screens: a trace as a timeline, a turn's page, the spend screen.

Each reads what its ``/api/`` twin reads (:mod:`eventstore.console.reads`)
and :mod:`eventstore.console.timeline` places it on an axis, drawn by the
template with plain HTML and CSS.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render

from crewlet.engine import runtime
from eventstore import api as store_api
from eventstore import here, projection
from eventstore.console import reads, timeline
from eventstore.console.dashboard import staff_only


def _refusing(title: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """A screen whose read refuses a parameter (``BadParameter``) is the error page titled ``title``, 400, naming it."""

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def refusing(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return view(request, *args, **kwargs)
            except store_api.BadParameter as exc:
                reason = f"{exc.param}: {exc.reason}"
                return render(request, "dashboard/error.html", {"title": title, "reason": reason}, status=400)

        return refusing

    return wrap


def _found(read: Callable[[QueryDict, str], dict[str, Any]], ident: str, key: str, what: str) -> dict[str, Any]:
    """What ``read`` answers for ``ident``, which must hold ``key``; else a 404 naming the ``what`` not found."""
    answer = read(QueryDict(), ident)
    if not answer.get(key):
        raise Http404(f"no {what} {ident} in the fleet's history")
    return answer


@staff_only
@_refusing("Trace")
def trace(request: HttpRequest, trace_id: str) -> HttpResponse:
    """The trace as a timeline: every span a bar on one axis, folding as a tree; a turn opened into its rounds."""
    answer = _found(store_api.trace, trace_id, "spans", "trace")
    return render(request, "dashboard/trace.html", {"page": "trace", "trace": answer, "timeline": reads.trace_context(answer)})


@staff_only
@_refusing("Turn")
def turn(request: HttpRequest, turn_id: str) -> HttpResponse:
    """One turn: its trigger (and what it coalesced), each round and tool call, the prompts and answers folded."""
    folded = _found(store_api.turn_detail, turn_id, "turn", "turn")["turn"]
    events = folded.get("events") or []
    started = next((e for e in events if e["type"] == timeline.TURN_STARTED), None)
    turn_us = timeline.moment_us(started["timestamp"]) if started else 0
    bodies = reads.phase_bodies([e["id"] for e in events if e["type"] == timeline.PHASE_COMPLETED])
    phases = []
    for event_id, body in bodies.items():
        phases.append({
            "id": event_id,
            "phase": body.get("phase", ""),
            "rows": timeline.round_rows(body, None, turn_us),
            "system_prompt": body.get("system_prompt", ""),
            "user_prompt": body.get("user_prompt", ""),
            "response": body.get("response", ""),
            "tool_calls": body.get("tool_calls") or [],
            "error": body.get("error", ""),
            "truncated": body.get("truncated") or [],
        })
    trigger = (folded.get("trigger") or {}).get("event_id")
    trigger_row = reads.event(trigger) if trigger else None
    coalesced = reads.coalesced(folded.get("trace_id") or "", folded.get("seat") or "")
    context = {
        "page": "turn", "turn": folded, "phases": phases, "trigger": trigger_row, "coalesced": coalesced,
        "rounds": sum(1 for p in phases for r in p["rows"] if r["kind"] == timeline.KIND_MODEL),
    }
    return render(request, "dashboard/turn.html", context)


@staff_only
def spend(request: HttpRequest) -> HttpResponse:
    """Tokens per seat per day from the fleet-wide counts, per model from the phases' rounds; with budgets, each
    window's spend against its ceiling."""
    live = projection.current()
    org = live.company() if live is not None else None
    zone = org.timezone if org is not None else "UTC"
    days = reads.spend_days(here.clock(), zone)
    windows = []
    if live is not None:
        for w in (live.snapshot().get("budgets") or {}).get("windows") or []:
            ceiling = int(w.get("ceiling") or 0)
            pct = round(min(int(w.get("spend") or 0) * 100 / ceiling, 100), 2) if ceiling else 0
            windows.append({**w, "pct": pct})
    try:
        models: Optional[dict[str, Any]] = reads.spend_models(here.clock(), zone, days["labels"])
    except runtime.EngineAway:
        models = None  # the history is read through an engine's fleet reads; the page says why there is none
    context = {"page": "spend", "days": days, "models": models, "zone": zone, "windows": windows,
               "no_engine": runtime.NO_ENGINE if live is None else ""}
    return render(request, "dashboard/spend.html", context)



@staff_only
@_refusing("Delivery")
def delivery(request: HttpRequest, delivery_id: str) -> HttpResponse:
    """Where one delivery is now: accepted, each seat it was routed to (waiting and why, coalesced, worked), each skip."""
    answer = _found(store_api.delivery, delivery_id, "delivery", "delivery")
    return render(request, "dashboard/delivery.html", {"page": "delivery", "delivery": answer["delivery"], "coverage": answer.get("coverage")})


@staff_only
@_refusing("Delivery")
def delivery_of_event(request: HttpRequest, event_id: str) -> HttpResponse:
    """An event row's "delivery" link: the delivery its body names, on its own page."""
    found = reads.event(event_id)
    delivery_id = str(((found or {}).get("wire") or {}).get("delivery_id") or "")
    if not delivery_id:
        raise Http404(f"event {event_id} names no delivery")
    return redirect("dash-delivery", delivery_id=delivery_id)


__all__ = ["delivery", "delivery_of_event", "spend", "trace", "turn"]
