"""Rows a custody batch holds on two stores for a moment are held once in every fleet merge and every count.

A stateless node's rows sit, for a moment, on two data nodes: unsettled on
both (a second keeper wrote a batch whose first claim failed), settled on one
and not yet dropped by the other, or unsettled on one alone. Here the same
company history is spread over two nodes' stores (two PostgreSQL databases,
``a`` and ``b``, each answering on a real broker) in every such state beside
ordinary rows, and every question the fleet reads is answered exactly as one
store holding every row once answers it (a third database, ``c``, read alone).
The ``kept`` question is asked only by the reads that reached an unsettled row.
"""
from __future__ import annotations

import contextlib
import dataclasses
from datetime import timedelta
from typing import Any, AsyncIterator, Optional

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from crewlet.events import Event
from crewlet.events.types.notification import coalesced_trigger_id
from crewlet.queue import topics
from eventstore import questions as qs
from crewlet.models import CustodyClaim
from eventstore.fanout import FleetReads, node_part, seed_plan, wire
from eventstore.questions import Filters, NodeScope, Question
from eventstore_support import AT, US, make_event, store, trace
from fleet_support import STORE_MARKS, alias_of, empty_stores, readers, stores  # noqa: F401  (fixtures)
from seats_support import jetstream_queues

pytestmark = STORE_MARKS

A, B, WHOLE = "a", "b", "c"
#: The node that published every row: a stateless node, so each row's ``node`` is the same on every store.
STATELESS = "s"
BATCH = "batch-1"
S, MIN = timedelta(seconds=1), timedelta(minutes=1)

#: Where a row sits: (a's custody batch, b's), "" settled, None not held.
Place = tuple[Optional[str], Optional[str]]
ORDINARY_A: Place = ("", None)
ORDINARY_B: Place = (None, "")
BOTH_UNSETTLED: Place = (BATCH, BATCH)
SETTLED_ON_A: Place = ("", BATCH)
SETTLED_ON_B: Place = (BATCH, "")
UNSETTLED_ON_A: Place = (BATCH, None)
UNSETTLED_ON_B: Place = (None, BATCH)
IN_FLIGHT: tuple[Place, ...] = (BOTH_UNSETTLED, SETTLED_ON_A, SETTLED_ON_B, UNSETTLED_ON_A, UNSETTLED_ON_B)
EVERY_STATE: tuple[Place, ...] = (ORDINARY_A, BOTH_UNSETTLED, ORDINARY_B, SETTLED_ON_A, UNSETTLED_ON_A, SETTLED_ON_B, UNSETTLED_ON_B)
SETTLED_ONLY: tuple[Place, ...] = (ORDINARY_A, ORDINARY_B)

DELIVERY = "Ev-kept-1"
#: A trace none of whose rows is in flight: reading it never asks ``kept``.
QUIET_TRACE = trace(99)


def _ev(etype: str, ts: Any, event_id: str, **fields: Any) -> Event:
    return make_event(etype, ts, event_id=event_id, node=STATELESS, **fields)


