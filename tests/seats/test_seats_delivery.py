"""The inbox loop on the memory twin and the test database: mailboxes, the ledger, holds, pauses, the gate."""
from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, EventQueue
from crewlet.events.tracing import Trace
from seats.actions import apause_seat, aresume_seat
from seats.delivery_models import LedgerEntry
from seats.inbox import HOLD_NO_PROVIDER, HOLD_PAUSED
from seats.ownership import SeatOwnership
from seats_support import (
    Recorder, company, drained, eventually, holder, inbox, memory_queues, recording_with_mailboxes, running, send, wake,
)

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

FIRST = MAX_DELIVERIES - 1  # ``remaining`` on a message's first delivery


@sync_to_async
def ledger_rows(seat: str) -> list[tuple[str, str]]:
    return list(LedgerEntry.objects.filter(seat=seat).order_by("id").values_list("trigger", "turn_id"))


# -- mailboxes before claims ------------------------------------------------------------------


async def test_start_creates_every_agent_seats_mailbox_before_it_claims_any() -> None:
    async with memory_queues() as (_, [q]):
        seen_at_first_claim: list[set[tuple[str, str]]] = []

        class Watching(SeatOwnership):
            async def claim(self, handle: str) -> bool:
                if not seen_at_first_claim:
                    refs = await q.list_subscriptions(topics.AGENT_ALL)
                    seen_at_first_claim.append({(r.topic, r.group) for r in refs})
                return await super().claim(handle)

        async with running(q, ownership=Watching("n1")) as rt:
            assert sorted(rt.loops) == ["ada", "linus"]
        mailboxes = seen_at_first_claim[0]
        for handle in ("ada", "linus"):
            assert inbox(handle) in mailboxes
            # the control subscription is made when a run of the seat needs it, not by the start's walk
            assert (topics.agent_control(handle), topics.agent_control_group(handle)) not in mailboxes
        assert not any("grace" in topic for topic, _ in mailboxes)  # a human has no inbox


async def test_a_wake_published_before_the_seats_loop_starts_is_delivered_once_it_starts() -> None:
    async with memory_queues() as (_, [q]):
        rec, org = await recording_with_mailboxes(q)
        sent = await send(q, "ada", wake("ada", "are you there?"))
        assert await q.backlog(*inbox("ada")) == 1

        async with running(q, org):
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"), what="ada's turn")
        [started] = rec.of("agent_turn_started", seat="ada")
        assert started.data.trigger_event_id == sent.id
        [phase] = rec.of("agent_phase_completed", seat="ada")
        assert phase.data.response == "sam: are you there?"  # the echo model answers with what it received
        [done] = rec.of("agent_turn_completed", seat="ada")
        assert done.data.failed is False and done.payload["outcome"] == "completed"
        await drained(q, "ada")


async def test_a_wake_for_a_seat_nobody_runs_waits_and_drains_when_the_seat_is_claimed() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        ownership = SeatOwnership("n1", claimable={"ada"})
        async with running(q, ownership=ownership) as rt:
            assert sorted(rt.loops) == ["ada"]
            await send(q, "linus", wake("linus", "review my branch"))
            await send(q, "ada", wake("ada", "after linus's"))
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            assert rec.of("agent_turn_started", seat="linus") == []
            assert await q.backlog(*inbox("linus")) == 1  # kept by its mailbox, not dropped

            ownership.allow("linus")
            await rt.rebalance()
            await eventually(lambda: rec.of("agent_turn_completed", seat="linus"), what="linus's turn")
            assert [r for _, r in rt.loops["linus"].stats.deliveries] == [FIRST]
        await drained(q, "linus")


async def test_a_human_seat_has_no_inbox_and_no_loop() -> None:
    async with memory_queues() as (_, [q]):
        async with running(q) as rt:
            assert "grace" not in rt.loops
            assert await q.list_subscriptions(topics.agent_pattern("grace")) == []


# -- the loop's own decisions -----------------------------------------------------------------


