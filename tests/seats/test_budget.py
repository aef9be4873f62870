"""Token budgets that pause and ask, on a real seat runtime over the memory twin with the counters in the test database.

A seat over its ceiling: its next turn ends with ``budget_exhausted``, its
mail waits under the budget hold (nothing fetched, nothing dead-lettered),
and a raised ceiling or a new calendar window runs the held mail once each.
Three nodes on one coordination store count the company's window once.
The clock is a :class:`ManualClock` the test moves across midnight.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Optional

import pytest
from asgiref.sync import sync_to_async

from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import parse_company
from crewlet.events.types import METER_EXHAUSTED, METERS_ON_REFUSAL
from seats.budget import BudgetKeeper, charge, meters
from seats.budget_models import TokenUsage
from seats.delivery_models import LedgerEntry
from seats.inbox import HOLD_BUDGET
from seats.provider_base import Completion, ModelRequest
from seats.turn_types import OUTCOME_COMPLETED, OUTCOME_FAILED, Trigger
from seats.turns import TurnRunner
from seats_support import Recorder, drained, eventually, inbox, memory_queues, running, send, wake
from waiting_support import ManualClock

DB = pytest.mark.django_db(transaction=True, databases=["default", "events"])
pytestmark = [pytest.mark.usefixtures("close_store_connections")]
#: 2025-06-01 20:00 UTC: 22:00 in Berlin, two hours before its day ends.
EVENING = datetime(2025, 6, 1, 20, 0, tzinfo=timezone.utc).timestamp()


class Billed:
    """A model that answers every call with ``text`` and bills 8 + 4 tokens for it."""

    key = "billed"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def complete(self, request: ModelRequest) -> Completion:
        self.calls.append(request.messages[0].text)
        return Completion(text="done", input_tokens=8, output_tokens=4, model="billed")

    async def aclose(self) -> None:
        return None


def acme(budget: Optional[dict[str, int]] = None, ada: Optional[dict[str, int]] = None) -> Organization:
    seat: dict[str, Any] = {"handle": "ada", "kind": "agent", "role": "engineer"}
    if ada is not None:
        seat["budget"] = ada
    body: dict[str, Any] = {
        "org": "acme", "timezone": "Europe/Berlin", "providers": {"llm": [{"kind": "echo"}]},
        "notification_coalesce_window_seconds": 0,
        "seats": [seat, {"handle": "linus", "kind": "agent"}, {"handle": "bob", "kind": "agent"}],
    }
    if budget is not None:
        body["budget"] = budget
    return parse_company(body)


@sync_to_async
def worked(seat: str) -> int:
    return LedgerEntry.objects.filter(seat=seat).count()


def completed(rec: Recorder, seat: str = "ada") -> list[Any]:
    return [e for e in rec.of("agent_turn_completed", seat=seat) if not e.data.failed]


class Node:
    """One node's queue, with a :class:`Billed` model, a recorder and a clock at :data:`EVENING`, for ``org``."""

    def __init__(self, q: Any, org: Organization) -> None:
        self.q, self.org = q, org
        self.model, self.clock = Billed(), ManualClock(EVENING)
        self.rec = Recorder().attach(q)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Any]:
        """The seat runtime on this node, its turns on the billed model and its budget on the clock."""
        runner = TurnRunner(self.q, CompanyHolder(self.org), provider_factory=lambda _c: self.model)
        async with running(self.q, self.org, runner=runner, clock=self.clock) as rt:
            runner.holder = rt.holder
            yield rt


@contextlib.asynccontextmanager
async def node(org: Organization) -> AsyncIterator[Node]:
    async with memory_queues() as (_, [q]):
        yield Node(q, org)


@DB
async def test_a_seat_over_its_daily_ceiling_is_refused_held_with_its_mail_waiting_and_a_raised_ceiling_runs_it_once_each() -> None:
    async with node(acme(ada={"tokens_per_day": 10})) as one:
        q, rec, model = one.q, one.rec, one.model
        async with one.running() as rt:
            await send(q, "ada", wake("ada", "first", delivery_id="D-1"))
            await eventually(lambda: completed(rec), what="the first turn, which spends 12 of 10")
            await drained(q, "ada")

            await send(q, "ada", wake("ada", "second", delivery_id="D-2"))
            await eventually(lambda: rec.of("budget_exhausted"), what="the next turn refused")
            await send(q, "ada", wake("ada", "third", delivery_id="D-3"))
            await eventually(lambda: q.backlog(*inbox("ada")), what="the mail waiting")
            await eventually(lambda: rt.loops["ada"].stats.deferred >= 1, what="the refused trigger handed back")

            [refused] = rec.of("budget_exhausted", seat="ada")
            body = refused.data
            assert (body.scope, body.period, body.window, body.spend, body.ceiling) == ("seat", "day", "2025-06-01", 12, 10)
            assert body.resets_at == "2025-06-01T22:00:00.000000Z"  # Berlin's midnight
            [failed] = [e for e in rec.of("agent_turn_completed", seat="ada") if e.data.failed]
            assert failed.data.turn_id == body.turn_id and "day budget for 2025-06-01 is spent" in failed.data.error
            [report] = rec.of("budget_meters", trigger=METERS_ON_REFUSAL)  # at once, beside the ticks
            assert {(w["scope"], w["seat"], w["period"], w["state"]) for w in report.data.windows} == {("seat", "ada", "day", METER_EXHAUSTED)}
            assert await q.backlog(*inbox("ada")) == 2 and await q.dead_letters() == []
            assert rt.budget.holding("ada") and model.calls == ["sam: first"]
            await rt.budget_tick()  # a tick changes nothing while the window stays spent
            assert rt.budget.holding("ada") and await q.backlog(*inbox("ada")) == 2

            await rt.apply(acme(ada={"tokens_per_day": 1000}))
            await eventually(lambda: len(completed(rec)) == 3, what="the held mail worked")
            await drained(q, "ada")
        assert sorted(model.calls) == ["sam: first", "sam: second", "sam: third"]  # once each
        assert await worked("ada") == 3 and await q.dead_letters() == []
        assert len(rec.of("budget_exhausted")) == 1


