"""Time drawn: a trace's spans on one axis, a turn's rounds and tool calls, and the small per-seat bars.

Pure functions over the answers the ``/api/`` reads give (a trace's span
tree, a phase's ``rounds[]``, a series' bars): they place each thing on a
shared axis as a start and a length in per cent of the axis, so a template
draws it with plain HTML/SVG and no script. A span's extent is its own
events' and every descendant's, so a parent bar always covers its children;
the wait in the inbox is the gap between the event that put a wake on a seat's
inbox (the routing, in the parent span) and the turn that took it. A round's
model call is placed where ``started_ms`` says (milliseconds from the turn's
start); its tool calls follow it one after another, each as long as it took.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Optional, Sequence

from crewlet.events import parse_timestamp
from crewlet.events.types import AgentPhaseCompleted, AgentTurnStarted

PHASE_COMPLETED = AgentPhaseCompleted.event_type
TURN_STARTED = AgentTurnStarted.event_type
#: The narrowest a bar is drawn (per cent of the axis), so an instant is still a visible mark.
MIN_BAR_PCT = 0.4
#: Row kinds a timeline draws (the ``data-kind`` of each row).
KIND_SPAN = "span"
KIND_WAIT = "wait"
KIND_MODEL = "model"
KIND_TOOL = "tool"


def moment_us(timestamp: str) -> int:
    moment: datetime = parse_timestamp(timestamp)
    return int(moment.timestamp() * 1_000_000)


class Axis:
    """``[start_us, end_us]`` and where an instant or a stretch of it falls, in per cent."""

    def __init__(self, start_us: int, end_us: int) -> None:
        self.start_us = start_us
        self.end_us = max(end_us, start_us + 1)

    @property
    def span_ms(self) -> float:
        return (self.end_us - self.start_us) / 1000

    def place(self, start_us: int, duration_us: int) -> dict[str, Any]:
        width = self.end_us - self.start_us
        left = max(0.0, min(100.0, (start_us - self.start_us) * 100 / width))
        size = max(MIN_BAR_PCT, min(100.0 - left, duration_us * 100 / width))
        return {
            "left_pct": round(left, 3),
            "width_pct": round(size, 3),
            "start_ms": round((start_us - self.start_us) / 1000, 3),
            "duration_ms": round(duration_us / 1000, 3),
        }


def _extent(span: dict[str, Any]) -> tuple[int, int]:
    moments = [moment_us(e["timestamp"]) for e in span["events"]]
    for child in span["children"]:
        moments.extend(_extent(child))
    return min(moments), max(moments)


def trace_timeline(trace: dict[str, Any], phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The trace's span tree with each span placed on one axis: ``{"axis_ms", "spans": [...]}``.

    Each span keeps its ``span_id``, ``events`` and ``children`` (so it folds
    as the tree did) and gains ``bar`` (its extent), ``head`` (its first
    event), ``wait`` (the inbox wait before a turn span, or None) and
    ``rounds`` (for a turn span: each model call and tool call of its phases,
    from ``phases``, the phase events' bodies by event id).
    """
    roots = trace.get("spans") or []
    if not roots:
        return {"axis_ms": 0.0, "spans": []}
    extents = [_extent(s) for s in roots]
    axis = Axis(min(a for a, _ in extents), max(b for _, b in extents))
    return {"axis_ms": round(axis.span_ms, 3), "spans": [_place(s, axis, phases, None) for s in _by_start(roots)]}