def _history() -> list[Event]:
    """Six turns (one failed by a failure row, one by its completion), plain rows four to a microsecond, a delivery."""
    base = AT - timedelta(hours=2)
    events: list[Event] = []
    for k in range(6):
        at, seat, turn_id, span = base + k * 13 * MIN, ("ada", "bob")[k % 2], f"t-{k}", trace(10 + k)
        tokens = {"input_tokens": 100 + k, "output_tokens": 10}
        events.append(_ev("agent_turn_started", at, f"{turn_id}-start", span=span, seat=seat, turn_id=turn_id))
        events.append(_ev("agent_phase_completed", at + MIN, f"{turn_id}-phase", span=span, seat=seat, turn_id=turn_id,
                          phase="respond", rounds=[{"model": ("big-1", "small-2")[k % 2], **tokens}], **tokens))
        if k == 3:
            events.append(_ev("llm_unavailable", at + 2 * MIN, f"{turn_id}-down", span=span, seat=seat, turn_id=turn_id))
        else:
            events.append(_ev("agent_turn_completed", at + 2 * MIN, f"{turn_id}-end", span=span, seat=seat, turn_id=turn_id,
                              failed=k == 4, **tokens))
    for i in range(14):
        events.append(_ev("org_started", AT - 30 * MIN if i < 4 else base + i * 7 * MIN + i * US, f"org-{i:02d}"))
    d0 = AT - 20 * MIN
    events += [
        _ev("inbound_delivery", d0, "in-1", surface="slack", event_name="message", delivery_id=DELIVERY),
        _ev("external_notification", d0 + S, "wake-1", seat="ada", delivery_id=DELIVERY),
        _ev("notifications_coalesced", d0 + 2 * S, "co-1", seat="ada", event_ids=["wake-1", "wake-0"], count=2),
        _ev("agent_turn_started", d0 + 3 * S, "t-d-start", seat="ada", turn_id="t-d",
            trigger_event_id=coalesced_trigger_id(["wake-1", "wake-0"])),
        _ev("agent_turn_completed", d0 + 4 * S, "t-d-end", seat="ada", turn_id="t-d", input_tokens=7, output_tokens=3),
    ]
    return events


def _quiet() -> list[Event]:
    return [_ev("org_started", AT - (40 - i) * MIN, f"quiet-{i}", span=QUIET_TRACE) for i in range(3)]


def _place(states: tuple[Place, ...]) -> list[tuple[Event, Place]]:
    placed = [(event, states[i % len(states)]) for i, event in enumerate(_history())]
    return placed + [(event, SETTLED_ONLY[i % 2]) for i, event in enumerate(_quiet())]


def _write(placed: list[tuple[Event, Place]]) -> None:
    """Each store's rows, unsettled ones marked with the batch as a keeper writes them; the whole gets every row once."""
    for node, side in ((A, 0), (B, 1)):
        store(*[event for event, place in placed if place[side] is not None], using=alias_of(node))
        unsettled = [event.id for event, place in placed if place[side]]
        if unsettled:
            with connections[alias_of(node)].cursor() as cursor:
                marks = ", ".join(["%s"] * len(unsettled))
                cursor.execute(f"UPDATE eventstore_event SET custody_batch = %s WHERE id IN ({marks})", [BATCH, *unsettled])
    store(*[event for event, _ in placed], using=alias_of(WHOLE))


def _whole() -> FleetReads:
    """One store holding every row once, read alone through the same runner."""
    return FleetReads(NodeScope(WHOLE, using=alias_of(WHOLE)), roster=lambda: [WHOLE])


def _body(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "coverage"}


def _complete(answer: dict[str, Any], *nodes: str) -> bool:
    return answer["coverage"] == {"nodes": [{"id": n, "answered": True, "error": ""} for n in nodes], "complete": True}


async def _walk(reader: FleetReads, question: Question, rows: str) -> list[Any]:
    """Every page of ``question`` by its cursor: the rows in order (a page's size may differ between readers)."""
    seen: list[Any] = []
    cursor = ""
    while True:
        page = await reader.aask(dataclasses.replace(question, cursor=cursor))
        seen += page[rows]
        cursor = page["next_cursor"] or ""
        if not cursor:
            return seen