async def test_a_redelivered_trigger_that_was_already_worked_is_skipped_visibly_and_gets_no_second_turn() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q) as rt:
            first = await send(q, "ada", wake("ada", "deploy please", delivery_id="D-1"))
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            await drained(q, "ada")  # acked after the ledger row is written
            [(identity, turn_id)] = await ledger_rows("ada")
            assert identity == "delivery:slack:D-1"  # the provider's id, scoped by its source

            await send(q, "ada", first)  # the same event again, as a redelivery brings it
            await eventually(lambda: len(rec.of("turn_trigger_skipped")) == 1)
            # The provider's retry: a new event carrying the same delivery.
            retry = await send(q, "ada", wake("ada", "deploy please", delivery_id="D-1"))
            await eventually(lambda: len(rec.of("turn_trigger_skipped")) == 2)

            assert len(rec.of("agent_turn_started", seat="ada")) == 1
            skips = rec.of("turn_trigger_skipped")
            assert [s.data.trigger_event_id for s in skips] == [first.id, retry.id]
            assert {s.data.reason for s in skips} == {"already worked"}
            assert {s.data.turn_id for s in skips} == {turn_id}  # names the turn that worked it
            assert skips[0].trace_id == first.trace_id  # visible in the trigger's own trace
            await drained(q, "ada")
            assert rt.loops["ada"].stats.skipped == 2


async def test_same_id_duplicates_in_one_drain_make_one_turn() -> None:
    async with memory_queues() as (_, [q]):
        rec, org = await recording_with_mailboxes(q)
        twice = wake("ada", "hello")
        await send(q, "ada", twice)
        await send(q, "ada", twice)
        async with running(q, org) as rt:
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            await eventually(lambda: q.in_flight() == 0)
            assert rt.loops["ada"].stats.duplicates == 1
        assert len(rec.of("agent_turn_started")) == 1
        assert rec.of("turn_trigger_skipped") == []
        await drained(q, "ada")


async def test_wakes_of_one_conversation_waiting_together_are_one_turn_tagged_with_its_identity() -> None:
    async with memory_queues() as (_, [q]):
        rec, org = await recording_with_mailboxes(q)
        sent = [
            await send(q, "ada", wake("ada", f"message {i}", partition_key="slack:D1:17.1", conversation="slack:D1"))
            for i in range(3)
        ]
        async with running(q, org):
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
        [started] = rec.of("agent_turn_started")
        assert started.data.conversation_key == "slack:D1"
        [merged] = rec.of("notifications_coalesced")
        assert merged.data.partition_key == "slack:D1:17.1" and merged.data.count == 3
        [phase] = rec.of("agent_phase_completed")
        assert phase.data.user_prompt == "sam: message 0\nsam: message 1\nsam: message 2"
        await drained(q, "ada")  # acked after the ledger row is written
        assert {i for i, _ in await ledger_rows("ada")} == {f"event:{e.id}" for e in sent}


async def test_the_turn_runs_under_the_trace_of_the_event_that_woke_it() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        cause = Trace.root()
        async with running(q):
            await send(q, "ada", wake("ada", "traced", trace=cause))
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
        turn_events = [ev for _, ev in rec.seen if ev.type.startswith(("agent_turn", "agent_phase"))]
        assert turn_events and {ev.trace_id for ev in turn_events} == {cause.trace_id}
        [started] = rec.of("agent_turn_started")
        assert started.parent_span_id == cause.span_id  # the turn's span is a child of the delivery's
        assert started.span_id != cause.span_id


async def test_a_failing_turn_naks_its_partition_and_the_redelivery_runs() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        org = company(providers=[{"kind": "echo", "fail": True}])
        async with running(q, org) as rt:
            healed = company()

            async def heal(_topic: str, event: Any) -> None:
                if event.type == "llm_unavailable":
                    rt.holder.swap(healed)  # the next turn reads the providers afresh

            q.add_publish_listener(heal)
            sent = await send(q, "ada", wake("ada", "try twice"))
            await eventually(lambda: any(not e.data.failed for e in rec.of("agent_turn_completed")))
            assert [r for _, r in rt.loops["ada"].stats.deliveries] == [FIRST, FIRST - 1]
            assert [e.data.failed for e in rec.of("agent_turn_completed")] == [True, False]
            [unavailable] = rec.of("llm_unavailable")
            assert unavailable.data.providers == ["echo"]
            [fallback] = rec.of("provider_fallback")
            assert (fallback.data.from_provider_key, fallback.data.to_provider_key) == ("echo", "")
            await drained(q, "ada")  # acked after the ledger row is written
            assert [t for t, _ in await ledger_rows("ada")] == [f"event:{sent.id}"]


