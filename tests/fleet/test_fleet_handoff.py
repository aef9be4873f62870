"""A seat's lease is let go only once its node can no longer run a turn of it.

Two nodes in one process, on one in-memory broker and the test's coordination
store: node n1 is a real :class:`~crewlet.engine.core.Engine` (its fleet membership
and its seat runtime as ``manage.py up`` registers them) whose model never
answers, so its turn is still running when it stops; node n2 is a seat runtime
on seat leases whose placement sweep the test runs. Every model call of both
nodes is logged as it starts and ends; all of it runs on one event loop, so
the log's order is the order things happened in.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional

import pytest

from crewlet.company.loading import load_settings
from crewlet.base.db import in_store
from crewlet.engine.core import Engine
from crewlet.engine.services import Service
from crewlet.fleet import PROTOCOL_VERSION, leases
from crewlet.fleet import member as fleet_member
from crewlet.fleet.leases import NODE, SEAT
from crewlet.fleet.member import FleetMember
from crewlet.engine.interfaces import FLEET, SEAT_RUNTIME
from crewlet.queue.contract import EventQueue
from crewlet.queue.memory import MemoryBroker
from seats import runtime_service as seat_runtime
from seats.ownership import LeasedOwnership
from seats.provider_base import Completion, ModelRequest
from seats.providers import EchoProvider
from seats.ledger import trigger_identity, worked
from seats.runtime import SeatRuntime
from seats.turns import TurnRunner
from seats_support import FAST, company, eventually, holder, send, wake
from waiting_support import ManualClock

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

ORG = company(seats=[{"handle": "ada", "kind": "agent", "role": "engineer"}])
#: Long enough that nothing in these tests waits for a lease to run out.
TTL_S = 60.0
#: Node n1's drain: its turn never ends by itself, so the drain runs out at once.
DRAIN_S = 0.05


class Model:
    """A node's model: logs each call's start and end; a ``blocked`` one never answers (it ends only when cancelled)."""

    key = "echo"

    def __init__(self, node: str, log: list[tuple[str, str]], *, blocked: bool = False) -> None:
        self.node = node
        self.log = log
        self.blocked = blocked
        self.entered = asyncio.Event()
        self.ended_at = 0.0  # the monotonic instant the last call ended
        self.echo = EchoProvider()

    async def complete(self, request: ModelRequest) -> Completion:
        self.log.append((self.node, "start"))
        self.entered.set()
        try:
            if self.blocked:
                await asyncio.Event().wait()
            return await self.echo.complete(request)
        finally:
            self.ended_at = time.monotonic()
            self.log.append((self.node, "end"))

    async def aclose(self) -> None:
        return None


class SweepsOfN2:
    """A service of node n1 that stops right after n1's seat runtime: node n2 sweeps while n1's stop goes on.

    It stands for everything else a stopping node still does (the event
    store's writer flushing, the emitter closing) and for another node's
    placement sweep landing in that time. When n2 wins the seat there, it is
    let start its turn before n1's stop goes on.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.node: Optional[SeatRuntime] = None
        self.took: list[bool] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        assert self.node is not None
        for _ in range(3):
            await self.node.rebalance()
            self.took.append("ada" in self.node.loops)
            if self.took[-1]:
                await asyncio.wait_for(self.model.entered.wait(), timeout=60)
                return


def node_n1(
    broker: MemoryBroker, model: Model, fleet: Callable[[Engine], list[Service]] = fleet_member.services, *first: Service
) -> Engine:
    """Node n1 as ``up`` runs it (its fleet membership, then its seat runtime), after ``first``."""
    queue = broker.client(node="n1")

    async def connect(**_kwargs: Any) -> tuple[EventQueue, None]:
        return queue, None

    settings = load_settings({}, env={}, overrides={"node.id": "n1", "fleet.lease_ttl_s": TTL_S})
    engine = Engine(settings, connect=connect, timings=FAST, company=holder(ORG), drain_timeout_s=DRAIN_S)
    for service in (*first, *fleet(engine)):
        engine.add(service)
    runner = TurnRunner(queue, engine.company, provider_factory=lambda _config: model)
    seat_runtime.install(engine, run_scheduler=False, runner=runner)
    return engine


async def running_ada(engine: Engine) -> SeatRuntime:
    """Wait until ``engine``'s seat runtime runs ada; that runtime."""
    def runs_ada() -> Optional[SeatRuntime]:
        rt = engine.find(SEAT_RUNTIME)
        return rt if rt is not None and rt.healthy() and "ada" in rt.loops else None

    found: SeatRuntime = await eventually(runs_ada, timeout_s=30, what="n1 runs ada")
    return found


async def node_n2(broker: MemoryBroker, model: Model) -> SeatRuntime:
    """Node n2: on the roster, a seat runtime on seat leases, its sweep run by the test.

    Both nodes of this test share one events database, so n2's presence is
    written as its membership writes it rather than by starting one (which
    would refuse the store n1 already claims).
    """
    await in_store(leases.acquire)(NODE, "n2", "n2", TTL_S, labels=[], protocol=PROTOCOL_VERSION, store="n2-store")
    queue = broker.client(node="n2")
    node = SeatRuntime(
        queue,
        holder(ORG),
        node_id="n2",
        ownership=LeasedOwnership(FleetMember("n2", ttl_s=TTL_S)),
        runner=TurnRunner(queue, holder(ORG), provider_factory=lambda _config: model),
        run_scheduler=False,
        placement_every_s=3600,
    )
    await node.start()
    return node


async def test_a_node_stopping_while_a_turn_runs_keeps_the_seat_until_that_turn_has_ended_then_hands_it_over_at_once() -> None:
    log: list[tuple[str, str]] = []
    model_n1, model_n2 = Model("n1", log, blocked=True), Model("n2", log)
    broker = MemoryBroker(FAST)
    sweeps = SweepsOfN2(model_n2)
    engine = node_n1(broker, model_n1, fleet_member.services, Service("sweeps_of_n2", lambda _e: sweeps))
    serving = asyncio.create_task(engine.serve())
    n2: Optional[SeatRuntime] = None
    try:
        await running_ada(engine)
        assert engine.queue is not None
        await send(engine.queue, "ada", wake("ada", "first"))
        await asyncio.wait_for(model_n1.entered.wait(), timeout=60)
        await send(engine.queue, "ada", wake("ada", "second"))  # waits on the broker behind n1's running turn
        n2 = sweeps.node = await node_n2(broker, model_n2)
        assert "ada" not in n2.loops  # n1 holds it

        engine.stop()
        assert await serving == 0
        assert log == [("n1", "start"), ("n1", "end")]  # n1's turn was cut by its stop, and n2 started none meanwhile
        assert sweeps.took == [False, False, False]

        await n2.rebalance()  # n2's next sweep takes the seat: no lease had to run out (the TTL is a minute)
        assert "ada" in n2.loops
        await eventually(lambda: log.count(("n2", "end")) == 2, timeout_s=30, what="both wakes worked on n2")
    finally:
        engine.stop()
        await asyncio.wait_for(serving, timeout=60)
        if n2 is not None:
            await n2.stop()
            await n2.queue.close()
    assert log[:3] == [("n1", "start"), ("n1", "end"), ("n2", "start")]


async def log_when_lost(lose: Callable[[FleetMember, ManualClock], Awaitable[None]]) -> list[tuple[str, str]]:
    """Run n1 on a member with the test's clock, start ada's turn, ``lose`` the seat; the model log as ``lose`` returns.

    ada's lease is taken while the clock stands at its start, so its own
    deadline is that instant plus the TTL.
    """
    log: list[tuple[str, str]] = []
    model = Model("n1", log, blocked=True)
    clock = ManualClock()
    member = FleetMember("n1", ttl_s=TTL_S, clock=clock)
    engine = node_n1(MemoryBroker(FAST), model, lambda _e: [Service(FLEET, lambda _e: member, stop_last=True)])
    serving = asyncio.create_task(engine.serve())
    try:
        await running_ada(engine)
        assert engine.queue is not None
        first = await send(engine.queue, "ada", wake("ada", "first"))
        await asyncio.wait_for(model.entered.wait(), timeout=60)
        await lose(member, clock)
        seen = list(log)
        # The cut turn's wake is handed back for ada's next holder, never recorded here as worked.
        loops = engine.get(SEAT_RUNTIME).loops
        await eventually(lambda: "ada" not in loops or not loops["ada"].handling, what="ada's delivery settled on n1")
        assert await in_store(lambda: worked("ada", [trigger_identity(first)]))() == {}
        return seen
    finally:
        engine.stop()
        await asyncio.wait_for(serving, timeout=60)


async def test_a_seat_whose_renewal_is_refused_has_its_running_turn_cancelled_and_awaited_before_the_renewal_returns() -> None:
    async def taken_behind_its_back(member: FleetMember, _clock: ManualClock) -> None:
        await in_store(lambda: leases.model_of(SEAT).objects.filter(name="ada").update(holder="n2"))()
        await member.renew()

    assert await log_when_lost(taken_behind_its_back) == [("n1", "start"), ("n1", "end")]


async def test_a_seat_whose_renewals_do_not_get_through_is_given_up_and_its_turn_ended_before_the_nodes_own_deadline() -> None:
    async def store_silent(member: FleetMember, clock: ManualClock) -> None:
        deadline = clock.now + TTL_S
        assert member.holds_seat("ada")
        clock.now = deadline - member.guard_s / 2  # no renewal got through since: inside the guard, short of the deadline
        assert not member.holds_seat("ada")  # no new delivery of ada is worked from here on
        await member.give_up_overdue()  # the watcher's pass, due at deadline - guard_s
        assert clock.now < deadline and "ada" not in member.seats()

    assert await log_when_lost(store_silent) == [("n1", "start"), ("n1", "end")]


@pytest.mark.postgres
async def test_a_node_whose_store_stops_answering_ends_its_seats_turn_before_its_own_deadline() -> None:
    """Another connection locks ada's lease row, so n1's renewals hang unanswered: its watcher gives ada up in time.

    The TTL is shrunk to seconds (below the setting's floor, which the
    membership itself does not enforce) so the deadline comes within the test.
    """
    import psycopg
    from django.db import connections

    log: list[tuple[str, str]] = []
    model = Model("n1", log, blocked=True)
    member = FleetMember("n1", ttl_s=3.0)
    engine = node_n1(MemoryBroker(FAST), model, lambda _e: [Service(FLEET, lambda _e: member, stop_last=True)])
    table = leases.model_of(SEAT)._meta.db_table
    params = {k: v for k, v in connections["default"].get_connection_params().items() if k != "cursor_factory"}
    locker = await asyncio.to_thread(psycopg.connect, **params)
    serving = asyncio.create_task(engine.serve())
    try:
        await running_ada(engine)
        await asyncio.to_thread(locker.execute, f'SELECT 1 FROM "{table}" WHERE name = %s FOR UPDATE', ["ada"])
        deadline = member.deadline("ada")  # no renewal gets through from here on
        assert engine.queue is not None
        await send(engine.queue, "ada", wake("ada", "first"))
        await asyncio.wait_for(model.entered.wait(), timeout=60)
        await eventually(lambda: ("n1", "end") in log, timeout_s=30, what="n1's turn ended by the watcher")
        assert 0 < model.ended_at < deadline and not member.holds_seat("ada")
    finally:
        await asyncio.to_thread(locker.rollback)
        await asyncio.to_thread(locker.close)
        engine.stop()
        await asyncio.wait_for(serving, timeout=60)


async def test_a_seat_is_given_away_by_the_placement_sweep_only_between_deliveries_never_as_one_is_about_to_start_its_turn() -> None:
    """The sweep asks to give ada away while ada's delivery is past its last ownership check, its turn not yet begun."""
    from crewlet.events import Event
    from seats.mailboxes import ensure_mailboxes
    from seats.ownership import Plan, SeatOwnership
    from seats_support import memory_queues

    class Giving(SeatOwnership):
        """Alone, but told by the test when placement wants ada elsewhere."""

        give = False

        async def plan(self, org: Any, held: frozenset[str]) -> Plan:
            return Plan(give=tuple(held)) if self.give else await super().plan(org, held)

    about_to_start, go = asyncio.Event(), asyncio.Event()
    owned_at_start: list[bool] = []
    ownership = Giving("n1")

    async def hold_the_digest(_topic: str, event: Event) -> None:
        if event.type == "notifications_coalesced":  # published between the ownership check and the turn
            about_to_start.set()
            await go.wait()

    class Owned(Model):
        async def complete(self, request: ModelRequest) -> Completion:
            owned_at_start.append(ownership.owns("ada"))
            return await super().complete(request)

    org = company(window_s=0.05, seats=[{"handle": "ada", "kind": "agent", "role": "engineer"}])
    async with memory_queues() as (_, [q]):
        await ensure_mailboxes(q, org)
        for body in ("one", "two"):  # one conversation: one partition, one turn
            await send(q, "ada", wake("ada", body, partition_key="slack:D1", conversation="slack:D1"))
        q.add_publish_listener(hold_the_digest)
        runner = TurnRunner(q, holder(org), provider_factory=lambda _config: Owned("n1", []))
        rt = SeatRuntime(q, holder(org), ownership=ownership, runner=runner, run_scheduler=False, placement_every_s=3600)
        await rt.start()
        try:
            await asyncio.wait_for(about_to_start.wait(), timeout=60)
            ownership.give = True
            await rt.rebalance()
            go.set()
            await eventually(lambda: owned_at_start, timeout_s=30, what="ada's turn started")
        finally:
            go.set()
            await rt.stop()
    assert owned_at_start == [True]
