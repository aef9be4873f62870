"""Pausing and resuming a seat: one compare-and-set winner, one announcement per change, the hold applied."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator

import pytest
from asgiref.sync import sync_to_async

from crewlet.queue import topics
from seats.actions import SeatNotFound, apause_seat, aresume_seat, pause_cas, pause_seat, resume_seat
from seats.delivery_models import SeatPause
from seats.inbox import HOLD_PAUSED
from seats_support import Recorder, eventually, memory_queues, running
from seats_support import in_thread

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "events"])]


@pytest.fixture(autouse=True)
async def _close_store_connections() -> AsyncIterator[None]:
    yield
    from django.db import connections

    await sync_to_async(connections.close_all)()


@sync_to_async
def pause_row(handle: str) -> SeatPause:
    return SeatPause.objects.get(handle=handle)


async def test_of_many_simultaneous_pauses_exactly_one_wins_and_announces() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        results = await asyncio.gather(*(apause_seat("ada", by=f"person{i}", queue=q) for i in range(6)))
        assert sorted(results) == [False] * 5 + [True]
        [paused] = rec.of("seat_paused")
        winner = paused.data.paused_by
        row = await pause_row("ada")
        assert row.paused and row.paused_by == winner and row.version == 1
        assert paused.source == "operator" and paused.data.paused_at


async def test_compare_and_set_from_racing_threads_has_exactly_one_winner() -> None:
    start = threading.Barrier(6)

    def contender(i: int) -> Any:
        start.wait()
        return pause_cas("ada", f"person{i}", "", "", False)

    changes = await asyncio.gather(*(asyncio.to_thread(in_thread, contender, i) for i in range(6)))
    winners = [c for c in changes if c is not None]
    assert len(winners) == 1 and winners[0].version == 1
    row = await pause_row("ada")
    assert row.paused_by == winners[0].by and row.version == 1


async def test_a_second_pause_is_no_change_but_amending_it_to_stop_the_running_turn_is_reannounced() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        assert await apause_seat("ada", by="grace", reason="lunch", queue=q) is True
        assert await apause_seat("ada", by="grace", reason="lunch", queue=q) is False
        assert await apause_seat("ada", by="alan", reason="stop it", stop_running=True, queue=q) is True
        assert await apause_seat("ada", by="alan", stop_running=True, queue=q) is False
        first, amended = rec.of("seat_paused")
        assert (first.data.stop_running, amended.data.stop_running) == (False, True)
        assert amended.data.paused_at == first.data.paused_at  # the same pause, amended

        assert await aresume_seat("ada", by="linus-owner", queue=q) is True
        assert await aresume_seat("ada", by="linus-owner", queue=q) is False
        [resumed] = rec.of("seat_resumed")
        assert (resumed.data.resumed_by, resumed.data.paused_by) == ("linus-owner", "alan")
        assert resumed.data.paused_at == first.data.paused_at
        assert (await pause_row("ada")).version == 3


async def test_a_pause_needs_a_queue_to_announce_on_and_an_agent_seat_to_pause() -> None:
    with pytest.raises(RuntimeError):
        await apause_seat("ada", by="grace")
    async with memory_queues() as (_, [q]):
        async with running(q) as runtime:
            with pytest.raises(SeatNotFound):
                await apause_seat("grace", by="grace")  # a human seat has no inbox to hold
            with pytest.raises(SeatNotFound):
                await apause_seat("nobody", by="grace")
        assert not await sync_to_async(SeatPause.objects.exists)()


async def test_the_sync_pause_commits_then_announces_on_the_engines_loop_and_holds_the_inbox() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        inbox = (topics.agent_inbox("ada"), topics.agent_inbox_group("ada"))
        async with running(q) as runtime:
            # An admin action or a sync API view runs in a worker thread, never on the engine's loop.
            assert await asyncio.to_thread(in_thread, pause_seat, "ada", "grace", "maintenance") is True
            assert await asyncio.to_thread(in_thread, pause_seat, "ada", "grace", "maintenance") is False
            assert HOLD_PAUSED in q.held(*inbox) and runtime.loops["ada"].paused
            assert len(rec.of("seat_paused", seat="ada")) == 1

            assert await asyncio.to_thread(in_thread, resume_seat, "ada", "grace") is True
            await eventually(lambda: HOLD_PAUSED not in q.held(*inbox))
            assert len(rec.of("seat_resumed", seat="ada")) == 1
            with pytest.raises(RuntimeError):
                pause_seat("ada", "grace")  # from the loop itself it would deadlock: refused