# -- holds -----------------------------------------------------------------------------------------


async def test_with_no_model_provider_the_inbox_is_held_and_the_apply_that_adds_one_runs_the_held_work() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q, company(providers=[])) as rt:
            assert HOLD_NO_PROVIDER in q.held(*inbox("ada"))  # taken before the mailbox was attached
            await send(q, "ada", wake("ada", "anyone?"))
            assert await q.backlog(*inbox("ada")) == 1
            assert list(rt.loops["ada"].stats.deliveries) == []  # held: not even fetched

            await rt.apply(company())
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            assert HOLD_NO_PROVIDER not in q.held(*inbox("ada"))
            assert [r for _, r in rt.loops["ada"].stats.deliveries] == [FIRST]  # nothing spent waiting
        await drained(q, "ada")


async def test_a_delivery_reaching_a_seat_with_no_provider_takes_the_hold_and_goes_back_unconsumed() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q) as rt:
            rt.holder.swap(company(providers=[]))  # raced: the loop is attached, the company lost its model
            await send(q, "ada", wake("ada", "still there?"))
            await eventually(lambda: HOLD_NO_PROVIDER in q.held(*inbox("ada")))
            await eventually(lambda: rt.loops["ada"].stats.deferred == 1)
            assert await q.backlog(*inbox("ada")) == 1
            assert rec.of("agent_turn_started") == []

            await rt.apply(company())
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            assert [r for _, r in rt.loops["ada"].stats.deliveries] == [FIRST, FIRST - 1]
        await drained(q, "ada")
        assert await q.dead_letters() == []


async def test_a_pause_taken_while_a_drain_is_collected_hands_the_whole_drain_back() -> None:
    async with memory_queues() as (broker, [q]):
        rec = Recorder().attach(q)
        async with running(q, company(window_s=30)) as rt:
            consumer = broker.consumer(*inbox("ada"))
            await send(q, "ada", wake("ada", "first"))
            await eventually(lambda: bool(consumer.inflight), what="the drain holds the first message")
            await send(q, "ada", wake("ada", "second"))
            await eventually(lambda: len(consumer.inflight) == 2, what="the linger collected the second")

            assert await apause_seat("ada", by="grace", reason="reviewing its config") is True
            await eventually(lambda: not consumer.inflight and len(consumer.available) == 2, what="hand-back")
            assert list(rt.loops["ada"].stats.deliveries) == []  # no partition reached the handler
            assert rec.of("agent_turn_started") == []
            assert HOLD_PAUSED in q.held(*inbox("ada"))
            [paused] = rec.of("seat_paused")
            assert (paused.data.seat, paused.data.paused_by, paused.data.reason) == ("ada", "grace", "reviewing its config")

            await rt.apply(company(window_s=0))  # hot-reloaded: the next drain does not linger
            assert await aresume_seat("ada", by="grace") is True
            await eventually(lambda: len(rec.of("agent_turn_completed", seat="ada")) == 2)
            assert [r for _, r in rt.loops["ada"].stats.deliveries] == [FIRST - 1, FIRST - 1]  # one delivery each
            assert len(rec.of("seat_resumed")) == 1
        await drained(q, "ada")


async def test_a_paused_seat_on_another_node_is_held_here_by_the_store_not_the_event() -> None:
    async with memory_queues("n1", "n2") as (_, [q1, q2]):
        rec = Recorder().attach(q1, q2)
        org = company(seats=[{"handle": "ada", "kind": "agent"}])
        async with running(q1, org, pause_poll_s=0.02) as rt:
            assert await apause_seat("ada", by="grace", queue=q2) is True  # the call reached node n2
            await eventually(lambda: rt.loops["ada"].paused, what="n1 learns the pause")
            await send(q2, "ada", wake("ada", "wait for it"))
            assert await q1.backlog(*inbox("ada")) == 1
            assert await aresume_seat("ada", by="grace", queue=q2) is True
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))


