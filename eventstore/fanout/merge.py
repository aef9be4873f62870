"""What the asker does with every node's part: one plan per question, merged exactly.

A plan is a generator: it yields the question each round scatters, receives
the answering nodes' parts ``[(node, answer), ...]`` (the asker's own first),
and returns the merged answer. Most reads are one round; a page of turns is
two (every node's page, then every node's share of exactly the turns listed)
and the live projection's seed four. The runner (:mod:`.service`) adds the
coverage and the instant.

The merges are the design's:

* A page is merged on (timestamp, id) and stops at the newest point any
  node's page stopped at, so walking the cursor visits every row once across
  nodes, rows sharing a microsecond included. A row two nodes hold (a custody
  batch briefly on two stores) reaches a plan once (:mod:`.kept`), and a
  listing holds a row once by its id besides.
* A series' bars are summed bar by bar (every node cut the same window at the
  asker's instant); the asker drops a partial first bar only after that.
* A trace's rows from every node hang in one tree.
* A turn is folded from every node's half of it, and a page of turns lists it
  where the earliest of its listed starts puts it, on any node.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Generator, Iterable, Optional

from crewlet.events import parse_timestamp
from eventstore import questions as qs
from eventstore.questions import Filters, Question

Part = tuple[str, dict[str, Any]]
Parts = list[Part]
Plan = Generator[Question, Parts, dict[str, Any]]


#: A listing row's place in (timestamp, id) order: the wire's timestamps are fixed width, so text order is time
#: order. An itemgetter, not a function: a page's merge asks it twice a row.
_position: Callable[[dict[str, Any]], tuple[str, str]] = itemgetter("timestamp", "id")


def merge_pages(pages: Iterable[dict[str, Any]], limit: int) -> dict[str, Any]:
    """Events pages (newest first, ``next_cursor`` when a node holds more) merged into one page of ``limit`` rows."""
    pages = list(pages)
    cut: Optional[tuple[str, str]] = None
    for page in pages:
        if page.get("next_cursor") and page["events"]:
            stop = _position(page["events"][-1])
            cut = stop if cut is None or stop > cut else cut
    rows: dict[str, dict[str, Any]] = {}
    for page in pages:
        for row in page["events"]:
            if cut is None or _position(row) >= cut:
                rows.setdefault(row["id"], row)
    ordered = sorted(rows.values(), key=_position, reverse=True)
    taken = ordered[:limit]
    next_cursor = None
    if taken and (len(ordered) > limit or cut is not None):
        last = taken[-1]
        next_cursor = qs.encode_cursor(qs.EVENTS_CURSOR, qs.to_us(parse_timestamp(last["timestamp"])), last["id"])
    return {"events": taken, "next_cursor": next_cursor}


def events_plan(question: Question) -> Plan:
    parts = yield question
    return merge_pages((answer for _, answer in parts), max(1, min(int(question.limit), qs.MAX_LIMIT)))


def event_plan(question: Question) -> Plan:
    parts = yield question
    found = [answer["event"] for _, answer in parts if answer.get("event")]
    return {"event": found[0] if found else None}


def series_plan(question: Question) -> Plan:
    """Bars summed by their start: the axis is the first answering node's (the asker's own when it answered)."""
    parts = yield question
    if not parts:
        return {"bars": [], "window_us": question.window_us, "bucket_us": question.bucket_us}
    merged = {**parts[0][1], "bars": [dict(bar, by_category=dict(bar["by_category"])) for bar in parts[0][1]["bars"]]}
    axis = {bar["start"]: bar for bar in merged["bars"]}
    for _, answer in parts[1:]:
        for bar in answer["bars"]:
            mine = axis.get(bar["start"])
            if mine is None:
                continue
            mine["total"] += int(bar["total"])
            mine["failed"] += int(bar["failed"])
            for category, count in bar["by_category"].items():
                mine["by_category"][category] = mine["by_category"].get(category, 0) + int(count)
    return merged


def _rows_in_order(groups: Iterable[Iterable[dict[str, Any]]], key: str = "") -> list[dict[str, Any]]:
    """Rows from every node, each once by id, in (timestamp, id) order (``key`` names a microsecond field)."""
    rows: dict[str, dict[str, Any]] = {}
    for group in groups:
        for row in group:
            rows.setdefault(row["id"], row)
    order = (lambda r: (r[key], r["id"])) if key else _position
    return sorted(rows.values(), key=order)


def trace_plan(question: Question) -> Plan:
    parts = yield question
    rows = _rows_in_order(answer["rows"] for _, answer in parts)
    return qs.trace_answer(question.key, rows, any(answer["truncated"] for _, answer in parts))


def _turn_shares(parts: Parts, key: str) -> dict[str, tuple[list[dict[str, Any]], bool, Optional[int]]]:
    """Each turn's rows from every node (ordered by ``key``, then id), whether any node cut them, its earliest listed start."""
    grouped: dict[str, list[list[dict[str, Any]]]] = {}
    truncated: dict[str, bool] = {}
    listed: dict[str, Optional[int]] = {}
    for _, answer in parts:
        for turn_id, share in answer["turns"].items():
            grouped.setdefault(turn_id, []).append(share["rows"])
            truncated[turn_id] = truncated.get(turn_id, False) or bool(share.get("truncated"))
            at, earliest = share.get("listed_us"), listed.get(turn_id)
            if at is not None and (earliest is None or int(at) < earliest):
                listed[turn_id] = int(at)
            else:
                listed.setdefault(turn_id, None)
    return {t: (_rows_in_order(g, key), truncated[t], listed[t]) for t, g in grouped.items()}