async def _same_everywhere(asker: FleetReads, whole: FleetReads, placed: list[tuple[Event, Place]]) -> dict[str, int]:
    """Every question kind asked of the fleet and of the whole store, answered alike; the ``kept`` rounds each read asked."""
    asked: dict[str, int] = {}

    async def same(label: str, question: Question) -> dict[str, Any]:
        before = asker.kept_asked
        fleet, alone = await asker.aask(question), await whole.aask(question)
        asked[label] = asked.get(label, 0) + asker.kept_asked - before
        assert _body(fleet) == _body(alone), label
        assert _complete(fleet, A, B), label
        return fleet

    async def same_walk(label: str, question: Question, rows: str) -> list[Any]:
        before = asker.kept_asked
        fleet, alone = await _walk(asker, question, rows), await _walk(whole, question, rows)
        asked[label] = asked.get(label, 0) + asker.kept_asked - before
        key = "id" if rows == "events" else "turn_id"
        assert fleet == alone and len({r[key] for r in fleet}) == len(fleet), label
        return fleet

    listed = await same_walk("events", Question(kind=qs.EVENTS, at=AT, limit=4), "events")
    assert len(listed) == len(placed)
    await same_walk("events", Question(kind=qs.EVENTS, at=AT, limit=3, filters=Filters(seat="ada")), "events")
    await same_walk("events", Question(kind=qs.EVENTS, at=AT, limit=5, filters=Filters(categories=("system",))), "events")
    for event, place in placed:
        await same(f"event {event.id}", Question(kind=qs.EVENT, at=AT, key=event.id))
    window, bucket = qs.parse_duration("3h"), qs.parse_duration("30m")
    bars = await same("event_series", Question(kind=qs.EVENT_SERIES, at=AT, window_us=window, bucket_us=bucket))
    assert sum(bar["total"] for bar in bars["bars"]) == len(placed) and sum(bar["failed"] for bar in bars["bars"]) == 2
    await same("event_series", Question(kind=qs.EVENT_SERIES, at=AT, window_us=window, bucket_us=bucket, filters=Filters(seat="bob")))
    for k in range(6):
        found = await same(f"trace {k}", Question(kind=qs.TRACE, at=AT, key=trace(10 + k).trace_id))
        assert found["total"] == 3
    await same("quiet trace", Question(kind=qs.TRACE, at=AT, key=QUIET_TRACE.trace_id))
    for turn_id in (*(f"t-{k}" for k in range(6)), "t-d"):
        found = await same(f"turn {turn_id}", Question(kind=qs.TURN, at=AT, key=turn_id))
        assert found["turn"] is not None and len(found["turn"]["events"]) in (2, 3)
    turns = await same("turns", Question(kind=qs.TURNS, at=AT, limit=50))
    assert [t["tokens"]["total"] for t in turns["turns"]] == [10, 115, 114, 113, 112, 111, 110]
    assert [t["phases"] for t in turns["turns"]] == [0, 1, 1, 1, 1, 1, 1]
    assert [t["outcome"] for t in turns["turns"]].count(qs.OUTCOME_FAILED) == 2
    walked = await same_walk("turns", Question(kind=qs.TURNS, at=AT, limit=2), "turns")
    assert [t["turn_id"] for t in walked] == [t["turn_id"] for t in turns["turns"]]
    await same("model_spend", Question(kind=qs.MODEL_SPEND, at=AT, key="UTC", filters=Filters(since=AT - timedelta(days=1))))
    delivery = await same("delivery", Question(kind=qs.DELIVERY, at=AT, key=DELIVERY))
    folded = qs.fold_delivery(DELIVERY, delivery["rows"], delivery["following"], delivery["turns"])
    assert folded is not None and folded["state"] == "worked" and len(folded["events"]) == 4

    before = asker.kept_asked
    seed = seed_plan(AT, ("ada", "bob"), feed_size=6, window_us=qs.parse_duration("24h"))
    fleet = await asker.arun(seed, AT, "seed")
    alone = await whole.arun(seed_plan(AT, ("ada", "bob"), feed_size=6, window_us=qs.parse_duration("24h")), AT, "seed")
    asked["seed"] = asker.kept_asked - before
    assert _body(fleet) == _body(alone)
    assert fleet["counters"] == {"turns_completed": 5, "turns_failed": 1, "tokens": 562 + 10, "events": len(placed)}
    assert fleet["per_seat"]["ada"]["turns_completed"] == 3 and set(fleet["turns"]) == {"ada", "bob"}
    return asked


@contextlib.asynccontextmanager
async def _fleet(states: tuple[Place, ...]) -> AsyncIterator[tuple[list[tuple[Event, Place]], FleetReads, list[Any], list[FleetReads]]]:
    """The history placed in ``states`` over a and b (each serving on a real broker), and the whole store read alone."""
    placed = _place(states)
    await sync_to_async(_write)(placed)
    whole = _whole()
    try:
        async with jetstream_queues(A, B) as queues, readers(queues) as nodes:
            yield placed, whole, queues, nodes
    finally:
        await whole.stop()


