"""The fleet read's merges and its reply cut, as pure functions: no broker, no store.

The same merges run on a real broker over three PostgreSQL stores in
tests/fleet/test_fleet_reads.py; here each rule is held on its own, fast, on any
database.
"""
from __future__ import annotations

from typing import Any

import orjson

from crewlet.events import parse_timestamp
from eventstore import questions as qs
from eventstore.fanout import merge, wire
from eventstore.questions import Question
from eventstore_support import AT

STEP = 1_000_000


def _row(us: int, eid: str, node: str) -> dict[str, Any]:
    return {"id": eid, "timestamp": qs.format_us(us), "node": node, "span_id": "s", "parent_span_id": "", "summary": "x" * 200}


def _page(rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """One node's answer to a page: its newest ``limit`` rows, and a cursor when it holds more."""
    ordered = sorted(rows, key=lambda r: (r["timestamp"], r["id"]), reverse=True)
    page = ordered[:limit]
    more = len(ordered) > limit
    last = page[-1] if page else None
    cursor = qs.encode_cursor("e", qs.to_us(parse_timestamp(last["timestamp"])), last["id"]) if more and last else None
    return {"events": page, "next_cursor": cursor}


def _below(rows: list[dict[str, Any]], cursor: str) -> list[dict[str, Any]]:
    ts, key = qs.decode_cursor("e", cursor)
    stop = (qs.format_us(qs.to_us(ts)), key)
    return [r for r in rows if (r["timestamp"], r["id"]) < stop]


def test_merged_pages_walk_every_row_of_every_node_once_in_order_rows_sharing_a_microsecond_included() -> None:
    base = qs.to_us(AT) - 1000 * STEP
    stores = {
        "a": [_row(base + i * 3 * STEP, f"a{i:02d}", "a") for i in range(20)] + [_row(base + 30 * STEP, "a-same", "a")],
        "b": [_row(base + i * 5 * STEP, f"b{i:02d}", "b") for i in range(11)] + [_row(base + 30 * STEP, "b-same", "b")],
        "c": [_row(base + 30 * STEP, f"c-same-{i}", "c") for i in range(4)],
    }
    everything = sorted((r for rows in stores.values() for r in rows), key=lambda r: (r["timestamp"], r["id"]), reverse=True)
    seen: list[str] = []
    cursor = ""
    while True:
        pages = [_page(_below(rows, cursor) if cursor else rows, 7) for rows in stores.values()]
        merged = merge.merge_pages(pages, 7)
        assert len(merged["events"]) <= 7
        seen += [r["id"] for r in merged["events"]]
        cursor = merged["next_cursor"] or ""
        if not cursor:
            break
    assert seen == [r["id"] for r in everything]


def test_a_row_two_stores_hold_is_listed_once() -> None:
    row = _row(qs.to_us(AT) - STEP, "custody", "a")
    merged = merge.merge_pages([{"events": [row], "next_cursor": None}, {"events": [dict(row)], "next_cursor": None}], 10)
    assert [r["id"] for r in merged["events"]] == ["custody"] and merged["next_cursor"] is None


def test_a_trace_reply_over_the_limit_gives_up_its_middle_and_keeps_its_beginning_and_ending() -> None:
    rows = [_row(qs.to_us(AT) - (100 - i) * STEP, f"r{i:03d}", "a") for i in range(100)]
    whole = len(wire.encode_reply(1, "a", answer={"rows": rows, "truncated": False}))
    reply = wire.decode_reply(wire.fit(qs.TRACE, 1, "a", {"rows": rows, "truncated": False}, whole // 3))
    assert reply is not None and reply.answer is not None
    kept = [r["id"] for r in reply.answer["rows"]]
    assert reply.answer["truncated"] is True and 1 < len(kept) < 100
    assert kept[0] == "r000" and kept[-1] == "r099" and kept == sorted(kept)


def test_a_page_reply_over_the_limit_gives_up_its_oldest_rows_and_its_cursor_stops_above_them() -> None:
    rows = sorted((_row(qs.to_us(AT) - i * STEP, f"r{i:03d}", "a") for i in range(100)), key=lambda r: r["timestamp"], reverse=True)
    answer = {"events": rows, "next_cursor": None}
    limit = len(wire.encode_reply(1, "a", answer=answer)) // 4
    data = wire.fit(qs.EVENTS, 1, "a", answer, limit)
    cut = orjson.loads(data)["answer"]
    assert len(data) <= limit and cut["events"] == rows[: len(cut["events"])]
    ts, key = qs.decode_cursor("e", cut["next_cursor"])
    assert (qs.format_us(qs.to_us(ts)), key) == (cut["events"][-1]["timestamp"], cut["events"][-1]["id"])


def _drive(plan: merge.Plan, *rounds: list[tuple[str, dict[str, Any]]]) -> tuple[list[Question], dict[str, Any]]:
    asked = [next(plan)]
    for parts in rounds:
        try:
            asked.append(plan.send(parts))
        except StopIteration as done:
            return asked, done.value
    raise AssertionError("the plan asked more rounds than it was given")


def test_a_turn_whose_earliest_start_is_below_the_pages_cut_is_left_to_the_page_that_reaches_it() -> None:
    question = Question(kind=qs.TURNS, at=AT, limit=1)
    pages = [
        ("a", {"turns": [["t-a", 20]], "more": True}),  # a also holds t-split's first half, at 0
        ("b", {"turns": [["t-split", 100]], "more": True}),
        ("c", {"turns": [["t-c", 200]], "more": True}),
    ]
    rows = [("a", {"turns": {"t-c": {"rows": [], "listed_us": 200}}})]
    asked, answer = _drive(merge.turns_plan(question), pages, rows)
    assert asked[1].kind == qs.TURN_ROWS and asked[1].keys == ("t-c",)
    assert [t["turn_id"] for t in answer["turns"]] == ["t-c"]
    # Page two: b lists t-split at 100, but a says it starts at 0 — below this page's cut (a's stop at 20).
    pages = [("a", {"turns": [["t-a", 20]], "more": True}), ("b", {"turns": [["t-split", 100]], "more": False}),
             ("c", {"turns": [], "more": False})]
    rows = [("a", {"turns": {"t-split": {"rows": [], "listed_us": 0}, "t-a": {"rows": [], "listed_us": 20}}}),
            ("b", {"turns": {"t-split": {"rows": [], "listed_us": 100}}})]
    _, answer = _drive(merge.turns_plan(Question(kind=qs.TURNS, at=AT, limit=1, cursor=answer["next_cursor"])), pages, rows)
    assert [t["turn_id"] for t in answer["turns"]] == ["t-a"]
    assert qs.decode_cursor("t", answer["next_cursor"])[1] == "t-a"  # t-split comes on the page that reaches 0