async def test_a_pause_with_stop_running_cancels_a_turn_whose_round_never_ends_after_the_grace_and_records_it_as_worked() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        hung = company(providers=[{"kind": "echo", "delay_s": 3600}])  # a provider call that would not return
        async with running(q, hung, stop_grace_s=0.2) as rt:
            sent = await send(q, "ada", wake("ada", "a long one"))
            await eventually(lambda: rec.of("agent_turn_started", seat="ada"))
            assert await apause_seat("ada", by="grace", reason="wrong repo", stop_running=True) is True
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            [stopped] = rec.of("agent_turn_stopped")
            assert (stopped.data.stopped_by, stopped.data.reason) == ("grace", "wrong repo")
            [done] = rec.of("agent_turn_completed")
            assert done.data.stopped is True and done.data.failed is False
            await drained(q, "ada")  # acked after the ledger row is written
            assert [t for t, _ in await ledger_rows("ada")] == [f"event:{sent.id}"]
            assert rt.loops["ada"].paused


# -- the node's concurrency gate -----------------------------------------------------------


async def test_past_max_concurrent_a_turn_waits_in_this_process_and_is_never_handed_back() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        org = company(max_concurrent=1, providers=[{"kind": "echo", "delay_s": 0.3}])
        async with running(q, org) as rt:
            await send(q, "ada", wake("ada", "one"))
            await send(q, "linus", wake("linus", "two"))
            await eventually(lambda: rt.gate.waiting == 1, what="one turn waits at the gate")
            await eventually(lambda: len(rec.of("agent_turn_completed")) == 2)
            assert rt.gate.peak == 1
            for handle in ("ada", "linus"):
                assert [r for _, r in rt.loops[handle].stats.deliveries] == [FIRST]
                assert rt.loops[handle].stats.deferred == 0
        running_now = peak = 0
        for etype in [t for t in rec.types() if t in ("agent_turn_started", "agent_turn_completed")]:
            running_now += 1 if etype == "agent_turn_started" else -1
            peak = max(peak, running_now)
        assert peak == 1


async def test_an_applied_company_hot_reloads_the_coalesce_knobs_and_the_gate() -> None:
    async with memory_queues() as (_, [q]):
        async with running(q) as rt:
            options = rt.loops["ada"].options
            await rt.apply(company(window_s=7, max_batch=3, max_concurrent=2))
            assert rt.loops["ada"].options is options  # the batch layer's own object, mutated in place
            assert (options.linger_s, options.max_batch, rt.gate.limit) == (7, 3, 2)


async def test_the_node_setting_caps_the_companys_max_concurrent_and_never_raises_it() -> None:
    async with memory_queues() as (_, [q]):
        async with running(q, company(max_concurrent=4), node_max_concurrent=2) as rt:
            assert rt.gate.limit == 2  # this machine takes two, whatever the company asks
            await rt.apply(company(max_concurrent=1))
            assert rt.gate.limit == 1  # the company asks for fewer: fewer it is
            await rt.apply(company(max_concurrent=8))
            assert rt.gate.limit == 2


async def test_an_applied_company_stops_a_removed_seats_loop_and_starts_an_added_ones() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q) as rt:
            assert rt.healthy()
            await rt.apply(
                company(seats=[{"handle": "ada", "kind": "agent"}, {"handle": "hopper", "kind": "agent"}])
            )
            assert sorted(rt.loops) == ["ada", "hopper"]
            assert inbox("hopper") in {(r.topic, r.group) for r in await q.list_subscriptions(topics.AGENT_ALL)}
            assert [e.data.seat for e in rec.of("agent_terminated")] == ["linus"]
            assert rt.healthy()
            await send(q, "hopper", wake("hopper", "welcome"))
            await eventually(lambda: rec.of("agent_turn_completed", seat="hopper"))
        assert not rt.healthy()