@DB
async def test_the_companys_window_resets_at_midnight_in_its_timezone_and_the_next_tick_releases_the_held_seat() -> None:
    async with node(acme(budget={"tokens_per_day": 12})) as one:
        q, rec, clock = one.q, one.rec, one.clock
        async with one.running() as rt:
            await send(q, "ada", wake("ada", "first"))
            await eventually(lambda: completed(rec), what="the company's day spent")
            await send(q, "linus", wake("linus", "second"))
            await eventually(lambda: rec.of("budget_exhausted", seat="linus"), what="linus refused by the company's window")
            [refused] = rec.of("budget_exhausted", seat="linus")
            assert (refused.data.scope, refused.data.spend, refused.data.ceiling) == ("company", 12, 12)

            clock.now += 3600  # 23:00 in Berlin: the same day
            assert await rt.release_budget_holds() == []
            clock.now += 2 * 3600  # past Berlin's midnight: a new day, a new count
            assert await rt.release_budget_holds() == ["linus"]
            await eventually(lambda: completed(rec, "linus"), what="linus's held mail worked")
            await drained(q, "linus")
            await rt.budget.publish()
        windows = rec.of("budget_meters")[-1].data.windows
        # The new day's count is linus's turn alone, which spent it again.
        assert [(w["scope"], w["window"], w["spend"], w["state"]) for w in windows] == [("company", "2025-06-02", 12, METER_EXHAUSTED)]
        assert await q.dead_letters() == []


@DB
async def test_three_nodes_on_one_coordination_store_count_the_companys_window_once() -> None:
    """Three nodes' turns, at once, each charging the shared store: one count, and every node refuses once it is spent."""
    org = acme(budget={"tokens_per_day": 36})
    clock = ManualClock(EVENING)
    now = lambda: datetime.fromtimestamp(clock(), timezone.utc)  # noqa: E731
    async with memory_queues("n1", "n2", "n3") as (_, queues):
        rec = Recorder().attach(*queues)
        runners = []
        for q in queues:
            holder = CompanyHolder(org)
            runner = TurnRunner(q, holder, provider_factory=lambda _c: Billed())
            runner.budget = BudgetKeeper(holder, clock=now, emit=runner._emit)
            runners.append(runner)
        seats = [org.seat_by_handle(h) for h in ("ada", "linus", "bob")]
        results = await asyncio.gather(*(r.run(s, Trigger(events=[wake(s.handle, "go")])) for r, s in zip(runners, seats) if s))
        assert [r.outcome for r in results] == [OUTCOME_COMPLETED] * 3
        [company_day] = [m for m in await sync_to_async(meters)(org, now()) if m.scope == "company"]
        assert (company_day.spend, company_day.exhausted) == (36, True)
        again = await asyncio.gather(*(r.run(s, Trigger(events=[wake(s.handle, "more")])) for r, s in zip(runners, seats) if s))
        assert [r.outcome for r in again] == [OUTCOME_FAILED] * 3
        assert sorted(e.node for e in rec.of("budget_exhausted")) == ["n1", "n2", "n3"]


@DB
def test_charges_from_threads_at_once_are_all_counted() -> None:
    """The increment is the database's (``tokens = tokens + n``), so concurrent charges never lose one."""
    org = acme()
    at = datetime.fromtimestamp(EVENING, timezone.utc)

    def spend() -> None:
        from django.db import connections

        try:
            for _ in range(10):
                charge(org, "ada", 5, at)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=spend) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counted = dict(TokenUsage.objects.filter(period="day").values_list("scope", "tokens"))
    assert counted == {"company": 150, "seat:ada": 150}


def test_the_hold_key_is_the_one_the_queue_holds_budgets_under() -> None:
    assert HOLD_BUDGET == "budget"
