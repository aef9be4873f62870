"""Reading the live projection's seed: the store's (or the fleet's) feed, each seat's newest turn, the pauses, the counters.

A restarted node seeds its projection so its screens show the company rather
than an empty page (:meth:`eventstore.projection.model.LiveProjection.seed`
applies what is read here). Every read is one of the store's own questions at
one instant: this node's store alone (:func:`read_seed`, run in a worker
thread), or the fleet's through one fleet read (:func:`fleet_seed`, the plan
:func:`eventstore.fanout.seed_plan`). Nothing here holds the projection's
state, so the readers can be asked without a projection at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Optional

from crewlet.engine.interfaces import SeatLoops
from crewlet.company.org import Organization
from eventstore import here
from eventstore import questions as qs
from eventstore.fanout import FleetReads, seed_plan
from eventstore.projection.states import (
    BUDGET_EXHAUSTED,
    COUNTER_WINDOW,
    FEED_SIZE,
    LLM_UNAVAILABLE,
    STOPPED_BUDGET,
    STOPPED_PROVIDER,
)
from eventstore.questions import (
    COUNTER_KEYS,
    TURN_COMPLETED,
    TURN_STARTED,
    TURN_STOPPED,
    count_rows,
    new_seat_counters,
)


@dataclass
class SeedTurn:
    """A seat's newest turn as the seed read it: its last-turn row, the turn still running, why it stopped, its counters.

    ``trigger`` is the wake the running turn took: its record can still be on
    its way, and must not be counted as waiting behind the turn that took it.
    """

    last_turn: dict[str, Any]
    running: str
    stopped: str
    counters: dict[str, int]
    trigger: str = ""


@dataclass
class SeedData:
    """Everything one seed read, at one instant: the feed, each seat's newest turn, the pauses and the counters."""

    feed: list[dict[str, Any]]
    turns: dict[str, SeedTurn]
    pauses: dict[str, dict[str, Any]]
    counters: dict[str, int]
    #: The coding runs holding each seat that has one (from the coordination store, through ``seats``).
    runs: dict[str, tuple[str, ...]] = field(default_factory=dict)


def seat_holders() -> dict[str, str]:
    """Which node holds each seat's lease right now (the fleet's roster of who runs what)."""
    from crewlet.fleet.leases import SEAT, holders

    return holders(SEAT)


def read_seed(org: Organization, scope: Optional[qs.NodeScope], at: datetime, seats: Optional[SeatLoops] = None) -> SeedData:
    """Every read a seed makes, asked as the store's own questions at one instant (the pauses through ``seats``)."""
    from django.db import connections

    scope = scope or here.node_scope()
    try:
        feed = qs.answer(qs.Question(kind=qs.EVENTS, at=at, filters=qs.Filters(feed_only=True), limit=FEED_SIZE), scope)
        turns: dict[str, SeedTurn] = {}
        handles = [s.handle for s in org.agent_seats()]
        for handle in handles:
            turn = _latest_turn(handle, scope, at)
            if turn is not None:
                turns[handle] = turn
        pauses = _pauses(handles, seats)
        counters, per_seat = count_rows(scope, at - COUNTER_WINDOW, at)
        for handle, turn in turns.items():
            turn.counters = per_seat.get(handle, turn.counters)
        runs = seats.run_holds(handles) if seats is not None else {}
        return SeedData(feed=feed["events"], turns=turns, pauses=pauses, counters=counters, runs=runs)
    finally:
        connections[scope.using].close()


def _latest_turn(handle: str, scope: qs.NodeScope, at: datetime) -> Optional[SeedTurn]:
    page = qs.answer(qs.Question(kind=qs.TURNS, at=at, filters=qs.Filters(seat=handle), limit=1), scope)["turns"]
    if not page:
        return None
    turn = qs.answer(qs.Question(kind=qs.TURN, at=at, key=page[0]["turn_id"]), scope)["turn"]
    return _seed_turn(turn) if turn is not None else None


def _seed_turn(turn: dict[str, Any]) -> SeedTurn:
    """A seat's newest turn (folded, with its events) as the seed holds it."""
    rows = turn["events"]
    outcome = turn["outcome"]
    # The row that says how it ended (or that it began), newest first.
    closing = next(
        (r for r in reversed(rows) if r["type"] in (TURN_COMPLETED, TURN_STOPPED, LLM_UNAVAILABLE, BUDGET_EXHAUSTED, TURN_STARTED)),
        rows[-1] if rows else None,
    )
    stopped = ""
    if outcome == qs.OUTCOME_FAILED:
        types = {r["type"] for r in rows}
        stopped = STOPPED_BUDGET if BUDGET_EXHAUSTED in types else STOPPED_PROVIDER if LLM_UNAVAILABLE in types else ""
    return SeedTurn(
        last_turn={
            "turn_id": turn["turn_id"],
            "outcome": outcome,
            "timestamp": turn["ended"] or turn["started"] or (closing["timestamp"] if closing else None),
            "summary": closing["summary"] if closing else "",
            "trace_id": turn["trace_id"],
        },
        running=turn["turn_id"] if outcome == qs.OUTCOME_RUNNING else "",
        stopped=stopped,
        counters=new_seat_counters(),
        trigger=str((turn.get("trigger") or {}).get("event_id") or "") if outcome == qs.OUTCOME_RUNNING else "",
    )


def _pauses(handles: list[str], seats: Optional[SeatLoops]) -> dict[str, dict[str, Any]]:
    return {
        handle: {"paused": row.paused, "reason": row.reason, "paused_by": row.paused_by}
        for handle, row in (seats.pause_rows(handles) if seats is not None else {}).items()
    }


async def fleet_seed(fleet: FleetReads, org: Organization, at: datetime, seats: Optional[SeatLoops], feed_size: int) -> SeedData:
    """The seed as one fleet read (``eventstore.fanout.seed_plan``), the pauses from the coordination store."""
    from asgiref.sync import sync_to_async

    handles = [s.handle for s in org.agent_seats()]
    window_us = COUNTER_WINDOW // timedelta(microseconds=1)
    answer = await fleet.arun(seed_plan(at, handles, feed_size=feed_size, window_us=window_us), at, "seed")
    turns = {handle: _seed_turn(turn) for handle, turn in answer["turns"].items()}
    for handle, turn in turns.items():
        turn.counters = {**turn.counters, **answer["per_seat"].get(handle, {})}
    counters = {name: int(answer["counters"].get(name, 0)) for name in COUNTER_KEYS}
    pauses = await sync_to_async(_pauses, thread_sensitive=True)(handles, seats)
    runs = await sync_to_async(seats.run_holds, thread_sensitive=True)(handles) if seats is not None else {}
    return SeedData(feed=answer["feed"], turns=turns, pauses=pauses, counters=counters, runs=runs)


__all__ = ["SeedData", "SeedTurn", "fleet_seed", "read_seed", "seat_holders"]