async def test_rows_unsettled_on_two_stores_settled_on_one_or_unsettled_on_one_are_each_read_once_in_every_question() -> None:
    async with _fleet(EVERY_STATE) as (placed, whole, _, (a, b)):
        asked = await _same_everywhere(a, whole, placed)
        asked_from_b = await _same_everywhere(b, whole, placed)
        # A request thread (an API view) asks the same way.
        for question in (Question(kind=qs.EVENTS, at=AT, limit=500), Question(kind=qs.TURNS, at=AT, limit=50),
                         Question(kind=qs.EVENT_SERIES, at=AT, window_us=qs.parse_duration("3h"), bucket_us=qs.parse_duration("1h"))):
            fleet = await sync_to_async(a.ask, thread_sensitive=False)(question)
            assert _body(fleet) == _body(await whole.aask(question)) and _complete(fleet, A, B)
    for label, rounds in (asked | {f"b {k}": v for k, v in asked_from_b.items()}).items():
        place = dict((f"event {e.id}", p) for e, p in placed).get(label.removeprefix("b "))
        if label.endswith("quiet trace") or (place is not None and place not in IN_FLIGHT):
            assert rounds == 0, label  # nothing it reached was in flight: kept was never asked
        else:
            assert rounds >= 1, label
    assert whole.kept_asked == 0


async def test_a_fleet_with_no_unsettled_row_never_asks_kept_and_answers_as_one_store() -> None:
    async with _fleet(SETTLED_ONLY) as (placed, whole, queues, (a, b)):
        asked = await _same_everywhere(b, whole, placed)
        raw = await queues[0].ask(topics.HISTORY_READS, wire.encode_request(Question(kind=qs.EVENTS, at=AT), "x", [B]), 1, 2.0)
    assert set(asked.values()) == {0} and a.kept_asked == b.kept_asked == 0
    [reply] = [wire.decode_reply(r) for r in raw]
    assert reply is not None and reply.answer is not None and qs.K_UNSETTLED not in reply.answer  # nothing new on the wire


async def test_a_node_alone_reads_the_unsettled_rows_of_its_own_store_once_through_the_same_round(caplog: pytest.LogCaptureFixture) -> None:
    placed = _place(EVERY_STATE)
    await sync_to_async(_write)(placed)
    alone = FleetReads(NodeScope(A, using=alias_of(A)), roster=lambda: [A])
    try:
        page = await sync_to_async(alone.ask, thread_sensitive=False)(Question(kind=qs.EVENTS, at=AT, limit=500))
        quiet = await sync_to_async(alone.ask, thread_sensitive=False)(Question(kind=qs.TRACE, at=AT, key=QUIET_TRACE.trace_id))
    finally:
        await alone.stop()
    assert sorted(r["id"] for r in page["events"]) == sorted(e.id for e, place in placed if place[0] is not None)
    assert _complete(page, A) and quiet["total"] == 2 and alone.kept_asked == 1
    [logged] = [r for r in caplog.records if r.getMessage() == "fleet_read_kept_asked"]
    assert (vars(logged)["node"], vars(logged)["named"]) == (A, len([e for e, place in placed if place[0]]))


async def test_a_node_that_cannot_answer_kept_is_named_and_its_part_is_left_out_whole() -> None:
    placed = _place(EVERY_STATE)
    await sync_to_async(_write)(placed)

    async with jetstream_queues(A, B) as queues, readers(queues[:1], roster=lambda: [A, B]) as (a,):
        b = FleetReads(NodeScope(B, using=alias_of(B)), roster=lambda: [A, B], queue=queues[1])

        async def no_kept(raw: bytes) -> bytes:
            if wire.decode_request(raw).raw.get(wire.K_QUESTION) == qs.KEPT:
                return wire.encode_reply(qs.PROTOCOL_VERSION, B, error=wire.reason(wire.READ_FAILED, "OperationalError"))
            return await b.serve(raw)

        server = await queues[1].serve(topics.HISTORY_READS, no_kept)
        try:
            listed = await _walk(a, Question(kind=qs.EVENTS, at=AT, limit=500), "events")
            page = await a.aask(Question(kind=qs.EVENTS, at=AT, limit=500))
        finally:
            await server.close()
            await b.stop()
    # a's every row once (settled or not): what the fleet holds without b, and b is named.
    assert sorted(r["id"] for r in listed) == sorted(e.id for e, place in placed if place[0] is not None)
    assert page["coverage"] == {
        "nodes": [{"id": A, "answered": True, "error": ""}, {"id": B, "answered": False, "error": f"{wire.READ_FAILED}: OperationalError"}],
        "complete": False,
    }


