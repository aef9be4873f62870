"""Cron schedules: 09:00 local on weekdays across both daylight-saving changes, once per slot on a three-node fleet.

Every clock here is injected (``scheduler_clock``); a test moves it and waits
for the scheduler's passes to see the new instant, never for time to pass.
"""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import sync_to_async

from crewlet.base.db import in_store
from crewlet.fleet import leases
from crewlet.fleet.leases import DUTY
from crewlet.fleet.member import FleetMember
from seats.delivery_models import ScheduleFiring
from seats.runtime import DUTY_SCHEDULER, SeatRuntime
from seats.scheduler import StartedClock, prune_firings, slot_of
from seats_support import Recorder, company, eventually, holder, memory_queues

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

BERLIN = ZoneInfo("Europe/Berlin")
STANDUP = {"name": "standup", "seat": "ada", "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin", "task": "Post the stand-up summary"}


def berlin(*parts: int) -> float:
    return datetime(*parts, tzinfo=BERLIN).timestamp()


def utc_ms(*parts: int) -> int:
    return int(datetime(*parts, tzinfo=timezone.utc).timestamp()) * 1000


#: (instant, firings so far) steps and the slots fired, in UTC: 09:00 Berlin is 08:00Z in winter and 07:00Z in summer.
CASES: dict[str, tuple[list[tuple[float, int]], list[int]]] = {
    "march": (
        [
            (berlin(2025, 3, 27, 12, 0), 0),  # Thursday noon: this morning's 09:00 passed before the schedule existed
            (berlin(2025, 3, 28, 8, 59, 59), 0),
            (berlin(2025, 3, 28, 9, 0), 1),
            (berlin(2025, 3, 28, 17, 0), 1),
            (berlin(2025, 3, 29, 9, 0), 1),  # Saturday
            (berlin(2025, 3, 30, 9, 30), 1),  # Sunday: the clocks went forward at 02:00
            (berlin(2025, 3, 31, 8, 59, 59), 1),  # 06:59:59Z
            (berlin(2025, 3, 31, 9, 0), 2),  # 07:00Z
            (berlin(2025, 3, 31, 10, 0), 2),  # 08:00Z, where a UTC-only schedule would have put it
        ],
        [utc_ms(2025, 3, 28, 8), utc_ms(2025, 3, 31, 7)],
    ),
    "october": (
        [
            (berlin(2025, 10, 23, 12, 0), 0),
            (berlin(2025, 10, 24, 8, 59, 59), 0),
            (berlin(2025, 10, 24, 9, 0), 1),
            (berlin(2025, 10, 24, 17, 0), 1),
            (berlin(2025, 10, 25, 9, 0), 1),  # Saturday
            (berlin(2025, 10, 26, 9, 30), 1),  # Sunday: the clocks went back at 03:00
            (berlin(2025, 10, 27, 8, 0), 1),  # 07:00Z, where the summer's slot was
            (berlin(2025, 10, 27, 8, 59, 59), 1),
            (berlin(2025, 10, 27, 9, 0), 2),  # 08:00Z
        ],
        [utc_ms(2025, 10, 24, 7), utc_ms(2025, 10, 27, 8)],
    ),
}


@sync_to_async
def firings() -> list[tuple[str, int]]:
    return list(ScheduleFiring.objects.order_by("slot").values_list("schedule", "slot"))


async def taken_from(node: str) -> bool:
    """Whether another node than ``node`` now holds the scheduler's duty."""
    holder_now = await in_store(leases.holder_of)(DUTY, DUTY_SCHEDULER)
    return bool(holder_now) and holder_now != node


@pytest.mark.parametrize("change", list(CASES))
async def test_a_berlin_weekday_cron_fires_at_nine_local_across_the_clock_change_once_per_slot_on_three_nodes(change: str) -> None:
    steps, slots = CASES[change]
    now = [steps[0][0]]
    org = company(schedules=[STANDUP])
    async with memory_queues("n1", "n2", "n3") as (_, queues):
        rec = Recorder().attach(*queues)
        members = [FleetMember(q.node, ttl_s=1.0) for q in queues]
        runtimes = [
            SeatRuntime(q, holder(org), scheduler_tick_s=0.02, scheduler_clock=lambda: now[0], hold_duty=m.hold_duty)
            for q, m in zip(queues, members)
        ]
        running = list(runtimes)
        await asyncio.gather(*(rt.start() for rt in runtimes))
        try:
            for i, (instant, expected) in enumerate(steps):
                now[0] = instant
                passes = sum(rt.scheduler.passes for rt in running)
                await eventually(lambda: sum(rt.scheduler.passes for rt in running) >= passes + 3, what=f"passes at step {i}")
                # Every node racing a pass of its own at the same instant, outside the duty, fires nothing more.
                raced = await asyncio.gather(*(rt.scheduler.fire_due() for rt in running for _ in range(2)))
                assert sum(len(r) for r in raced) == 0, f"step {i}"
                assert len(rec.of("task_assigned")) == expected == len(await firings()), f"step {i}"
                if i == 3:  # the node running the scheduler stops; another takes its duty when the lease runs out
                    node = await in_store(leases.holder_of)(DUTY, DUTY_SCHEDULER)
                    stopped = next(rt for rt in running if rt.node_id == node)
                    running.remove(stopped)
                    await stopped.stop()
                    await eventually(lambda: taken_from(node), what="the duty taken by another node", timeout_s=15)
            assert [slot for _, slot in await firings()] == slots
            fired = rec.of("scheduled_task_fired")
            assert [f.data.task_event_id for f in fired] == [t.id for t in rec.of("task_assigned")]
            assert len({t.id for t in rec.of("task_assigned")}) == 2
        finally:
            await asyncio.gather(*(rt.stop() for rt in running))


