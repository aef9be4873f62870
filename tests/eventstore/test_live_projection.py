"""The live projection: seat states from the events the engine really publishes, the feed ring, the seed."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Optional

import pytest
from asgiref.sync import sync_to_async

import eventstore
from crewlet import events
from crewlet.events import Event
from crewlet.events.types import (
    AgentSpawned,
    AgentTerminated,
    AgentTurnCompleted,
    AgentTurnProgress,
    AgentTurnStarted,
    AuxiliarySpend,
    BudgetExhausted,
    ExternalNotification,
    LLMUnavailable,
    NotificationsCoalesced,
    ScheduledTaskFired,
    A2AMessageSent,
    TurnTriggerSkipped,
)
from crewlet.company.loading import load_settings
from crewlet.engine import runtime
from crewlet.engine.core import Engine
from crewlet.company.org import CompanyHolder, Organization
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.memory import MemoryBroker
from crewlet.events.tracing import Trace
from eventstore import projection, questions as qs
from eventstore.projection import LiveProjection
from seats.actions import apause_seat, aresume_seat
from seats_support import company, eventually, jetstream_queues, memory_queues, running, send, wake

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "events"])]

NODE = "n1"


@contextlib.asynccontextmanager
async def a_queue(backend: str) -> AsyncIterator[EventQueue]:
    if backend == "memory":
        async with memory_queues(NODE) as (_, [q]):
            yield q
    else:
        async with jetstream_queues(NODE) as [q]:
            yield q


@pytest.fixture(params=["memory", "jetstream"])
def backend(request: Any) -> str:
    return request.param


class Watched:
    """A projection fed by its own broadcast stream, remembering every seat row an event moved."""

    def __init__(self, org: Organization) -> None:
        self.live = LiveProjection(company=lambda: org)
        self.moves: list[dict[str, Any]] = []

    async def handler(self, topic: str, event: Event) -> None:
        row = self.live.apply(topic, event)
        if row is not None:
            self.moves.append(row)

    def states(self, handle: str) -> list[str]:
        out: list[str] = []
        for row in self.moves:
            if row["handle"] == handle and (not out or out[-1] != row["state"]):
                out.append(row["state"])
        return out

    def seat(self, handle: str) -> dict[str, Any]:
        row = self.live.seat(handle)
        assert row is not None
        return row


@contextlib.asynccontextmanager
async def watching(q: EventQueue, org: Organization) -> AsyncIterator[Watched]:
    watched = Watched(org)
    stream = await q.subscribe_stream(topics.EVENTS_ALL, watched.handler)
    try:
        yield watched
    finally:
        await stream.close()


def made(body: Any, *, event_id: Optional[str] = None, trace: Optional[Trace] = None) -> Event:
    event = events.new(body, trace or Trace.root(), event_id=event_id)
    event.node = NODE
    return event


async def delivered(q: EventQueue, handle: str, wake_event: Event) -> None:
    """A wake as the notification service sends one: into the inbox, and its record under crewlet.events."""
    await send(q, handle, wake_event)
    await q.publish(topics.event(wake_event.type), wake_event)


def apply(live: LiveProjection, body: Any, **kwargs: Any) -> Optional[dict[str, Any]]:
    event = made(body, **kwargs)
    return live.apply(topics.event(event.type), event)


@pytest.fixture(autouse=True)
async def _close_connections() -> AsyncIterator[None]:
    yield
    from django.db import connections

    await sync_to_async(connections.close_all)()


# -- over real published events, both backends ------------------------------------------------------


async def test_a_turn_moves_a_seat_from_idle_to_running_and_back_to_idle_with_its_last_turn(backend: str) -> None:
    org = company()
    async with a_queue(backend) as q, watching(q, org) as watched, running(q, org):
        await eventually(lambda: watched.seat("ada")["state"] == "idle", what="ada spawned")
        await send(q, "ada", wake("ada", "is the build green?"))
        await eventually(lambda: (watched.seat("ada")["last_turn"] or {}).get("outcome") == "ok", what="a turn of ada")
        states, seat = watched.states("ada"), watched.seat("ada")  # before the runtime stops and releases it
        assert watched.seat("linus")["state"] == "idle" and watched.seat("grace")["state"] == "idle"
    assert states == ["idle", "running", "idle"]
    started, *rounds = [row for row in watched.moves if row["state"] == "running"]
    # The turn's start, then its one round's agent_turn_progress (live only: a seat row, never a feed row).
    assert [(row["turn_id"], row["round"]) for row in [started, *rounds]] == [(started["turn_id"], 0), (started["turn_id"], 1)]
    assert seat["turn_id"] is None and seat["round"] is None and seat["queued"] == 0
    last = seat["last_turn"]
    assert last["turn_id"] == started["turn_id"] and last["trace_id"]
    assert last["summary"].startswith("engineer finished a turn")
    assert seat["counters"]["turns_completed"] == 1
    assert watched.live.counters()["turns_completed"] == 1
    types = [row["type"] for row in watched.live.snapshot()["feed"]]
    assert types[:5] == [
        "agent_turn_completed", "agent_phase_completed", "prompt.size", "agent_phase_started", "agent_turn_started"
    ]
    assert "agent_spawned" not in types  # live-only: it moves the seat, it is never a row


async def test_a_pause_reads_paused_with_its_reason_and_a_resume_idle_again(backend: str) -> None:
    org = company()
    async with a_queue(backend) as q, watching(q, org) as watched, running(q, org):
        await eventually(lambda: watched.seat("ada")["state"] == "idle", what="ada spawned")
        assert await apause_seat("ada", by="grace", reason="lunch", queue=q)
        await eventually(lambda: watched.seat("ada")["state"] == "paused", what="ada paused")
        seat = watched.seat("ada")
        assert (seat["reason"], seat["paused_by"]) == ("lunch", "grace")
        assert await aresume_seat("ada", by="grace", queue=q)
        await eventually(lambda: watched.seat("ada")["state"] == "idle", what="ada resumed")
        assert watched.states("ada") == ["idle", "paused", "idle"]
        assert watched.seat("ada")["reason"] == ""


async def test_an_exhausted_provider_chain_stops_the_seat_until_a_turn_works_again(backend: str) -> None:
    org = company(providers=[{"kind": "echo", "fail": True}])
    async with a_queue(backend) as q, watching(q, org) as watched, running(q, org):
        await eventually(lambda: watched.seat("ada")["state"] == "idle", what="ada spawned")
        await send(q, "ada", wake("ada", "hello?"))
        await eventually(lambda: watched.seat("ada")["state"] == "stopped", what="ada stopped by its provider")
        seat = watched.seat("ada")
        assert seat["reason"] == "provider" and seat["last_turn"]["outcome"] == "failed"
        assert watched.live.counters()["turns_failed"] >= 1


async def test_auxiliary_spend_never_enters_the_feed_and_moves_no_seat_but_counts_as_spend(backend: str) -> None:
    org = company()
    async with a_queue(backend) as q, watching(q, org) as watched:
        spend = made(AuxiliarySpend(stage="turn", seat="ada", calls=2, input_tokens=30, output_tokens=12))
        await q.publish(topics.event(spend.type), spend)
        await eventually(lambda: watched.live.counters()["events"] == 1, what="the spend applied")
    snapshot = watched.live.snapshot()
    assert snapshot["feed"] == []
    assert watched.moves == []
    assert snapshot["counters"]["tokens"] == 42
    assert watched.seat("ada")["state"] == "absent" and watched.seat("ada")["counters"]["tokens"] == 0


# -- the state machine, event by event -------------------------------------------------------------


def test_applying_one_event_id_twice_changes_nothing_the_second_time() -> None:
    live = LiveProjection(company=company)
    started = made(AgentTurnStarted(seat="ada", role="engineer", turn_id="t1"))
    first = live.apply(topics.event(started.type), started)
    before = live.snapshot()
    assert first is not None and first["state"] == "running"
    assert live.apply(topics.event(started.type), started) is None
    assert live.snapshot() == before
    assert live.counters()["events"] == 1 and len(before["feed"]) == 1


def test_work_arriving_while_a_turn_runs_is_queued_and_the_next_turn_takes_it() -> None:
    live = LiveProjection(company=company)
    apply(live, AgentSpawned(seat="ada", reason="claimed"))
    apply(live, AgentTurnStarted(seat="ada", turn_id="t1"))
    row = apply(live, ExternalNotification(seat="ada", sender="sam", body="also this"))
    assert row is not None and (row["state"], row["queued"], row["turn_id"]) == ("queued", 1, "t1")
    row = apply(live, AgentTurnCompleted(seat="ada", turn_id="t1", input_tokens=3, output_tokens=4))
    assert row is not None and (row["state"], row["queued"], row["turn_id"]) == ("idle", 1, None)
    row = apply(live, AgentTurnStarted(seat="ada", turn_id="t2"))
    assert row is not None and (row["state"], row["queued"], row["turn_id"]) == ("running", 0, "t2")
    assert live.counters()["tokens"] == 7


def test_a_running_turns_round_is_its_latest_progress_and_another_turns_progress_moves_nothing() -> None:
    live = LiveProjection(company=company)
    apply(live, AgentSpawned(seat="ada", reason="claimed"))
    apply(live, AgentTurnStarted(seat="ada", turn_id="t1"))
    row = apply(live, AgentTurnProgress(seat="ada", turn_id="t1", round=3, input_tokens=10))
    assert row is not None and (row["state"], row["turn_id"], row["round"]) == ("running", "t1", 3)
    row = apply(live, AgentTurnProgress(seat="ada", turn_id="t0", round=7))  # a turn that is not the one running
    assert row is not None and row["round"] == 3
    assert live.snapshot()["feed"][0]["type"] == "agent_turn_started"  # never a feed row
    row = apply(live, AgentTurnCompleted(seat="ada", turn_id="t1"))
    assert row is not None and (row["state"], row["round"]) == ("idle", None)
    row = apply(live, AgentTurnStarted(seat="ada", turn_id="t2"))
    assert row is not None and row["round"] == 0


def test_a_wake_whose_record_arrives_after_its_own_turn_started_is_not_left_queued() -> None:
    live = LiveProjection(company=company)
    apply(live, AgentSpawned(seat="ada", reason="claimed"))
    apply(live, AgentTurnStarted(seat="ada", turn_id="t1", trigger_event_id="w1"))
    row = apply(live, ExternalNotification(seat="ada", sender="sam", body="the trigger"), event_id="w1")
    assert row is not None and (row["state"], row["queued"]) == ("running", 0)
    row = apply(live, ExternalNotification(seat="ada", sender="sam", body="also this"), event_id="w2")
    assert row is not None and (row["state"], row["queued"]) == ("queued", 1)
    row = apply(live, AgentTurnCompleted(seat="ada", turn_id="t1"))
    assert row is not None and (row["state"], row["queued"]) == ("idle", 1)
    row = apply(live, AgentTurnStarted(seat="ada", turn_id="t2", trigger_event_id="w2"))
    assert row is not None and (row["state"], row["queued"]) == ("running", 0)


def test_a_digest_takes_off_exactly_the_wakes_it_merged_and_a_skip_its_own_trigger() -> None:
    live = LiveProjection(company=company)
    apply(live, AgentTurnStarted(seat="ada", turn_id="t1", trigger_event_id="w0"))
    for wake_id in ("w1", "w2", "w3", "w4"):
        apply(live, ExternalNotification(seat="ada", sender="sam", body=wake_id), event_id=wake_id)
    apply(live, AgentTurnCompleted(seat="ada", turn_id="t1"))
    apply(live, NotificationsCoalesced(seat="ada", partition_key="slack:C1:1", count=2, event_ids=["w1", "w3"]))
    row = apply(live, AgentTurnStarted(seat="ada", turn_id="t2", trigger_event_id="w1"))
    assert row is not None and (row["state"], row["queued"]) == ("queued", 2)
    row = apply(live, TurnTriggerSkipped(seat="ada", trigger_event_id="w4", reason="already worked"))
    assert row is not None and row["queued"] == 1
    row = apply(live, TurnTriggerSkipped(seat="ada", trigger_event_id="w4", reason="already worked"))
    assert row is not None and row["queued"] == 1


def test_a_schedules_record_is_its_task_and_an_a2a_record_waits_unnamed_until_a_turn_takes_it() -> None:
    live = LiveProjection(company=company)
    apply(live, AgentTurnStarted(seat="ada", turn_id="t1", trigger_event_id="task-1"))
    # The record of the schedule whose task this turn runs: it names the task, and is not queued behind it.
    row = apply(live, ScheduledTaskFired(seat="ada", schedule_id="standup", task_event_id="task-1"))
    assert row is not None and (row["state"], row["queued"]) == ("running", 0)
    row = apply(live, A2AMessageSent(from_seat="linus", to_seat="ada", message="the answer"))
    assert row is not None and (row["state"], row["queued"]) == ("queued", 1)
    apply(live, AgentTurnCompleted(seat="ada", turn_id="t1"))
    row = apply(live, AgentTurnStarted(seat="ada", turn_id="t2", trigger_event_id="a2a-answer"))
    assert row is not None and (row["state"], row["queued"]) == ("running", 0)


def test_a_company_with_no_provider_holds_its_seats_and_a_refused_budget_stops_one() -> None:
    org = company(providers=[])
    live = LiveProjection(company=lambda: org)
    apply(live, AgentSpawned(seat="ada"))
    apply(live, AgentSpawned(seat="linus"))
    ada = live.seat("ada")
    assert ada is not None and (ada["state"], ada["reason"]) == ("held", "no_provider")
    with_provider = LiveProjection(company=company)
    apply(with_provider, AgentSpawned(seat="linus"))
    apply(with_provider, AgentTurnStarted(seat="linus", turn_id="t9"))
    apply(with_provider, BudgetExhausted(seat="linus", turn_id="t9", period="day", spend=10, ceiling=10))
    row = apply(with_provider, AgentTurnCompleted(seat="linus", turn_id="t9", failed=True, error="budget"))
    assert row is not None and (row["state"], row["reason"]) == ("stopped", "budget")
    assert row["last_turn"]["outcome"] == "failed"
    row = apply(with_provider, LLMUnavailable(seat="linus", turn_id="t10"))
    assert row is not None and row["reason"] == "provider"


def test_a_released_seat_reads_absent_with_the_reason_until_it_is_spawned_again() -> None:
    live = LiveProjection(company=company)
    assert live.seat("ada")["state"] == "absent"  # type: ignore[index]
    apply(live, AgentSpawned(seat="ada", reason="claimed"))
    row = apply(live, AgentTerminated(seat="ada", reason="node stopping"))
    assert row is not None and (row["state"], row["reason"]) == ("absent", "node stopping")
    row = apply(live, AgentSpawned(seat="ada", reason="claimed"))
    assert row is not None and row["state"] == "idle"


def test_a_seat_row_names_the_node_running_it_and_a_former_nodes_late_release_does_not_clear_it() -> None:
    live = LiveProjection(company=company)

    def on(node: str, body: Any) -> Optional[dict[str, Any]]:
        event = made(body)
        event.node = node
        return live.apply(topics.event(event.type), event)

    assert live.seat("ada")["node"] == ""  # type: ignore[index]
    row = on("n1", AgentSpawned(seat="ada", reason="claimed"))
    assert row is not None and (row["state"], row["node"]) == ("idle", "n1")
    on("n2", AgentSpawned(seat="ada", reason="claimed"))
    row = on("n1", AgentTerminated(seat="ada", reason="rebalanced"))  # arrived after n2 took it
    assert row is not None and (row["state"], row["node"]) == ("idle", "n2")
    row = on("n2", AgentTerminated(seat="ada", reason="node stopping"))
    assert row is not None and (row["state"], row["node"], row["reason"]) == ("absent", "", "node stopping")


def test_the_feed_keeps_the_newest_rows_only_and_every_row_has_the_listing_shape() -> None:
    live = LiveProjection(company=company, feed_size=3)
    for i in range(5):
        apply(live, AgentTurnStarted(seat="ada", turn_id=f"t{i}"), event_id=f"ev-{i}")
    feed = live.snapshot()["feed"]
    assert [row["id"] for row in feed] == ["ev-4", "ev-3", "ev-2"]
    assert set(feed[0]) == {*qs.LIST_COLUMNS, "timestamp"} - {"ts"}


# -- the seed -------------------------------------------------------------------------------------------


async def test_a_seed_after_rows_exist_shows_the_feed_and_each_seats_last_turn_as_the_store_lists_them() -> None:
    org = company()
    async with memory_queues(NODE) as (_, [q]):
        writer = eventstore.attach(q)
        try:
            async with watching(q, org) as watched, running(q, org):
                await eventually(lambda: watched.seat("ada")["state"] == "idle", what="ada spawned")
                await delivered(q, "ada", wake("ada", "is the build green?"))
                await eventually(lambda: (watched.seat("ada")["last_turn"] or {}).get("outcome") == "ok", what="a turn")
                spend = made(AuxiliarySpend(stage="turn", seat="ada", calls=1, input_tokens=5, output_tokens=5))
                await q.publish(topics.event(spend.type), spend)
        finally:
            await writer.aclose()
    scope = qs.NodeScope(node_id=NODE)
    stored = await sync_to_async(qs.answer)(
        qs.Question(kind=qs.EVENTS, at=qs.instant(), filters=qs.Filters(feed_only=True), limit=300), scope
    )
    restarted = LiveProjection(company=lambda: org)
    assert await restarted.seed(scope) is True
    snapshot = restarted.snapshot()
    assert snapshot["seeded"] is True
    assert snapshot["feed"] == stored["events"]  # exactly what /api/events lists with feed_only
    # ...and the rows the live feed held: the same rows, though live ones stand in arrival order, which two
    # events stamped within a moment of each other by different tasks can reach in either order.
    live_rows = {row["id"]: row for row in watched.live.snapshot()["feed"]}
    assert {row["id"]: row for row in snapshot["feed"]} == live_rows
    assert "auxiliary_spend" not in {row["type"] for row in snapshot["feed"]}
    ada = restarted.seat("ada")
    assert ada is not None
    assert ada["last_turn"] == watched.seat("ada")["last_turn"]
    assert ada["state"] == "idle"
    assert snapshot["counters"]["turns_completed"] == 1 and snapshot["counters"]["tokens"] == watched.live.counters()["tokens"]
    assert restarted.seat("linus")["state"] == "absent"  # type: ignore[index]  # nothing shows it run


async def test_events_that_arrive_while_the_seed_reads_are_applied_after_it_and_counted_once() -> None:
    org = company()
    live = LiveProjection(company=lambda: org)
    async with memory_queues(NODE) as (_, [q]):
        writer = eventstore.attach(q)
        stream = await projection.subscribe(q, live)
        try:
            before = made(AgentTurnStarted(seat="ada", turn_id="t1"))
            await q.publish(topics.event(before.type), before)  # stored, and applied live before the seed
            seeding = asyncio.get_running_loop().create_task(live.seed(qs.NodeScope(node_id=NODE)))
            await asyncio.sleep(0)  # a yield, not a wait: the seed takes its instant and starts reading
            during = made(AgentTurnCompleted(seat="ada", turn_id="t1", input_tokens=2, output_tokens=3))
            await q.publish(topics.event(during.type), during)
            assert await seeding is True
            await eventually(lambda: live.counters()["events"] == 2, what="both events counted")
        finally:
            await stream.close()
            await writer.aclose()
    snapshot = live.snapshot()
    assert [row["id"] for row in snapshot["feed"]] == [during.id, before.id]
    assert snapshot["counters"] == {"turns_completed": 1, "turns_failed": 0, "tokens": 5, "events": 2}
    assert live.seat("ada")["state"] == "idle"  # type: ignore[index]


async def test_a_wake_whose_record_trails_a_turn_the_seed_found_running_is_not_left_queued_behind_later_turns() -> None:
    org = company()
    live = LiveProjection(company=lambda: org)
    started = made(AgentTurnStarted(seat="ada", turn_id="t1", trigger_event_id="w1"))
    async with memory_queues(NODE) as (_, [q]):
        writer = eventstore.attach(q)
        try:
            await q.publish(topics.event(started.type), started)  # stored while no projection watched
            scope = qs.NodeScope(node_id=NODE)

            def turn_stored() -> bool:
                turns = qs.Question(kind=qs.TURNS, at=qs.instant(), filters=qs.Filters(seat="ada"), limit=1)
                return bool(qs.answer(turns, scope)["turns"])

            await eventually(sync_to_async(turn_stored), what="the start stored")
        finally:
            await writer.aclose()
    seeding = asyncio.get_running_loop().create_task(live.seed(scope))
    await asyncio.sleep(0)  # a yield, not a wait: the seed takes its instant and starts reading
    live.apply(topics.event(started.type), started)  # the live copy of a row the seed reads: applied once
    assert await seeding is True
    assert live.seat("ada")["state"] == "running"  # type: ignore[index]
    row = apply(live, ExternalNotification(seat="ada", sender="sam", body="the trigger"), event_id="w1")
    assert row is not None and (row["state"], row["queued"]) == ("running", 0)
    apply(live, AgentTurnCompleted(seat="ada", turn_id="t1"))
    row = apply(live, AgentTurnStarted(seat="ada", turn_id="t2", trigger_event_id="w2"))
    assert row is not None and (row["state"], row["queued"]) == ("running", 0)


def test_the_engine_installs_the_projection_service_beside_the_writer() -> None:
    engine = Engine(load_settings({}, env={}, overrides={"node.id": NODE}), company=CompanyHolder(company()))
    eventstore.install(engine)
    names = [service.name for service in engine.registered]
    assert "eventstore_projection" in names and "eventstore_writer" in names


async def test_the_engines_projection_shows_the_company_it_was_handed_before_any_seat_runtime_runs() -> None:
    broker = MemoryBroker()

    async def connect(**kwargs: Any) -> Any:
        return broker.client(node=kwargs["node"]), None

    engine = Engine(
        load_settings({}, env={}, overrides={"node.id": NODE}),
        connect=connect,
        company=CompanyHolder(company(seats=[{"handle": "zed", "kind": "agent", "role": "engineer"}])),
    )
    eventstore.install(engine)
    serving = asyncio.create_task(engine.serve())
    try:
        await eventually(lambda: projection.current() is not None and projection.current().seeded, what="the seed")
        assert [seat["handle"] for seat in projection.running().snapshot()["seats"]] == ["zed"]
    finally:
        engine.stop()
        assert await serving == 0
    with pytest.raises(runtime.EngineAway, match=runtime.NO_ENGINE):
        projection.running()  # the engine stopped: no engine here, and no company made up