def _by_start(spans: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(spans, key=lambda s: (_extent(s)[0], s["events"][0]["id"]))


def _place(span: dict[str, Any], axis: Axis, phases: dict[str, dict[str, Any]], parent_last_us: Optional[int]) -> dict[str, Any]:
    start, end = _extent(span)
    events = span["events"]
    started = next((e for e in events if e["type"] == TURN_STARTED), None)
    wait = None
    if started is not None and parent_last_us is not None:
        turn_us = moment_us(started["timestamp"])
        if turn_us > parent_last_us:
            wait = axis.place(parent_last_us, turn_us - parent_last_us)
    rounds: list[dict[str, Any]] = []
    if started is not None:
        turn_us = moment_us(started["timestamp"])
        for e in events:
            if e["type"] == PHASE_COMPLETED and e["id"] in phases:
                rounds.extend(round_rows(phases[e["id"]], axis, turn_us))
    own_last = max(moment_us(e["timestamp"]) for e in events)
    return {
        "span_id": span["span_id"],
        "head": events[0],
        "events": events,
        "bar": axis.place(start, end - start),
        "wait": wait,
        "rounds": rounds,
        "children": [_place(c, axis, phases, own_last) for c in _by_start(span["children"])],
    }


def round_rows(phase: dict[str, Any], axis: Optional[Axis], turn_us: int) -> list[dict[str, Any]]:
    """One row per model call of ``phase`` (its ``rounds[]``) and per tool call after it, in the order they ran.

    Without an ``axis`` the rows carry their times and no placement (the turn page's table).
    """
    rows: list[dict[str, Any]] = []
    for entry in phase.get("rounds") or []:
        if not isinstance(entry, dict):
            continue
        at_us = turn_us + int(entry.get("started_ms") or 0) * 1000
        took_us = int(entry.get("duration_ms") or 0) * 1000
        model = {
            "kind": KIND_MODEL,
            "round": entry.get("round"),
            "model": entry.get("model", ""),
            "provider": entry.get("provider_key", ""),
            "input_tokens": int(entry.get("input_tokens") or 0),
            "output_tokens": int(entry.get("output_tokens") or 0),
            "stop_reason": entry.get("stop_reason") or entry.get("error_kind") or "",
            "failed": bool(entry.get("error_kind")),
            "duration_ms": took_us // 1000,
            "tool_count": int(entry.get("tool_count") or 0),
        }
        if axis is not None:
            model["bar"] = axis.place(at_us, took_us)
        rows.append(model)
        at_us += took_us
        for call in entry.get("tool_calls") or []:
            call_us = int(call.get("duration_ms") or 0) * 1000
            tool = {
                "kind": KIND_TOOL,
                "round": entry.get("round"),
                "server": call.get("server", ""),
                "tool": call.get("tool") or call.get("name", ""),
                "duration_ms": call_us // 1000,
                "ok": bool(call.get("ok")),
                "error": call.get("error", ""),
                "bytes": int(call.get("bytes") or 0),
            }
            if axis is not None:
                tool["bar"] = axis.place(at_us, call_us)
            rows.append(tool)
            at_us += call_us
    return rows


def phase_ids(spans: Iterable[dict[str, Any]]) -> list[str]:
    """The ids of every ``agent_phase_completed`` row in a span tree (the bodies a timeline needs)."""
    out: list[str] = []
    for span in spans:
        out.extend(e["id"] for e in span["events"] if e["type"] == PHASE_COMPLETED)
        out.extend(phase_ids(span["children"]))
    return out


def spark(bars: Sequence[dict[str, Any]], *, width: int = 120, height: int = 28) -> dict[str, Any]:
    """A series' bars as SVG rectangles (``total`` and, over it, ``failed``) scaled into ``width`` x ``height``."""
    peak = max([int(b.get("total") or 0) for b in bars] + [1])
    step = width / max(len(bars), 1)
    rects = []
    for i, bar in enumerate(bars):
        total, failed = int(bar.get("total") or 0), int(bar.get("failed") or 0)
        h_total = round(total * height / peak, 2)
        h_failed = round(failed * height / peak, 2)
        rects.append({
            "x": round(i * step, 2), "w": round(max(step - 1, 1), 2), "total": total, "failed": failed,
            "start": bar.get("start", ""), "y_total": round(height - h_total, 2), "h_total": h_total,
            "y_failed": round(height - h_failed, 2), "h_failed": h_failed,
        })
    return {"width": width, "height": height, "peak": peak, "rects": rects,
            "total": sum(r["total"] for r in rects), "failed": sum(r["failed"] for r in rects)}


__all__ = ["Axis", "moment_us", "phase_ids", "round_rows", "spark", "trace_timeline"]
