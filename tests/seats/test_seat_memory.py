"""A seat's memory: rows on CREWLET_MEMORY, the node's copy and its search, the memory tools and the prompt's memory block.

Run by ``bin/test`` on PostgreSQL (the tsvector search) and by ``pytest`` on
SQLite (FTS5): the same cases hold both stores' search to one behaviour.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from crewlet.company.org import CompanyHolder, Organization
from crewlet.queue import topics
from seats.memory import store
from seats.memory.holding import purge
from seats.memory.rows import VALUE_MAX_BYTES, RowRefused, RowWrite, written
from seats.turn_types import Trigger
from seats.turns import TurnRunner
from seats_support import Recorder, company, eventually, memory_queues, running, wake

DB = pytest.mark.django_db(transaction=True, databases=["default", "events"])
pytestmark = pytest.mark.usefixtures("close_store_connections")
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def row(key: str, value: Any, *, at: int = 0, deleted: bool = False, table: str = "notes", seat: str = "ada") -> RowWrite:
    return RowWrite(
        seat=seat, table=table, key=key, value=json.dumps(value), deleted=deleted,
        written_at=T0 + timedelta(seconds=at), event_id=f"e{at}-{key}",
    )


def memory_company(**ada: Any) -> Organization:
    script = [
        {"calls": [{"tool": "memory_remember", "arguments": {"key": "deploy", "value": "deploys happen on Thursdays at five"}}]},
        {"answer": "noted"},
    ]
    return company(
        providers=[{"kind": "echo", "script": script, "match": "please remember"}],
        seats=[{"handle": "ada", "kind": "agent", "role": "engineer", "tools": ["memory"], **ada}, {"handle": "grace", "kind": "human"}],
    )


@DB
def test_search_finds_a_row_by_a_word_of_its_value_and_the_newer_write_of_a_row_wins() -> None:
    store.apply([row("deploy", "deploys happen on Thursdays", at=1), row("lunch", {"where": "the canteen"}, at=1)])
    store.apply([row("other", "thursdays too", seat="linus", at=1)])
    assert [r.key for r in store.search("ada", "what about Thursday?")] == ["deploy"]  # stemmed, and only ada's rows
    assert [r.key for r in store.search("ada", "canteen")] == ["lunch"]
    assert store.search("ada", "?!") == []

    store.apply([row("deploy", "an older value", at=0)])  # late and older: ignored
    assert store.get("ada", "notes", "deploy").value == "deploys happen on Thursdays"
    store.apply([row("deploy", None, at=2, deleted=True)])
    assert store.get("ada", "notes", "deploy") is None and store.search("ada", "thursday") == []
    store.apply([row("deploy", "back again", at=1)])  # older than the forget: stays forgotten
    assert store.get("ada", "notes", "deploy") is None and store.count("ada") == 1


async def test_a_row_outside_the_bounds_is_refused_with_its_field_and_what_is_allowed() -> None:
    async with memory_queues() as (_, [q]):
        with pytest.raises(RowRefused, match=r"table='Bad Table': must be 1-64 of a-z"):
            await written(q, "ada", "Bad Table", "k", 1, written_by="turn")
        with pytest.raises(RowRefused, match=f"at most {VALUE_MAX_BYTES}"):
            await written(q, "ada", "notes", "k", "x" * VALUE_MAX_BYTES, written_by="turn")
        assert await q.read_last(topics.memory_pattern("ada")) == []


@DB
async def test_a_turn_remembers_a_row_and_the_next_turn_of_the_seat_is_given_it_in_its_prompt() -> None:
    org = memory_company()
    seat = org.seat_by_handle("ada")
    assert seat is not None
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runner = TurnRunner(q, CompanyHolder(org))
        first = await runner.run(seat, Trigger(events=[wake("ada", "please remember when we deploy")]))
        assert first.ok and first.wrote  # remember is a write: the ledger's rule applies
        [(subject, message)] = await q.read_last(topics.memory_pattern("ada"))
        assert subject == topics.memory("ada", "notes", "deploy") and message.data.value == "deploys happen on Thursdays at five"

        second = await runner.run(seat, Trigger(events=[wake("ada", "when is the deploy?")]))
    assert second.ok and "notes/deploy: deploys happen on Thursdays at five" in second.response
    sizes = rec.of("prompt.size")
    assert [s.data.memory_rows for s in sizes] == [0, 1] and sizes[1].data.memory_bytes > 0
    assert sizes[1].data.user_bytes > sizes[1].data.memory_bytes


@DB
async def test_a_node_acquiring_a_seat_replays_its_memory_follows_a_forget_from_elsewhere_and_a_purge_empties_it() -> None:
    org = memory_company()
    async with memory_queues("n1", "n2") as (_, [q1, q2]):
        await written(q2, "ada", "notes", "deploy", "on Thursdays", written_by="turn")
        await written(q2, "ada", "counterparty", "sam", {"prefers": "short answers"}, written_by="reflection")
        await written(q2, "ada", "notes", "gone", "soon forgotten", written_by="turn")
        await written(q2, "ada", "notes", "gone", None, deleted=True, written_by="operator")
        async with running(q1, org) as runtime:
            assert "ada" in runtime.loops
            keys = sorted(r.key for r in await sync_to_async(store.listing)("ada"))
            assert keys == ["deploy", "sam"]
            await written(q2, "ada", "notes", "deploy", None, deleted=True, written_by="operator")
            count = sync_to_async(store.count)

            async def one_left() -> bool:
                return await count("ada") == 1

            await eventually(one_left, what="the forget from n2 applied on n1")
        assert await sync_to_async(store.count)("ada") == 0  # the node let the seat go: its copy went with it
        assert await purge(q1, "ada") == 3
        assert await q1.read_last(topics.memory_pattern("ada")) == []


@DB
async def test_a_node_taking_many_seats_at_once_replays_all_their_memory_in_one_read_and_follows_writes_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from seats.runtime import SEAT_CONCURRENCY

    caplog.set_level(logging.INFO, logger="crewlet.seats.memory")
    handles = [f"s{i}" for i in range(SEAT_CONCURRENCY + 4)]  # more than one round of attaches
    org = company(seats=[{"handle": h, "kind": "agent"} for h in handles])
    async with memory_queues("n1", "n2") as (_, [q1, q2]):
        await written(q2, "s1", "notes", "deploy", "on Thursdays", written_by="turn")
        await written(q2, "s1", "notes", "gone", "soon forgotten", written_by="turn")
        await written(q2, "s1", "notes", "gone", None, deleted=True, written_by="operator")
        await written(q2, handles[-1], "notes", "lunch", "the canteen", written_by="turn")
        await written(q2, "nobody", "notes", "k", "a seat of no company here", written_by="turn")
        async with running(q1, org) as runtime:
            assert sorted(runtime.loops) == sorted(handles)
            listed = sync_to_async(store.listing)
            assert [r.key for r in await listed("s1")] == ["deploy"]
            assert [r.key for r in await listed(handles[-1])] == ["lunch"]
            assert await listed("s2") == [] and await listed("nobody") == []
            await written(q2, "s2", "notes", "later", "written after the replay", written_by="turn")

            async def followed() -> bool:
                return [r.key for r in await listed("s2")] == ["later"]

            await eventually(followed, what="a write after the replay applied on n1")
        count = sync_to_async(store.count)
        assert [await count(h) for h in ("s1", "s2", handles[-1])] == [0, 0, 0]  # the stopped node let every copy go
        together = [r for r in caplog.records if r.getMessage() == "seat_memory_replayed_together"]
        per_seat = {r.__dict__["seat"]: r.__dict__ for r in caplog.records if r.getMessage() == "seat_memory_replayed"}
    # one read of four messages (one per row: the forget replaced the write it forgot)
    assert [(r.__dict__["seats"], r.__dict__["messages"]) for r in together] == [(len(handles), 4)]
    assert sorted(per_seat) == sorted(handles) and all(p["together"] for p in per_seat.values())
    assert (per_seat["s1"]["rows"], per_seat["s1"]["tombstones"], per_seat["s2"]["rows"]) == (1, 1, 0)


@DB
def test_clearing_more_seats_than_one_statement_names_drops_each_of_their_copies_and_only_theirs() -> None:
    kept, gone = ["ada", "zed"], [f"s{i}" for i in range(2 * store.CLEAR_CHUNK + 1)]
    store.apply([row("k", "v", seat=h) for h in [*kept, gone[0], gone[store.CLEAR_CHUNK], gone[-1]]])
    assert store.clear(gone) == 3
    assert [store.count(h) for h in [*kept, gone[0], gone[-1]]] == [1, 1, 0, 0]


@DB
async def test_a_retired_seats_memory_is_purged_with_its_mailboxes_and_the_others_stay() -> None:
    from seats.runtime import SeatRuntime
    from seats_support import holder

    now = [T0.timestamp()]
    with_linus = company(seats=[{"handle": "ada", "kind": "agent"}, {"handle": "linus", "kind": "agent"}])
    async with memory_queues() as (_, [q]):
        await written(q, "linus", "notes", "k", "linus knew this", written_by="turn")
        await written(q, "ada", "notes", "k", "ada knew this", written_by="turn")
        runtime = SeatRuntime(q, holder(with_linus), run_scheduler=False, clock=lambda: now[0], absent_after_s=60)
        await runtime.start()
        try:
            await runtime.apply(company(seats=[{"handle": "ada", "kind": "agent"}]))
            now[0] += 60
            await runtime.sweep()  # (or its own duty's sweep, which may run first)

            async def purged() -> bool:
                return await q.read_last(topics.memory_pattern("linus")) == []

            await eventually(purged, what="linus's memory purged with its mailboxes")
        finally:
            await runtime.stop()
        assert [e.data.value for _, e in await q.read_last(topics.memory_pattern("ada"))] == ["ada knew this"]
