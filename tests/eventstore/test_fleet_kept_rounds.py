"""The kept round driven by hand: which node is asked for which named row, as pure functions (no broker, no store).

The same round over two real stores and a broker is tests/eventstore/test_fleet_kept.py.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from eventstore import questions as qs
from eventstore.fanout import FleetReads
from eventstore.fanout.kept import Exchange, kept_round, keepers
from eventstore.questions import NodeScope, Question
from eventstore_support import AT, NODE, make_event, store


def test_a_row_a_node_keeps_without_naming_it_was_counted_and_is_asked_of_nobody() -> None:
    assert keepers(["x"], {"b": {"x"}}, {"a": {"x"}, "b": set()}) == {}


def test_a_row_named_on_two_nodes_is_asked_of_the_lowest_node_id() -> None:
    assert keepers(["x", "y"], {"b": {"x", "y"}, "a": {"x"}}, {"a": set(), "b": set()}) == {"a": ("x",), "b": ("y",)}


def test_a_row_its_keeper_named_and_settled_since_is_asked_of_its_keeper_which_will_not_drop_it() -> None:
    # b named x and has settled it since (not counted in its part); a, also naming it, will drop it.
    assert keepers(["x"], {"a": {"x"}, "b": {"x"}}, {"a": set(), "b": {"x"}}) == {"b": ("x",)}


def test_a_row_named_on_two_nodes_is_asked_of_the_node_whose_claim_names_its_batch_not_the_lowest_id() -> None:
    # a's settle pass may drop its copy between the two questions; b, the claim's keeper, will not.
    assert keepers(["x"], {"a": {"x"}, "b": {"x"}}, {"a": set(), "b": set()}, {"b": {"x"}}) == {"b": ("x",)}


def _step(exchange: Exchange, replies: list[dict[str, Any]]) -> Any:
    try:
        return exchange.send(replies)
    except StopIteration as done:
        return done.value


def test_a_node_failing_its_restricted_question_is_named_and_its_part_left_out_whole() -> None:
    noted: dict[str, str] = {}
    asked: list[int] = []
    question = Question(kind=qs.EVENTS, at=AT)
    exchange = kept_round(question, ["a", "b"], noted.__setitem__, asked.append)
    [(first, nodes)] = next(exchange)
    assert (first, nodes) == (question, ("a", "b"))
    page = {"events": [], "next_cursor": None}
    [(kept, nodes)] = _step(exchange, [{"a": ({**page, qs.K_UNSETTLED: ["x"]}, ""), "b": ({**page, qs.K_UNSETTLED: ["x", "y"]}, "")}])
    assert (kept.kind, kept.keys, nodes, asked) == (qs.KEPT, ("x", "y"), ("a", "b"), [2])
    asks = _step(exchange, [{"a": ({qs.K_KEPT: []}, ""), "b": ({qs.K_KEPT: []}, "")}])
    assert [(q.only, to) for q, to in asks] == [(("x",), ("a",)), (("y",), ("b",))]
    parts = _step(exchange, [{"a": (page, "")}, {"b": (None, "read failed: OperationalError")}])
    assert parts == [("a", page), ("a", page)]
    assert noted == {"a": "", "b": "read failed: OperationalError"}


def test_a_round_in_which_no_node_names_a_row_asks_nothing_more() -> None:
    asked: list[int] = []
    exchange = kept_round(Question(kind=qs.COUNTS, at=AT), ["a"], lambda node, error: None, asked.append)
    next(exchange)
    part = {"counters": {}, "per_seat": {}}
    assert _step(exchange, [{"a": (part, "")}]) == [("a", part)] and asked == []


@pytest.mark.django_db(databases=["default", "events"])
def test_a_store_alone_reads_its_unsettled_rows_once_on_either_database() -> None:
    events = store(*[make_event("org_started", AT - i * timedelta(seconds=1), event_id=f"r-{i}") for i in range(6)])
    with connections["events"].cursor() as cursor:
        cursor.execute("UPDATE eventstore_event SET custody_batch = %s WHERE id IN (%s, %s, %s)", ["batch-1", "r-0", "r-3", "r-5"])
    reads = FleetReads(NodeScope(NODE), roster=lambda: [NODE])
    walked, cursor = [], ""
    while True:
        page = reads.ask(Question(kind=qs.EVENTS, at=AT, limit=4, cursor=cursor))
        walked += [row["id"] for row in page["events"]]
        cursor = page["next_cursor"] or ""
        if not cursor:
            break
    assert walked == [e.id for e in events] and reads.kept_asked == 2
    bars = reads.ask(Question(kind=qs.EVENT_SERIES, at=AT, window_us=qs.parse_duration("1h"), bucket_us=qs.parse_duration("1h")))
    assert sum(bar["total"] for bar in bars["bars"]) == 6 and reads.kept_asked == 3
    assert reads.ask(Question(kind=qs.EVENT, at=AT, key="r-3"))["event"]["id"] == "r-3"
    assert reads.ask(Question(kind=qs.EVENT, at=AT, key="r-4"))["event"]["id"] == "r-4" and reads.kept_asked == 4
