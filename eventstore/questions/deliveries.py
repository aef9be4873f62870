"""Where a delivery is now: the rows that name it on this node, and the fold that reads its path from them.

A delivery id travels on the events the edge and the router publish — the
``inbound_delivery`` record (accepted), each seat's ``external_notification``
wake (routed) and each ``notification_skipped`` (dropped, and why) carry it
as ``delivery_id``. From there it is the wakes' ids that travel: a
``notifications_coalesced`` record lists them in ``event_ids`` (its merged
trigger's id derived from them, :func:`coalesced_trigger_id`), and a turn's
start or a ``turn_trigger_skipped`` names the trigger it took as
``trigger_event_id`` — the wake itself, or the merged trigger.

So the fleet asks twice (:func:`eventstore.fanout.merge.delivery_plan`):
every node's rows naming the delivery, then every node's rows naming the
triggers those wakes became. :func:`fold_delivery` is pure: the merged rows,
the turns they name, the live facts and the dead letters in; the answer out.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Optional, Sequence

from crewlet.events import types
from crewlet.events.registry import WEBHOOK
from crewlet.events.types.notification import coalesced_trigger_id
from eventstore.questions.listing import LIST_COLUMNS, list_row, list_sql
from eventstore.questions.model import MAX_DETAIL_ROWS, NodeScope, Question
from eventstore.questions.sql import TABLE, Where, fetch, marks
from eventstore.questions.turns import OUTCOME_FAILED, OUTCOME_RUNNING, TURN_STARTED

WAKE = types.ExternalNotification.event_type
NOTIFICATION_SKIPPED = types.NotificationSkipped.event_type
COALESCED = types.NotificationsCoalesced.event_type
TRIGGER_SKIPPED = types.TurnTriggerSkipped.event_type
RETRY = types.MessageRetryScheduled.event_type
#: The inbound record's category: its row's type is the delivery's own label (``webhook:<event>``).
ACCEPTED_CATEGORY = WEBHOOK
#: The rows that name a delivery by its id, and the rows that follow a trigger by its id.
NAMING_TYPES: tuple[str, ...] = (WAKE, NOTIFICATION_SKIPPED)
FOLLOWING_TYPES: tuple[str, ...] = (COALESCED, TRIGGER_SKIPPED, TURN_STARTED, RETRY)

# -- a seat's state for the delivery, and the delivery's (wire strings) ----------------------------
ACCEPTED = "accepted"
WAITING = "waiting"
COALESCED_STATE = "coalesced"
RUNNING = "running"
WORKED = "worked"
SKIPPED = "skipped"
DEAD_LETTERED = "dead_lettered"
#: The states a dead letter could still explain (nothing took the wake yet).
UNSETTLED: frozenset[str] = frozenset({WAITING, COALESCED_STATE})

#: A delivery's overall state is its least settled seat's, in this order.
STATE_ORDER: tuple[str, ...] = (WAITING, COALESCED_STATE, RUNNING, DEAD_LETTERED, WORKED, SKIPPED, ACCEPTED)

# -- what holds a waiting wake back (``waiting.held_by.kind``) -------------------------------------
HELD_PAUSE = "pause"
HELD_BUDGET = "budget"
HELD_NO_PROVIDER = "no_provider"
HELD_TURN = "running_turn"


def carries_delivery(event_type: str, category: str) -> bool:
    """Whether a row of this type names a delivery id in its body (the dashboard links it to the delivery's page)."""
    return event_type in NAMING_TYPES or category == ACCEPTED_CATEGORY


def may_be_dead(path: dict[str, Any]) -> bool:
    """Whether a dead letter could explain a seat's path: nothing took its wake yet, or its latest attempt failed."""
    return path["state"] in UNSETTLED or (path["turn"] or {}).get("outcome") == OUTCOME_FAILED


def _like(text: str) -> str:
    """``text`` as it sits in a stored body (compact JSON), escaped for LIKE (``\\`` the escape)."""
    quoted = json.dumps(text, ensure_ascii=False)
    return quoted.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _rows(scope: NodeScope, q: Where) -> list[dict[str, Any]]:
    sql = f"SELECT {list_sql(q.connection.vendor)}, body FROM {TABLE} WHERE {q.where} ORDER BY ts, id LIMIT %s"
    fetched = fetch(scope, sql, [*q.params, MAX_DETAIL_ROWS])
    width = len(LIST_COLUMNS)
    out = []
    for values in fetched:
        row = list_row(values[:width])
        row["ts_us"] = int(values[1])
        row["body"] = _kept(values[width])
        out.append(row)
    return out


#: The body fields the fold reads: an inbound record's body holds the provider's whole payload, which stays home.
KEPT_FIELDS: tuple[str, ...] = (
    "delivery_id", "event_name", "seat", "recipient", "reason", "detail", "event_ids", "trigger_event_id",
    "original_id", "delivery", "max_deliveries", "retry_at",
)


def _kept(raw: Any) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(body, dict):
        return {}
    kept = {k: body[k] for k in KEPT_FIELDS if k in body}
    payload = body.get("payload")
    if isinstance(payload, dict) and "why" in payload:
        kept["why"] = payload["why"]
    return kept


def naming_rows(scope: NodeScope, delivery_id: str, at: datetime) -> list[dict[str, Any]]:
    """This node's rows whose body names ``delivery_id`` as its ``delivery_id`` (accepted, routed, skipped)."""
    q = Where.of(scope)
    q.history(at, scope)
    kinds = marks(NAMING_TYPES)
    q.add(f"(type IN ({kinds}) OR category = %s)", *NAMING_TYPES, ACCEPTED_CATEGORY)
    q.add("body LIKE %s ESCAPE '\\'", f'%"delivery_id":{_like(delivery_id)}%')
    # LIKE is case-blind on SQLite and the pattern could match inside a payload: the field itself decides.
    return [r for r in _rows(scope, q) if r["body"].get("delivery_id") == delivery_id]


def following_rows(scope: NodeScope, trigger_ids: Sequence[str], at: datetime) -> list[dict[str, Any]]:
    """This node's rows that took one of ``trigger_ids``: a digest that merged it, a turn or a skip that took it."""
    if not trigger_ids:
        return []
    q = Where.of(scope)
    q.history(at, scope)
    q.add(f"type IN ({marks(FOLLOWING_TYPES)})", *FOLLOWING_TYPES)
    q.add("(" + " OR ".join(["body LIKE %s ESCAPE '\\'"] * len(trigger_ids)) + ")", *(f"%{_like(t)}%" for t in trigger_ids))
    wanted = set(trigger_ids)
    return [r for r in _rows(scope, q) if _takes(r) & wanted]


def _takes(row: dict[str, Any]) -> set[str]:
    """The trigger ids a following row took."""
    body = row.get("body") or {}
    if row["type"] == COALESCED:
        return {str(i) for i in body.get("event_ids") or ()}
    trigger = body.get("original_id") if row["type"] == RETRY else body.get("trigger_event_id")
    return {str(trigger)} if trigger else set()


def answer_delivery(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """This node's part: ``keys`` empty, the rows naming the delivery ``key``; else the rows following ``keys``."""
    if question.keys:
        return {"rows": following_rows(scope, list(question.keys), at)}
    return {"rows": naming_rows(scope, question.key, at)}


def wake_ids(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The wakes the delivery became, oldest first."""
    return [r["id"] for r in rows if r["type"] == WAKE]


def merged_ids(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The merged triggers the digests among ``rows`` made (each a turn's trigger once worked)."""
    return [coalesced_trigger_id([str(i) for i in r["body"].get("event_ids") or ()]) for r in rows if r["type"] == COALESCED]


def turn_ids(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["turn_id"] for r in rows if r["type"] == TURN_STARTED and r["turn_id"]))


def _event(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("ts_us", "body")}


def _turn_brief(turn: dict[str, Any]) -> dict[str, Any]:
    """The folded turn without its events (the delivery's own ``events`` hold the rows that matter here)."""
    return {k: v for k, v in turn.items() if k not in ("events", "truncated")}


def held_by(live: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """What holds a seat's inbox back, from its live row (the projection's): a pause, a budget stop, no provider, a turn."""
    if not live:
        return None
    state, reason = live.get("state", ""), live.get("reason", "")
    if state == "paused":
        return {"kind": HELD_PAUSE, "reason": reason, "by": live.get("paused_by", "")}
    if state == "stopped" and reason == "budget":
        return {"kind": HELD_BUDGET, "reason": reason, "by": ""}
    if state == "held":
        return {"kind": HELD_NO_PROVIDER if reason == "no_provider" else reason, "reason": reason, "by": ""}
    if live.get("turn_id"):
        return {"kind": HELD_TURN, "reason": "", "by": live["turn_id"]}
    return None


def _retry(row: dict[str, Any]) -> dict[str, Any]:
    """A failed delivery's wait for the broker to offer it again: which delivery it spent, of how many, and when."""
    body = row["body"]
    return {
        "event_id": row["id"],
        "delivery": body.get("delivery", 0),
        "max_deliveries": body.get("max_deliveries", 0),
        "retry_at": body.get("retry_at", ""),
    }


def _seat_path(
    wake: dict[str, Any],
    following: Sequence[dict[str, Any]],
    turns: dict[str, Any],
    live: dict[str, dict[str, Any]],
    dead: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """One seat's path for the delivery: its wake, the digest that merged it, what took it, where it is now."""
    seat = wake["seat"]
    triggers = {wake["id"]}
    coalesced = None
    for row in following:
        if row["type"] == COALESCED and wake["id"] in _takes(row):
            ids = [str(i) for i in row["body"].get("event_ids") or ()]
            merged = coalesced_trigger_id(ids)
            triggers.add(merged)
            coalesced = {"event_id": row["id"], "timestamp": row["timestamp"], "trigger_event_id": merged, "event_ids": ids, "count": len(ids)}
    took = [r for r in following if r["type"] != COALESCED and _takes(r) & triggers and (not r["seat"] or r["seat"] == seat)]
    path: dict[str, Any] = {
        "seat": seat,
        "wake_event_id": wake["id"],
        "routed_at": wake["timestamp"],
        "node": wake["node"],
        "why": wake["body"].get("why", ""),
        "coalesced": coalesced,
        "turn": None,
        "skip": None,
        "waiting": None,
        "dead_letter": None,
    }
    starts = [r for r in took if r["type"] == TURN_STARTED]
    letter = dead.get(wake["id"]) or (dead.get(coalesced["trigger_event_id"]) if coalesced else None)
    if starts:  # the latest attempt, whatever became of it since
        turn_id = starts[-1]["turn_id"]
        turn = turns.get(turn_id) or {"turn_id": turn_id, "seat": seat, "outcome": OUTCOME_RUNNING}
        path["turn"] = _turn_brief(turn)
    latest = next((r for r in reversed(took) if r["type"] in (TURN_STARTED, TRIGGER_SKIPPED, RETRY)), None)
    if letter is not None:  # on the dead-letter stream now, whatever its attempts did
        path["dead_letter"] = letter
        path["state"] = DEAD_LETTERED
    elif latest is not None and latest["type"] == TRIGGER_SKIPPED:
        body = latest["body"]
        path["skip"] = {"event_id": latest["id"], "reason": body.get("reason", ""), "detail": body.get("detail", "")}
        path["state"] = SKIPPED
    elif latest is not None and latest["type"] == TURN_STARTED:
        path["state"] = RUNNING if path["turn"].get("outcome") == OUTCOME_RUNNING else WORKED
    elif latest is None and coalesced is not None:
        path["state"] = COALESCED_STATE
    else:  # never taken yet, or handed back after a failure to come again
        path["state"] = WAITING
        seat_live = live.get(seat) or {}
        path["waiting"] = {
            "seat_state": seat_live.get("state", ""),
            "held_by": held_by(seat_live),
            "behind_turn": seat_live.get("turn_id") or None,
            "position": (seat_live.get("positions") or {}).get(wake["id"]),
            "queued": seat_live.get("queued"),
            "retry": _retry(latest) if latest is not None else None,
        }
    return path


def fold_delivery(
    delivery_id: str,
    naming: Sequence[dict[str, Any]],
    following: Sequence[dict[str, Any]],
    turns: dict[str, Any],
    live: Optional[dict[str, dict[str, Any]]] = None,
    dead: Optional[dict[str, dict[str, Any]]] = None,
) -> Optional[dict[str, Any]]:
    """Where ``delivery_id`` is now, from the rows in (timestamp, id) order; None when no row names it.

    ``turns`` are the turns the following rows started (folded, by id);
    ``live`` each seat's live row (its state, ``paused_by``, running
    ``turn_id``, ``queued`` and ``positions``: wake id -> 1-based place among
    the waiting); ``dead`` the dead letters by the event id they hold.
    """
    if not naming:
        return None
    live, dead = live or {}, dead or {}
    accepted = next((r for r in naming if r["category"] == ACCEPTED_CATEGORY), None)
    wakes = [r for r in naming if r["type"] == WAKE]
    skipped = [
        {
            "event_id": r["id"],
            "timestamp": r["timestamp"],
            "seat": r["body"].get("seat", ""),
            "recipient": r["body"].get("recipient", ""),
            "reason": r["body"].get("reason", ""),
            "detail": r["body"].get("detail", ""),
        }
        for r in naming
        if r["type"] == NOTIFICATION_SKIPPED
    ]
    seats = [_seat_path(w, following, turns, live, dead) for w in wakes]
    states = {p["state"] for p in seats} or ({SKIPPED} if skipped else {ACCEPTED})
    state = next(s for s in STATE_ORDER if s in states)
    head = accepted or naming[0]
    return {
        "delivery_id": delivery_id,
        "state": state,
        "source": head["source"],
        "event_name": head["body"].get("event_name", ""),
        "trace_id": head["trace_id"],
        "accepted": {"event_id": accepted["id"], "timestamp": accepted["timestamp"], "node": accepted["node"]} if accepted else None,
        "seats": seats,
        "skipped": skipped,
        "events": [_event(r) for r in sorted([*naming, *following], key=lambda r: (r["ts_us"], r["id"]))],
    }