def turn_details(question: Question, turn_ids: Iterable[str]) -> Plan:
    """Exactly these turns, each with its events, folded from every node's half (a sub-plan)."""
    ids = tuple(dict.fromkeys(turn_ids))
    if not ids:
        return {}
    parts = yield Question(kind=qs.TURN_ROWS, at=question.at, version=question.version, keys=ids, detail=True)
    turns: dict[str, Any] = {}
    for turn_id, (rows, truncated, _) in _turn_shares(parts, "ts_us").items():
        if len(rows) > qs.MAX_DETAIL_ROWS:
            rows, truncated = rows[: qs.MAX_DETAIL_ROWS], True
        turns[turn_id] = qs.fold_detail(turn_id, rows, truncated)
    return turns


def turn_plan(question: Question) -> Plan:
    turns = yield from turn_details(question, [question.key])
    return {"turn": turns.get(question.key)}


def turns_plan(question: Question) -> Plan:
    """Two scatters: every node's page of turns, then every node's share of exactly the turns it could list.

    Each node lists a turn where its own share starts; the fleet lists it at
    the earliest of those. The page stops at the newest point any node's page
    stopped at (``cut``): every turn a node listed at or above it is a
    candidate, the second round says where each truly starts, and a turn
    whose earliest start lies below the cut is left to the page that reaches it.
    """
    limit = max(1, min(int(question.limit), qs.MAX_LIMIT))
    pages = yield question
    cut: Optional[tuple[int, str]] = None
    for _, page in pages:
        if page["more"] and page["turns"]:
            turn_id, started = page["turns"][-1]
            last = (int(started), turn_id)
            cut = last if cut is None or last > cut else cut
    candidates = [
        turn_id for _, page in pages for turn_id, started in page["turns"] if cut is None or (int(started), turn_id) >= cut
    ]
    if not candidates:
        return {"turns": [], "next_cursor": qs.encode_cursor(qs.TURNS_CURSOR, cut[0], cut[1]) if cut is not None else None}
    parts = yield Question(
        kind=qs.TURN_ROWS, at=question.at, version=question.version, filters=question.filters, keys=tuple(dict.fromkeys(candidates))
    )
    shares = _turn_shares(parts, "timestamp")
    placed = sorted(
        ((listed, turn_id) for turn_id, (_, _, listed) in shares.items() if listed is not None and (cut is None or (listed, turn_id) >= cut)),
        reverse=True,
    )
    taken = placed[:limit]
    grouped = {turn_id: [qs.fold_unwire(r) for r in shares[turn_id][0]] for _, turn_id in taken}
    # The next page starts below the last turn listed here, or below the cut when every turn at or above it is
    # listed (a page can come back short, even empty: a turn it could have listed starts below the cut on another node).
    below: Optional[tuple[int, str]] = taken[-1] if len(placed) > limit else cut
    next_cursor = qs.encode_cursor(qs.TURNS_CURSOR, below[0], below[1]) if below is not None else None
    return {"turns": qs.fold_listed([(t, s) for s, t in taken], grouped), "next_cursor": next_cursor}