async def test_a_cron_schedule_fires_no_slot_from_before_it_existed_but_still_owes_one_missed_while_its_nodes_were_down() -> None:
    org = company(schedules=[STANDUP])
    async with memory_queues("n1") as (_, [q]):
        rec = Recorder().attach(q)
        first = SeatRuntime(q, holder(org), run_scheduler=False).scheduler
        await first.note_schedules(berlin(2025, 6, 3, 10, 0))  # first seen on a Tuesday at 10:00
        assert await first.fire_due(berlin(2025, 6, 3, 10, 0)) == []
        # Every node down from Tuesday evening until Wednesday 11:30: the one that comes back fires 09:00 at once.
        restarted = SeatRuntime(q, holder(org), run_scheduler=False).scheduler
        [task_id] = await restarted.fire_due(berlin(2025, 6, 4, 11, 30))
        assert [slot for _, slot in await firings()] == [utc_ms(2025, 6, 4, 7)]
        assert rec.of("task_assigned")[0].id == task_id
        # Its cadence changed at 11:45 to 08:00: a new schedule, so today's 08:00 is not owed; tomorrow's is.
        moved = company(schedules=[{**STANDUP, "cron": "0 8 * * 1-5"}])
        later = SeatRuntime(q, holder(moved), run_scheduler=False).scheduler
        assert await later.fire_due(berlin(2025, 6, 4, 11, 45)) == []
        assert len(await later.fire_due(berlin(2025, 6, 5, 8, 0))) == 1
        assert [slot for _, slot in await firings()] == [utc_ms(2025, 6, 4, 7), utc_ms(2025, 6, 5, 6)]


async def test_an_every_schedule_still_fires_the_slot_it_is_first_seen_in_at_once() -> None:
    org = company(schedules=[{"name": "daily", "seat": "ada", "every": "24h", "task": "t"}])
    async with memory_queues("n1") as (_, [q]):
        scheduler = SeatRuntime(q, holder(org), run_scheduler=False).scheduler
        await scheduler.note_schedules(berlin(2025, 6, 3, 10, 0))
        assert len(await scheduler.fire_due(berlin(2025, 6, 3, 10, 0))) == 1
        assert [slot for _, slot in await firings()] == [utc_ms(2025, 6, 3, 0)]


def test_a_cron_slot_is_the_latest_instant_at_or_before_now_in_its_own_zone() -> None:
    org = company(
        schedules=[STANDUP, {"name": "nightly", "seat": "ada", "cron": "30 2 * * *", "timezone": "Europe/Berlin", "task": "t"}]
    )
    standup, nightly = org.schedules
    assert slot_of(standup, berlin(2025, 3, 31, 9, 0)) == slot_of(standup, berlin(2025, 4, 1, 8, 59, 59)) == utc_ms(2025, 3, 31, 7)
    # 02:30 does not exist on the spring change: Debian cron runs it at 03:00 CEST, once.
    assert slot_of(nightly, berlin(2025, 3, 30, 12, 0)) == utc_ms(2025, 3, 30, 1)
    # 02:30 happens twice on the autumn change: it fires at the first, and stays that slot through the second.
    first = utc_ms(2025, 10, 26, 0, 30)
    for minutes in (30, 45, 60, 90, 120):
        assert slot_of(nightly, datetime(2025, 10, 26, tzinfo=timezone.utc).timestamp() + minutes * 60) == first


def test_pruning_old_firings_keeps_each_schedules_latest_so_a_long_slot_is_not_fired_again() -> None:
    old = datetime(2025, 1, 1, tzinfo=timezone.utc)
    rows: list[dict[str, Any]] = [
        {"schedule": "monthly", "slot": 1, "fired_at": old},
        {"schedule": "monthly", "slot": 2, "fired_at": old + timedelta(days=1)},
        {"schedule": "daily", "slot": 5, "fired_at": old + timedelta(days=40)},
    ]
    for row in rows:
        ScheduleFiring.objects.create(seat="ada", task_event_id="t", **row)
    assert prune_firings(old + timedelta(days=30)) == 1
    assert sorted(ScheduleFiring.objects.values_list("schedule", "slot")) == [("daily", 5), ("monthly", 2)]


def test_the_rehearsal_clock_starts_at_its_instant_when_first_read_and_runs_at_real_speed() -> None:
    ticks = iter([100.0, 100.0, 102.5])
    clock = StartedClock(berlin(2025, 3, 31, 8, 59, 58), monotonic=lambda: next(ticks))
    assert clock() == clock() == berlin(2025, 3, 31, 8, 59, 58)
    assert clock() == berlin(2025, 3, 31, 9, 0, 0) + 0.5
