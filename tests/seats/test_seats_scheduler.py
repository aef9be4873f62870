"""The scheduler: a schedule's slot fires once across a fleet sharing the coordination store."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest
from asgiref.sync import sync_to_async

from crewlet.queue import topics
from seats.delivery_models import ScheduleFiring
from seats.runtime import SeatRuntime
from seats.scheduler import slot_of
from seats_support import Recorder, company, eventually, holder, memory_queues, scheduling_nodes

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

T0 = datetime(2025, 6, 2, 9, 30, tzinfo=timezone.utc).timestamp()
STANDUP = [{"name": "standup", "seat": "ada", "every": "24h", "task": "Post the stand-up summary"}]


@sync_to_async
def firings() -> list[tuple[str, int, str]]:
    return list(ScheduleFiring.objects.order_by("slot").values_list("schedule", "slot", "node"))


async def test_two_nodes_sharing_the_store_fire_a_slot_once_and_the_task_becomes_one_turn() -> None:
    now = [T0]
    async with memory_queues("n1", "n2") as (_, [q1, q2]):
        async with scheduling_nodes([q1, q2], STANDUP, now) as (rec, runtimes):
            await eventually(lambda: all(rt.scheduler.passes >= 3 for rt in runtimes), what="several passes each")
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"), what="the task's turn")
            [task] = rec.of("task_assigned")
            assert (task.data.seat, task.data.title, task.data.assigned_by) == ("ada", "Post the stand-up summary", "scheduler")
            [fired] = rec.of("scheduled_task_fired")
            assert (fired.data.schedule_name, fired.data.task_event_id) == ("standup", task.id)
            [(name, slot, node)] = await firings()
            assert name == "standup" and slot == int(T0 // 86400) * 86400 * 1000
            assert node == task.node  # the node whose insert landed is the one that published
            [started] = rec.of("agent_turn_started", seat="ada")
            assert started.data.trigger_type == "task_assigned" and started.data.trigger_event_id == task.id

            now[0] += 86400  # the next day's slot
            await eventually(lambda: len(rec.of("task_assigned")) == 2, what="the next slot")
            passes = [rt.scheduler.passes for rt in runtimes]
            await eventually(lambda: all(rt.scheduler.passes >= p + 3 for rt, p in zip(runtimes, passes)))
            assert len(rec.of("task_assigned")) == 2 and len(await firings()) == 2


async def test_racing_passes_on_two_nodes_publish_one_task() -> None:
    async with memory_queues("n1", "n2") as (_, [q1, q2]):
        rec = Recorder().attach(q1, q2)
        org = company(schedules=STANDUP)
        await asyncio.gather(*(q.ensure_subscription(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")) for q in (q1, q2)))
        schedulers = [SeatRuntime(q, holder(org), run_scheduler=False).scheduler for q in (q1, q2)]
        results = await asyncio.gather(*(s.fire_due(T0) for s in schedulers for _ in range(3)))
        assert sum(len(r) for r in results) == 1
        assert len(rec.of("task_assigned")) == 1 and len(rec.of("scheduled_task_fired")) == 1
        assert await q1.backlog(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")) == 1


def test_every_node_computes_the_same_slot_for_the_same_instant() -> None:
    org = company(schedules=[{"name": "hourly", "seat": "ada", "every": "1h", "task": "t"}])
    [hourly] = org.schedules
    assert slot_of(hourly, 3600 * 5 + 1) == slot_of(hourly, 3600 * 6 - 0.001) == 3600 * 5 * 1000
    assert slot_of(hourly, 3600 * 6) == 3600 * 6 * 1000