async def test_installed_on_an_engine_the_runtime_starts_with_the_queue_and_stops_with_the_engine() -> None:
    import asyncio

    from crewlet.company.loading import load_settings
    from crewlet.engine.core import Engine
    from crewlet.queue.memory import MemoryBroker
    from crewlet.engine.interfaces import SEAT_RUNTIME
    from seats import runtime_service as seat_runtime
    from seats_support import FAST

    broker = MemoryBroker(FAST)

    async def connect(**kwargs: Any) -> Any:
        return broker.client(node=kwargs["node"]), None

    engine = Engine(load_settings({}, env={}, overrides={"node.id": "n9"}), connect=connect, timings=FAST, company=holder())
    seat_runtime.install(engine, run_scheduler=False)
    serving = asyncio.create_task(engine.serve())
    try:
        await eventually(lambda: engine.find(SEAT_RUNTIME) is not None and engine.find(SEAT_RUNTIME).healthy())
        rt = engine.find(SEAT_RUNTIME)
        assert rt is not None and rt.node_id == "n9" and sorted(rt.loops) == ["ada", "linus"]
        assert engine.queue is not None
        rec = Recorder().attach(engine.queue)
        await send(engine.queue, "ada", wake("ada", "hello engine"))
        await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
    finally:
        engine.stop()
        assert await serving == 0
    assert engine.find(SEAT_RUNTIME) is None and not rt.healthy()


# -- the digest seam -----------------------------------------------------------------------------


async def _conversation(q: EventQueue, n: int) -> list[Any]:
    return [
        await send(q, "ada", wake("ada", f"message {i}", partition_key="jira:POC-7", conversation="jira:POC-7"))
        for i in range(n)
    ]


async def test_a_merged_partition_is_one_turn_and_every_constituent_is_recorded_as_worked() -> None:
    from crewlet import events as ev_module
    from crewlet.events.types import ExternalNotification

    def merge(evs: Any) -> Any:
        return ev_module.new(
            ExternalNotification(seat="ada", body=" / ".join(e.payload["body"] for e in evs)),
            Trace.of(evs[0]) or Trace.root(),
            extras={"conversation_identity": "jira:POC-7", "body": "digest"},
        )

    async with memory_queues() as (_, [q]):
        rec, org = await recording_with_mailboxes(q)
        sent = await _conversation(q, 3)
        async with running(q, org, merge=merge):
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            await drained(q, "ada")
        [started] = rec.of("agent_turn_started")
        assert started.data.conversation_key == "jira:POC-7"
        assert [r.data.seat for r in rec.of("notifications_coalesced")] == ["ada"]  # one record, whatever merged
        assert {t for t, _ in await ledger_rows("ada")} == {f"event:{e.id}" for e in sent}


async def test_a_degraded_merge_records_only_the_event_it_ran_and_the_requeued_tail_still_gets_its_turns() -> None:
    def degrade(evs: Any) -> Any:
        raise ValueError("a merge that cannot merge these")  # the tail is requeued FIRST, the oldest runs alone

    async with memory_queues() as (_, [q]):
        rec, org = await recording_with_mailboxes(q)
        sent = await _conversation(q, 3)
        async with running(q, org, merge=degrade):
            await eventually(lambda: len(rec.of("agent_turn_completed", seat="ada")) == 3)
            await drained(q, "ada")
        assert rec.of("turn_trigger_skipped") == []
        assert [r.data.trigger_event_id for r in rec.of("agent_turn_started")] == [e.id for e in sent]
        assert sorted(t for t, _ in await ledger_rows("ada")) == sorted(f"event:{e.id}" for e in sent)


def test_a_triggers_identity_is_the_providers_message_then_delivery_id_else_the_event_id() -> None:
    from seats.ledger import trigger_identity

    both = wake("ada", "x", delivery_id="Ev1")
    both.payload["message_id"] = "1718.001"
    assert trigger_identity(both) == "message:slack:1718.001"
    assert trigger_identity(wake("ada", "x", delivery_id="Ev1")) == "delivery:slack:Ev1"
    plain = wake("ada", "x")
    assert trigger_identity(plain) == f"event:{plain.id}"
