"""Fleet reads on a real broker: three nodes, each answering from its OWN event store (three PostgreSQL databases).

Each node here is what an engine contributes (``eventstore.fanout.FleetReads``
on a JetStream client of one real nats-server), serving its own database and
asking the other two; the roster is the three of them. The route-level twin
through ``manage.py up`` processes is tests/fleet/test_fleet_reads_up.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from crewlet.events import format_timestamp
from crewlet.events.types import HistoryPartial
from crewlet.events.types.notification import coalesced_trigger_id
from crewlet.engine.interfaces import FLEET_READS
from crewlet.engine.metrics import EngineMetrics
from crewlet.queue import topics
from eventstore import fanout
from eventstore import questions as qs
from eventstore.projection import LiveProjection
from eventstore.questions import Filters, NodeScope, Question
from eventstore.writer import attach
from engine_support import engine_here
from eventstore_support import AT, US, make_event, store, trace
from fleet_support import STORE_MARKS, NODES, alias_of, empty_stores, readers, stores  # noqa: F401  (fixtures)
from seats_support import company, jetstream_queues

pytestmark = STORE_MARKS

S = timedelta(seconds=1)
_ids = itertools.count(1)


def _put(node: str, *events: Any) -> list[str]:
    for event in events:
        event.node = node
    store(*events, using=alias_of(node))
    return [e.id for e in events]


def _rows(node: str, count: int, *, start: Any, step: timedelta, shared: Any = None) -> list[Any]:
    """``count`` rows on ``node`` from ``start`` every ``step``; the first few at ``shared`` when given (one microsecond)."""
    events = []
    for i in range(count):
        ts = shared if shared is not None and i < 3 else start + i * step
        events.append(make_event("org_started", ts, event_id=f"{node}-{next(_ids):05d}", node=node))
    return events


def _by_position(rows: list[Any]) -> list[str]:
    return [e.id for e in sorted(rows, key=lambda e: (e.timestamp, e.id), reverse=True)]


async def _walk(reader: fanout.FleetReads, limit: int) -> tuple[list[str], list[dict[str, Any]]]:
    seen: list[str] = []
    pages = []
    cursor = ""
    while True:
        answer = await reader.aask(Question(kind=qs.EVENTS, at=AT, limit=limit, cursor=cursor))
        pages.append(answer)
        seen += [row["id"] for row in answer["events"]]
        cursor = answer["next_cursor"] or ""
        if not cursor:
            return seen, pages


def _complete(answer: dict[str, Any], *nodes: str) -> bool:
    return answer["coverage"] == {"nodes": [{"id": n, "answered": True, "error": ""} for n in nodes], "complete": True}


async def test_paging_by_seven_over_three_nodes_visits_every_row_exactly_once_rows_sharing_a_microsecond_included() -> None:
    shared = AT - 50 * S
    everything = [
        *_rows("a", 11, start=AT - 100 * S, step=7 * S, shared=shared),
        *_rows("b", 9, start=AT - 99 * S, step=11 * S, shared=shared),
        *_rows("c", 13, start=AT - 98 * S, step=3 * S, shared=shared),
    ]
    for node in NODES:
        await sync_to_async(_put)(node, *[e for e in everything if e.id.startswith(node)])
    async with jetstream_queues(*NODES) as queues, readers(queues) as nodes:
        for asker in (nodes[0], nodes[2]):
            seen, pages = await _walk(asker, 7)
            assert seen == _by_position(everything)  # every row once, in (timestamp, id) order across nodes
            assert all(len(page["events"]) <= 7 for page in pages) and len(pages) >= len(everything) // 7
            assert all(_complete(page, *NODES) for page in pages)


async def test_a_reply_over_the_transports_limit_gives_up_its_oldest_rows_and_the_walk_still_visits_each_row_once() -> None:
    everything = [*_rows("a", 30, start=AT - 300 * S, step=S), *_rows("b", 30, start=AT - 299 * S, step=S)]
    for node in ("a", "b"):
        await sync_to_async(_put)(node, *[e for e in everything if e.id.startswith(node)])
    async with jetstream_queues("a", "b") as queues, readers(queues, max_reply_bytes=6000) as nodes:
        seen, pages = await _walk(nodes[0], 50)
        assert seen == _by_position(everything)
        # b's reply could not carry 50 rows: its page stopped early, and the merged page with it.
        assert len(pages[0]["events"]) < 50 and pages[0]["next_cursor"]


async def test_series_totals_are_the_sum_of_the_three_stores() -> None:
    per_node = {"a": 5, "b": 8, "c": 3}
    for node, count in per_node.items():
        await sync_to_async(_put)(node, *_rows(node, count, start=AT - timedelta(hours=2), step=timedelta(minutes=9)))
    question = Question(kind=qs.EVENT_SERIES, at=AT, window_us=qs.parse_duration("3h"), bucket_us=qs.parse_duration("1h"))
    async with jetstream_queues(*NODES) as queues, readers(queues) as nodes:
        merged = await nodes[1].aask(question)
    alone = [
        await sync_to_async(qs.answer)(question, NodeScope(node, using=alias_of(node))) for node in NODES
    ]
    assert [bar["total"] for bar in merged["bars"]] == [sum(bars) for bars in zip(*([b["total"] for b in a["bars"]] for a in alone))]
    assert sum(bar["total"] for bar in merged["bars"]) == sum(per_node.values())
    assert _complete(merged, *NODES)


async def test_one_webhooks_trace_spanning_two_nodes_is_returned_whole_from_any_node() -> None:
    now = qs.instant()
    edge, turn = trace(7), dataclasses.replace(trace(7), span_id="2" * 16, parent_span_id=trace(7).span_id)
    async with jetstream_queues(*NODES) as queues, readers(queues) as nodes:
        writers = [attach(q, using=alias_of(q.node)) for q in queues]
        try:
            # The edge on a publishes the delivery; the seat's turn runs on b, under the delivery's span.
            delivery = make_event("inbound_delivery", now - 3 * S, span=edge, node="", surface="webhook", event_name="push")
            started = make_event("agent_turn_started", now - 2 * S, span=turn, node="", seat="ada", turn_id="t-7")
            completed = make_event("agent_turn_completed", now - S, span=turn, node="", seat="ada", turn_id="t-7")
            for queue, event in ((queues[0], delivery), (queues[1], started), (queues[1], completed)):
                event.node = ""
                await queue.publish(topics.event(event.type), event)
        finally:
            for writer in writers:
                await writer.aclose()
        at = qs.instant()
        for asker in nodes:
            answer = await asker.aask(Question(kind=qs.TRACE, at=at, key=edge.trace_id))
            [root] = answer["spans"]
            assert [e["id"] for e in root["events"]] == [delivery.id] and root["events"][0]["node"] == "a"
            [child] = root["children"]
            assert [e["id"] for e in child["events"]] == [started.id, completed.id] and {e["node"] for e in child["events"]} == {"b"}
            assert answer["total"] == 3 and _complete(answer, *NODES)


def _turn_rows(node: str, turn_id: str, start: Any, *, completed: bool, resumed: bool = False) -> list[Any]:
    rows = [make_event("agent_turn_started", start, event_id=f"{turn_id}-{node}-start", seat="ada", turn_id=turn_id, resumed=resumed)]
    if completed:
        rows.append(make_event("agent_turn_completed", start + S, event_id=f"{turn_id}-{node}-end", seat="ada", turn_id=turn_id,
                               input_tokens=10, output_tokens=5, resumed=resumed))
    else:
        rows.append(make_event("agent_turn_completed", start + S, event_id=f"{turn_id}-{node}-park", seat="ada", turn_id=turn_id,
                               suspended=True, input_tokens=1, output_tokens=1))
    return rows


async def test_a_turn_resumed_on_another_node_is_one_row_folded_from_both_halves_and_paging_lists_every_turn_once() -> None:
    base = AT - 600 * S
    await sync_to_async(_put)("a", *_turn_rows("a", "t-split", base, completed=False), *_turn_rows("a", "t-a1", base + 20 * S, completed=True))
    await sync_to_async(_put)("b", *_turn_rows("b", "t-split", base + 100 * S, completed=True, resumed=True),
                              *_turn_rows("b", "t-b1", base + 50 * S, completed=True))
    await sync_to_async(_put)("c", *_turn_rows("c", "t-c1", base + 10 * S, completed=True), *_turn_rows("c", "t-c2", base + 200 * S, completed=True))
    async with jetstream_queues(*NODES) as queues, readers(queues) as nodes:
        whole = await nodes[2].aask(Question(kind=qs.TURNS, at=AT, limit=50))
        [split] = [t for t in whole["turns"] if t["turn_id"] == "t-split"]
        assert split["nodes"] == ["a", "b"] and split["segments"] == 2 and split["outcome"] == qs.OUTCOME_OK
        assert split["listed_at"] == format_timestamp(base) and split["tokens"]["total"] == 17
        order = [t["turn_id"] for t in whole["turns"]]
        assert order == ["t-c2", "t-b1", "t-a1", "t-c1", "t-split"] and _complete(whole, *NODES)
        walked, cursor = [], ""
        while True:
            page = await nodes[1].aask(Question(kind=qs.TURNS, at=AT, limit=1, cursor=cursor))
            walked += [t["turn_id"] for t in page["turns"]]
            cursor = page["next_cursor"] or ""
            if not cursor:
                break
        assert walked == order
        one = await nodes[0].aask(Question(kind=qs.TURN, at=AT, key="t-split"))
        assert [e["node"] for e in one["turn"]["events"]] == ["a", "a", "b", "b"] and one["turn"]["segments"] == 2


async def test_a_node_whose_serve_never_answers_is_named_with_the_budget_and_the_read_is_published_as_partial() -> None:
    await sync_to_async(_put)("a", *_rows("a", 2, start=AT - 10 * S, step=S))
    await sync_to_async(_put)("c", *_rows("c", 2, start=AT - 10 * S, step=S))
    reported: list[HistoryPartial] = []

    async def record(body: HistoryPartial) -> None:
        reported.append(body)

    release = asyncio.Event()

    async def never(raw: bytes) -> bytes:
        await release.wait()  # past the budget: released only so the server can close
        return b""

    async with jetstream_queues(*NODES) as queues, readers(queues[:2], budget_s=0.3, roster=lambda: list(NODES), report=record) as nodes:
        server = await queues[2].serve(topics.HISTORY_READS, never)
        try:
            answer = await nodes[0].aask(Question(kind=qs.EVENTS, at=AT))
        finally:
            release.set()
            await server.close()
    assert [row["node"] for row in answer["events"]] == ["a", "a"]  # b holds nothing; c never answered
    stuck = answer["coverage"]["nodes"][2]
    assert stuck == {"id": "c", "answered": False, "error": f"{fanout.TIMED_OUT}: no answer within 0.3s"}
    assert answer["coverage"]["complete"] is False
    await asyncio.sleep(0)  # the report is a task on this loop
    assert [(r.question, r.asked, [m["id"] for m in r.missing]) for r in reported] == [("events", 3, ["c"])]
    with engine_here(services={FLEET_READS: nodes[0]}) as engine:  # the alarm's ratio, as /metrics shows it
        scraped = EngineMetrics(engine).render().decode()
    assert 'crewlet_history_reads_total{coverage="partial"} 1.0' in scraped
    assert 'crewlet_history_reads_total{coverage="complete"} 0.0' in scraped
    assert "crewlet_history_kept_questions_total 0.0" in scraped  # no custody batch in flight: never asked


async def test_a_node_on_another_protocol_version_is_named_and_its_rows_are_not_mixed_in() -> None:
    for node in NODES:
        await sync_to_async(_put)(node, *_rows(node, 3, start=AT - 10 * S, step=S))
    async with jetstream_queues(*NODES) as queues, readers(queues[:2], roster=lambda: list(NODES)) as nodes:
        newer = fanout.FleetReads(NodeScope("c", using=alias_of("c")), roster=lambda: list(NODES), queue=queues[2],
                                  version=qs.PROTOCOL_VERSION + 1)
        await newer.start()
        try:
            answer = await nodes[1].aask(Question(kind=qs.EVENTS, at=AT))
        finally:
            await newer.stop()
    assert {row["node"] for row in answer["events"]} == {"a", "b"}
    [c] = [n for n in answer["coverage"]["nodes"] if n["id"] == "c"]
    assert c["answered"] is False and c["error"].startswith(f"{fanout.OTHER_VERSION}: ")


async def test_a_reply_that_is_not_an_answer_is_named_unreadable_and_a_question_without_an_instant_is_refused() -> None:
    async def garbled(raw: bytes) -> bytes:
        return b'{"version": %d, "node": "c", "answer": {"events": "not rows"}}' % qs.PROTOCOL_VERSION

    async with jetstream_queues(*NODES) as queues, readers(queues[:2], roster=lambda: list(NODES)) as nodes:
        server = await queues[2].serve(topics.HISTORY_READS, garbled)
        try:
            answer = await nodes[0].aask(Question(kind=qs.EVENTS, at=AT))
            without = fanout.wire.encode_request(Question(kind=qs.EVENTS, at=None), "c")
            [raw] = [r for r in await queues[2].ask(topics.HISTORY_READS, without, 3, 2.0) if b'"node":"b"' in r]
        finally:
            await server.close()
    [c] = [n for n in answer["coverage"]["nodes"] if n["id"] == "c"]
    assert c["answered"] is False and c["error"].startswith(f"{fanout.UNREADABLE}: ")
    refused = fanout.wire.decode_reply(raw)
    assert refused is not None and refused.answer is None and refused.error.startswith(f"{qs.MissingInstant.reason}: ")


async def test_a_restarted_nodes_projection_is_seeded_with_the_companys_feed_and_each_seats_last_turn_from_every_node() -> None:
    now = qs.instant()
    base = now - 300 * S
    await sync_to_async(_put)("b", *_turn_rows("b", "t-ada", base, completed=True))
    await sync_to_async(_put)("c", *_rows("c", 2, start=base, step=S))
    await sync_to_async(_put)("a", *_rows("a", 1, start=base + 5 * S, step=S))
    async with jetstream_queues(*NODES) as queues, readers(queues) as nodes:
        projection = LiveProjection(lambda: company())
        assert await projection.seed(at=now, fleet=nodes[0]) is True
    snapshot = projection.snapshot()
    assert {row["node"] for row in snapshot["feed"]} == {"a", "b", "c"} and len(snapshot["feed"]) == 5
    [ada] = [seat for seat in snapshot["seats"] if seat["handle"] == "ada"]
    assert ada["last_turn"]["turn_id"] == "t-ada" and ada["last_turn"]["outcome"] == qs.OUTCOME_OK
    assert snapshot["counters"]["turns_completed"] == 1 and snapshot["counters"]["tokens"] == 15


def _phase(node: str, ts: Any, *rounds: dict[str, Any]) -> Any:
    return make_event("agent_phase_completed", ts, event_id=f"{node}-{next(_ids):05d}", node=node, seat="ada",
                      turn_id=f"t-{next(_ids)}", phase="respond", rounds=list(rounds))


async def test_tokens_per_model_are_the_sum_of_every_nodes_rounds_by_the_companys_day() -> None:
    from crewlet.company.budget import PERIOD_DAY, window_of

    zone = "America/New_York"  # AT is 08:30 on 10 March there; 13 h before it, 19:30 on the 9th
    since = window_of(PERIOD_DAY, AT - timedelta(hours=13), zone).starts_at
    big, small = {"model": "big-1", "input_tokens": 700, "output_tokens": 11}, {"model": "small-2", "input_tokens": 30, "output_tokens": 4}
    failed = {"provider_key": "p", "error_kind": "provider_unavailable"}  # no model, no tokens: not counted
    phases = {
        "a": [_phase("a", AT - S, big, small), _phase("a", AT - timedelta(hours=13), big)],
        "b": [_phase("b", AT - 2 * S, failed, small, small)],
        "c": [_phase("c", AT - 3 * S, big), _phase("c", since - S, big)],  # the day before the first: not asked
    }
    for node, events in phases.items():
        await sync_to_async(_put)(node, *events)
    async with jetstream_queues(*NODES) as queues, readers(queues) as nodes:
        answer = await nodes[1].aask(Question(kind=qs.MODEL_SPEND, at=AT, key=zone, filters=Filters(since=since)))
        assert _complete(answer, *NODES)
        assert answer["models"] == {"big-1": {"2025-03-10": 711 * 2, "2025-03-09": 711}, "small-2": {"2025-03-10": 34 * 3}}
        assert answer["rounds"] == 6
        with pytest.raises(qs.BadQuestion, match="not a time zone"):
            await nodes[0].aask(Question(kind=qs.MODEL_SPEND, at=AT, key="Mars/Olympus", filters=Filters(since=since)))


async def test_a_delivery_accepted_on_one_node_and_worked_on_another_reads_worked_from_any_node() -> None:
    base, delivery = AT - 300 * S, "Ev-fleet-1"
    merged = coalesced_trigger_id(["wake-1", "wake-0"])
    await sync_to_async(_put)(
        "a",
        make_event("inbound_delivery", base, event_id="in-1", surface="slack", event_name="message", delivery_id=delivery),
        make_event("external_notification", base + S, event_id="wake-1", seat="ada", delivery_id=delivery),
    )
    await sync_to_async(_put)(
        "b",
        make_event("notifications_coalesced", base + 2 * S, event_id="co-1", seat="ada", event_ids=["wake-1", "wake-0"], count=2),
        make_event("agent_turn_started", base + 3 * S, event_id="t-d-start", seat="ada", turn_id="t-d", trigger_event_id=merged),
        make_event("agent_turn_completed", base + 4 * S, event_id="t-d-end", seat="ada", turn_id="t-d"),
    )
    await sync_to_async(_put)("c", make_event("agent_turn_started", base + 4 * S, event_id="other", seat="ada", turn_id="t-x", trigger_event_id="wake-9"))
    async with jetstream_queues(*NODES) as queues, readers(queues) as nodes:
        for asker in nodes:
            answer = await asker.aask(Question(kind=qs.DELIVERY, at=AT, key=delivery))
            found = qs.fold_delivery(delivery, answer["rows"], answer["following"], answer["turns"])
            assert found is not None and found["state"] == "worked" and _complete(answer, *NODES)
            (seat,) = found["seats"]
            assert (seat["turn"]["turn_id"], seat["turn"]["outcome"], seat["coalesced"]["event_id"]) == ("t-d", qs.OUTCOME_OK, "co-1")
            assert [(e["id"], e["node"]) for e in found["events"]] == [("in-1", "a"), ("wake-1", "a"), ("co-1", "b"), ("t-d-start", "b")]
