"""The delivery core on the shipped stack: a real nats-server (the embedded broker) and the test database."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES
from seats.actions import apause_seat, aresume_seat
from seats.inbox import HOLD_NO_PROVIDER
from seats.mailboxes import ensure_control_mailbox, ensure_mailboxes, mailbox_refs, retire_absent
from seats_support import (
    Recorder, company, drained, eventually, inbox, jetstream_queues, recording_with_mailboxes, running,
    scheduling_nodes, send, wake,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

FIRST = MAX_DELIVERIES - 1
T0 = datetime(2025, 6, 2, 9, 0, tzinfo=timezone.utc)


async def test_a_wake_sent_before_any_loop_runs_waits_on_the_broker_and_its_redelivery_is_skipped() -> None:
    async with jetstream_queues() as [q]:
        rec, org = await recording_with_mailboxes(q)
        sent = await send(q, "ada", wake("ada", "first thing", delivery_id="slack:Ev1"))
        # Interest retention kept it (the mailbox existed). JetStream updates a consumer's pending count a moment
        # after the publish is acked, so the depth is a gauge to wait on, not a fact to read at once.
        await eventually(lambda: _eq(q.backlog(*inbox("ada")), 1), what="the wake waiting in ada's mailbox")
        async with running(q, org):
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"), what="the waiting wake's turn")
            await drained(q, "ada")
            await send(q, "ada", sent)  # the same trigger comes round again
            await eventually(lambda: rec.of("turn_trigger_skipped"), what="the skip")
            await drained(q, "ada")
        assert len(rec.of("agent_turn_started")) == 1
        [skip] = rec.of("turn_trigger_skipped")
        assert (skip.data.trigger_event_id, skip.data.reason) == (sent.id, "already worked")


async def test_no_provider_holds_the_inbox_on_the_broker_until_an_apply_adds_one() -> None:
    async with jetstream_queues() as [q]:
        rec = Recorder().attach(q)
        async with running(q, company(providers=[])) as rt:
            await send(q, "ada", wake("ada", "queued while no model"))
            assert HOLD_NO_PROVIDER in q.held(*inbox("ada"))
            await eventually(lambda: _eq(q.backlog(*inbox("ada")), 1), what="the wake held in ada's mailbox")
            await rt.apply(company())
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            await drained(q, "ada")
            assert [r for _, r in rt.loops["ada"].stats.deliveries] == [FIRST]


async def test_a_pause_during_the_linger_hands_the_drain_back_on_the_real_broker() -> None:
    async with jetstream_queues() as [q]:
        rec = Recorder().attach(q)
        transport: Any = q.transport  # type: ignore[attr-defined]

        async def consumer(field: str) -> int:
            info = await transport.consumer_info(*inbox("ada"))
            return int((info or {}).get(field, 0))

        async with running(q, company(window_s=30)) as rt:
            await send(q, "ada", wake("ada", "collect me"))
            await eventually(lambda: _eq(consumer("num_ack_pending"), 1), what="the drain is lingering with the message")
            assert await apause_seat("ada", by="grace") is True
            # The held attachment stops asking: its pull request is gone from the broker. (A
            # handed-back message stays in num_ack_pending until it is redelivered, so that
            # count cannot show the hand-back; the delivery it spent, below, does.)
            await eventually(lambda: _eq(consumer("num_waiting"), 0), what="the drain stopped fetching")
            assert list(rt.loops["ada"].stats.deliveries) == [] and rec.of("agent_turn_started") == []
            await rt.apply(company(window_s=0))
            assert await aresume_seat("ada", by="grace") is True
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            assert [r for _, r in rt.loops["ada"].stats.deliveries] == [FIRST - 1]
            await drained(q, "ada")


async def _eq(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def test_the_gate_holds_the_second_seats_turn_in_process_and_a_failed_turn_comes_back() -> None:
    async with jetstream_queues() as [q]:
        rec = Recorder().attach(q)
        org = company(max_concurrent=1, providers=[{"kind": "echo", "delay_s": 0.2}])
        async with running(q, org) as rt:
            await send(q, "ada", wake("ada", "one"))
            await send(q, "linus", wake("linus", "two"))
            await eventually(lambda: len(rec.of("agent_turn_completed")) == 2)
            assert rt.gate.peak == 1
            for handle in ("ada", "linus"):
                assert [r for _, r in rt.loops[handle].stats.deliveries] == [FIRST]

            healed = company()

            async def heal(_topic: str, event: Any) -> None:
                if event.type == "llm_unavailable":
                    rt.holder.swap(healed)

            q.add_publish_listener(heal)
            rt.holder.swap(company(providers=[{"kind": "echo", "fail": True}]))
            await send(q, "ada", wake("ada", "fails once"))
            await eventually(lambda: len(rec.of("agent_turn_completed", seat="ada")) == 3)
            assert [r for _, r in rt.loops["ada"].stats.deliveries][1:] == [FIRST, FIRST - 1]  # NAKed, redelivered
            await drained(q, "ada")


async def test_two_jetstream_nodes_fire_a_schedule_slot_once() -> None:
    now = [T0.timestamp()]
    schedules = [{"name": "standup", "seat": "ada", "every": "24h", "task": "Post the stand-up summary"}]
    async with jetstream_queues("n1", "n2") as [q1, q2]:
        async with scheduling_nodes([q1, q2], schedules, now) as (rec, runtimes):
            await eventually(lambda: all(rt.scheduler.passes >= 3 for rt in runtimes))
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"))
            assert len(rec.of("task_assigned")) == 1 and len(rec.of("agent_turn_started")) == 1


async def test_retirement_finds_and_deletes_mailboxes_on_the_real_broker() -> None:
    async with jetstream_queues() as [q]:
        await ensure_mailboxes(q, company(), now=T0)
        await ensure_control_mailbox(q, "linus")
        await send(q, "linus", wake("linus", "left behind"))
        without_linus = company(seats=[{"handle": "ada", "kind": "agent"}, {"handle": "grace", "kind": "human"}])
        await retire_absent(q, without_linus, now=T0)
        report = await retire_absent(q, without_linus, now=T0 + timedelta(hours=24))
        assert report.retired == ["linus"] and set(report.deleted) == set(mailbox_refs("linus"))
        assert await q.list_subscriptions(topics.agent_pattern("linus")) == []
        assert set(await q.list_subscriptions(topics.agent_pattern("ada"))) == {mailbox_refs("ada")[0]}
