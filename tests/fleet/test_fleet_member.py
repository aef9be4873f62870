"""A node's fleet membership: presence, seats and duties kept by renewal, lost when the store says so."""
from __future__ import annotations

import pytest

from crewlet.base.db import in_store
from crewlet.fleet import StoreClaimed, leases
from crewlet.fleet.leases import SEAT
from crewlet.fleet.member import FleetMember
from crewlet.fleet.roster import live_nodes
from waiting_support import ManualClock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "events"])


async def test_a_member_is_on_the_roster_with_its_labels_and_store_and_leaves_it_at_a_clean_stop() -> None:
    member = FleetMember("n1", labels=["gpu"], ttl_s=30)
    await member.start()
    try:
        [me] = await in_store(live_nodes)()
        assert (me.id, me.labels, me.protocol, me.store) == ("n1", ("gpu",), 1, member.store)
        assert await member.acquire_seat("ada") and await member.hold_duty("scheduler")
    finally:
        await member.stop()
    assert await in_store(live_nodes)() == []
    assert await in_store(leases.holders)(SEAT) == {}


async def test_a_second_node_on_the_same_event_store_is_refused_naming_both() -> None:
    first = FleetMember("n1", ttl_s=30)
    await first.start()
    try:
        with pytest.raises(StoreClaimed, match=r"node n2 refuses to start: its event store \w+ is already written by live node n1"):
            await FleetMember("n2", ttl_s=30).start()
    finally:
        await first.stop()


async def test_a_seat_taken_by_another_node_is_lost_at_the_next_renewal_and_the_listener_hears_of_it() -> None:
    clock = ManualClock()
    member = FleetMember("n1", ttl_s=30, clock=clock)
    await member.start()
    heard: list[frozenset[str]] = []

    async def lost(seats: frozenset[str]) -> None:
        heard.append(seats)

    member.on_lost(lost)
    try:
        assert await member.acquire_seat("ada") and await member.acquire_seat("linus")
        # ada's row is handed to n2 behind n1's back (as an expired lease taken by another node would be).
        await in_store(lambda: leases.model_of(SEAT).objects.filter(name="ada").update(holder="n2"))()
        await member.renew()
        assert heard == [frozenset({"ada"})]
        assert not member.holds_seat("ada") and member.holds_seat("linus")
        clock.now += 31  # no renewal got through for a whole TTL: by its own deadline it holds nothing
        assert not member.holds_seat("linus") and not member.present()
    finally:
        await member.stop()


async def test_of_two_members_asking_for_one_duty_exactly_one_runs_it_until_it_stops() -> None:
    one, two = FleetMember("n1", ttl_s=30), FleetMember("n2", ttl_s=30)
    await one.start()
    assert await one.hold_duty("retirement")
    assert not await two.hold_duty("retirement")
    await one.stop()
    assert await two.hold_duty("retirement")


async def test_a_duty_under_its_lease_runs_on_one_node_of_two_and_moves_when_that_node_stops() -> None:
    from crewlet.fleet.duty import under_duty
    from crewlet.engine.interfaces import FLEET

    ran: list[str] = []

    class Node:
        def __init__(self, member: FleetMember) -> None:
            self.member = member

        def find(self, key: object) -> object:
            return self.member if key == FLEET else None

    one, two = FleetMember("n1", ttl_s=30), FleetMember("n2", ttl_s=30)
    passes = {m.node_id: under_duty(Node(m), "a2a_sweep", lambda m=m: _record(ran, m.node_id)) for m in (one, two)}
    await one.start()
    try:
        for _ in range(2):
            await passes["n1"]()
            await passes["n2"]()
        assert ran == ["n1", "n1"]
    finally:
        await one.stop()
    await passes["n2"]()
    assert ran == ["n1", "n1", "n2"]


async def _record(ran: list[str], node: str) -> None:
    ran.append(node)