def seed_plan(at: Any, handles: Iterable[str], *, feed_size: int, window_us: int) -> Plan:
    """The live projection's seed: the company's feed, each seat's newest turn (whole), and the counters' window."""
    feed_parts = yield Question(kind=qs.EVENTS, at=at, filters=Filters(feed_only=True), limit=feed_size)
    feed = merge_pages((a for _, a in feed_parts), feed_size)["events"]
    seats = tuple(handles)
    newest: dict[str, tuple[int, str]] = {}
    if seats:
        last_parts = yield Question(kind=qs.LAST_TURNS, at=at, keys=seats)
        for _, answer in last_parts:
            for handle, (turn_id, started) in answer["seats"].items():
                mark = (int(started), turn_id)
                if handle not in newest or mark > newest[handle]:
                    newest[handle] = mark
    turns = yield from turn_details(Question(kind=qs.TURN_ROWS, at=at), [t for _, t in newest.values()])
    count_parts = yield Question(kind=qs.COUNTS, at=at, window_us=window_us)
    counters: dict[str, int] = {}
    per_seat: dict[str, dict[str, int]] = {}
    for _, answer in count_parts:
        for name, value in answer["counters"].items():
            counters[name] = counters.get(name, 0) + int(value)
        for handle, counts in answer["per_seat"].items():
            mine = per_seat.setdefault(handle, {})
            for name, value in counts.items():
                mine[name] = mine.get(name, 0) + int(value)
    last = {handle: turns[turn_id] for handle, (_, turn_id) in newest.items() if turns.get(turn_id) is not None}
    return {"feed": feed, "turns": last, "counters": counters, "per_seat": per_seat}


def model_spend_plan(question: Question) -> Plan:
    """Every node's sums of its phases' rounds, added up by model and day (as the counters are)."""
    parts = yield question
    return qs.merge_model_spend(answer for _, answer in parts)


def delivery_plan(question: Question) -> Plan:
    """The rows naming the delivery, then (twice at most: the wakes, then the digests' merged triggers) the rows
    taking what it became, then the turns those started; the parts' ``rows``, ``following`` and ``turns``.

    The live facts and the dead letters are the asker's to add (:func:`eventstore.api.delivery`), so the fold
    happens there; this returns what every node's store holds.
    """
    at, version = question.at, question.version
    parts = yield Question(kind=qs.DELIVERY, at=at, version=version, key=question.key)
    naming = _rows_in_order((answer["rows"] for _, answer in parts), "ts_us")
    following: list[dict[str, Any]] = []
    asked: set[str] = set()
    triggers = qs.wake_ids(naming)
    for _ in range(2):
        fresh = tuple(t for t in dict.fromkeys(triggers) if t not in asked)
        if not fresh:
            break
        asked.update(fresh)
        parts = yield Question(kind=qs.DELIVERY, at=at, version=version, key=question.key, keys=fresh)
        found = _rows_in_order((answer["rows"] for _, answer in parts), "ts_us")
        following = _rows_in_order([following, found], "ts_us")
        triggers = qs.merged_ids(found)
    turns = yield from turn_details(question, qs.turn_ids(following))
    return {"rows": naming, "following": following, "turns": turns}


_PLANS = {
    qs.EVENTS: events_plan,
    qs.EVENT: event_plan,
    qs.EVENT_SERIES: series_plan,
    qs.TRACE: trace_plan,
    qs.TURN: turn_plan,
    qs.TURNS: turns_plan,
    qs.MODEL_SPEND: model_spend_plan,
    qs.DELIVERY: delivery_plan,
}


def plan_for(question: Question) -> Plan:
    """The plan that answers ``question`` across the fleet; BadQuestion for a kind no read asks."""
    make = _PLANS.get(question.kind)
    if make is None:
        raise qs.BadQuestion(f"unknown question kind {question.kind!r}")
    return make(question)


__all__ = ["Part", "Parts", "Plan", "merge_pages", "plan_for", "seed_plan", "turn_details"]