async def test_a_node_without_a_store_answers_no_part_and_reads_the_stores_of_the_nodes_that_keep_one() -> None:
    placed = _place(EVERY_STATE)
    await sync_to_async(_write)(placed)
    whole = _whole()
    try:
        async with jetstream_queues(A, B, STATELESS) as queues, readers(queues[:2], roster=lambda: [A, B]):
            stateless = FleetReads(NodeScope(STATELESS, using=alias_of(WHOLE)), roster=lambda: [A, B, STATELESS],
                                   queue=queues[2], keeps_store=False)
            await stateless.start()
            try:
                question = Question(kind=qs.EVENT_SERIES, at=AT, window_us=qs.parse_duration("3h"), bucket_us=qs.parse_duration("1h"))
                fleet, alone = await stateless.aask(question), await whole.aask(question)
                # Nobody answers for it: a question addressed to it alone gathers nothing.
                silent = await queues[0].ask(topics.HISTORY_READS, wire.encode_request(question, A, [STATELESS]), 1, 0.3)
            finally:
                await stateless.stop()
    finally:
        await whole.stop()
    assert _body(fleet) == _body(alone) and _complete(fleet, A, B) and stateless.kept_asked == 1
    assert [r for r in silent if b'"node":"s"' in r] == []


def test_the_read_roster_lists_only_live_nodes_whose_presence_names_a_store(db: Any) -> None:
    from crewlet.fleet import PROTOCOL_VERSION, leases
    from crewlet.fleet.leases import NODE
    from eventstore.fanout import live_roster

    for name, store_id in (("n1", "n1-store"), ("n2", ""), ("n3", "n3-store")):
        assert leases.acquire(NODE, name, name, 60.0, labels=[], protocol=PROTOCOL_VERSION, store=store_id)
    assert live_roster() == ["n1", "n3"]


async def test_an_engine_whose_node_keeps_no_store_reads_the_fleet_without_a_part_of_its_own() -> None:
    from crewlet.company.loading import load_settings
    from crewlet.company.org import CompanyHolder
    from crewlet.company.parse import load_company
    from crewlet.engine.core import Engine
    from eventstore.fanout import for_engine

    made = []
    for data in (True, False):
        settings = load_settings({}, env={}, overrides={"node.id": STATELESS, "node.data": data})
        made.append(for_engine(Engine(settings, company=CompanyHolder(load_company()))))
    try:
        assert [reads.keeps_store for reads in made] == [True, False]
    finally:
        for reads in made:
            await reads.stop()


def test_a_part_names_as_its_own_the_unsettled_rows_of_a_batch_whose_claim_names_its_node() -> None:
    placed = _place((BOTH_UNSETTLED,))
    _write(placed)
    CustodyClaim.objects.create(batch=BATCH, origin=STATELESS, keeper=B)
    question = Question(kind=qs.EVENTS, at=AT, limit=5)
    a, b = (node_part(question, NodeScope(node, using=alias_of(node))) for node in (A, B))
    named = sorted(event.id for event, place in placed if place == BOTH_UNSETTLED)
    assert a[qs.K_UNSETTLED] == b[qs.K_UNSETTLED] == named  # every row the read could reach, not the page's five
    assert qs.K_UNSETTLED_OWN not in a  # a's copy is not its own: its settle pass will drop it
    assert b[qs.K_UNSETTLED_OWN] == named  # b keeps them: the asker asks b for them
