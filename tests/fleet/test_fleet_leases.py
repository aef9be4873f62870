"""Leases in the coordination store: one holder at a time, decided by the database.

Races run real threads, each with its own database connection, against the
same row: on PostgreSQL a concurrent UPDATE waits and re-checks its condition,
on SQLite writers take turns; either way exactly one thread wins.
"""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connections

from crewlet.fleet import leases
from crewlet.fleet.leases import DUTY, NODE, SEAT, LeaseClock
from crewlet.fleet.roster import NodeInfo, live_node_ids, live_nodes

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def race(n: int, attempt) -> list[bool]:
    """Run ``attempt(i)`` on ``n`` threads released together; each thread's result, in order."""
    results: list[bool] = [False] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = attempt(i)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_of_nodes_racing_for_a_seat_never_leased_before_exactly_one_wins() -> None:
    results = race(4, lambda i: leases.acquire(SEAT, "ada", f"n{i}", 15))
    assert results.count(True) == 1
    winner = f"n{results.index(True)}"
    assert leases.holder_of(SEAT, "ada") == winner


def test_of_nodes_racing_for_an_expired_seat_lease_exactly_one_takes_it() -> None:
    assert leases.acquire(SEAT, "ada", "gone", 1, now=at(0))
    results = race(4, lambda i: leases.acquire(SEAT, "ada", f"n{i}", 15, now=at(5)))
    assert results.count(True) == 1
    assert leases.holders(SEAT, now=at(6)) == {"ada": f"n{results.index(True)}"}


def test_a_held_lease_is_refused_to_another_node_until_it_expires_and_then_taken_with_a_new_epoch() -> None:
    assert leases.acquire(SEAT, "ada", "n1", 10, now=at(0))
    assert not leases.acquire(SEAT, "ada", "n2", 10, now=at(9))
    assert leases.acquire(SEAT, "ada", "n2", 10, now=at(10))
    row = leases.model_of(SEAT).objects.get(name="ada")
    assert (row.holder, row.epoch, row.acquired_at) == ("n2", 2, at(10))


def test_renewing_extends_only_what_the_node_still_holds() -> None:
    assert leases.acquire(SEAT, "ada", "n1", 10, now=at(0))
    assert leases.acquire(SEAT, "linus", "n1", 3, now=at(0))
    assert leases.acquire(SEAT, "grace", "n2", 10, now=at(0))
    assert leases.renew(SEAT, ["ada", "linus", "grace"], "n1", 10, now=at(5)) == {"ada"}
    assert leases.holders(SEAT, now=at(14)) == {"ada": "n1"}


def test_a_released_lease_is_free_at_once_and_a_release_by_another_node_changes_nothing() -> None:
    assert leases.acquire(DUTY, "retirement", "n1", 60, now=at(0))
    assert leases.release(DUTY, ["retirement"], "n2", now=at(1)) == 0
    assert leases.holder_of(DUTY, "retirement", now=at(1)) == "n1"
    assert leases.release(DUTY, ["retirement"], "n1", now=at(1)) == 1
    assert leases.acquire(DUTY, "retirement", "n2", 60, now=at(1))


def test_the_database_clock_decides_when_no_instant_is_given() -> None:
    assert leases.acquire(SEAT, "ada", "n1", 30)
    assert not leases.acquire(SEAT, "ada", "n2", 30)
    assert leases.renew(SEAT, ["ada"], "n1", 30) == {"ada"}
    assert leases.holders(SEAT) == {"ada": "n1"}
    assert leases.release(SEAT, ["ada"], "n1") == 1
    assert leases.acquire(SEAT, "ada", "n2", 30)


def test_the_roster_lists_unexpired_node_leases_sorted_by_id_with_what_they_say_of_themselves() -> None:
    assert leases.acquire(NODE, "n2", "n2", 15, now=at(0), labels=["gpu"], protocol=1, store="s2")
    assert leases.acquire(NODE, "n1", "n1", 15, now=at(0), labels=[], protocol=1, store="s1")
    assert leases.acquire(NODE, "n3", "n3", 5, now=at(0), labels=[], protocol=1, store="s3")
    assert live_nodes(now=at(10)) == [
        NodeInfo(id="n1", labels=(), protocol=1, store="s1", expires_at=at(15)),
        NodeInfo(id="n2", labels=("gpu",), protocol=1, store="s2", expires_at=at(15)),
    ]


def test_the_fleet_reads_roster_is_read_fresh_each_time_a_node_joining_or_leaving_is_seen_by_the_next_read() -> None:
    assert leases.acquire(NODE, "n2", "n2", 3600, labels=[], protocol=1, store="s2")
    assert live_node_ids() == ["n2"]
    assert leases.acquire(NODE, "n1", "n1", 3600, labels=[], protocol=1, store="s1")
    assert live_node_ids() == ["n1", "n2"] == [node.id for node in live_nodes()]
    assert leases.release(NODE, ["n2"], "n2") == 1
    assert live_node_ids() == ["n1"]
    assert leases.acquire(NODE, "n3", "n3", 1, now=datetime.now(timezone.utc) - timedelta(seconds=5))  # expired already
    assert live_node_ids() == ["n1"] == [node.id for node in live_nodes()]


def test_leases_long_expired_are_pruned_and_live_ones_kept() -> None:
    assert leases.acquire(DUTY, "old", "n1", 1, now=at(0))
    assert leases.acquire(DUTY, "new", "n1", 100, now=at(0))
    assert leases.prune(DUTY, older_than_s=60, now=at(120)) == 1
    assert set(leases.model_of(DUTY).objects.values_list("name", flat=True)) == {"new"}
    assert leases.acquire(NODE, "gone", "gone", 1, now=at(0))
    assert leases.prune_all(older_than_s=60, now=at(120)) == 1


def test_a_holders_own_deadline_counts_from_when_it_sent_the_renewal() -> None:
    ticks = iter([100.0, 104.9, 105.0])
    clock = LeaseClock(5.0, clock=lambda: next(ticks))
    clock.renewed(clock.sending())
    assert clock.valid()
    assert not clock.valid()


def test_taking_many_seats_at_once_takes_the_free_the_expired_and_its_own_and_never_another_nodes_live_one() -> None:
    assert leases.acquire(SEAT, "ada", "n1", 15, now=at(0))  # its own: renewed, same epoch
    assert leases.acquire(SEAT, "linus", "gone", 1, now=at(0))  # expired: taken, a new epoch
    assert leases.acquire(SEAT, "grace", "n2", 60, now=at(0))  # another node's, live: left alone
    taken = leases.acquire_many(SEAT, ["ada", "linus", "grace", "new"], "n1", 15, now=at(5))
    assert taken == {"ada", "linus", "new"}
    assert leases.holders(SEAT, now=at(6)) == {"ada": "n1", "linus": "n1", "new": "n1", "grace": "n2"}
    epochs = dict(leases.model_of(SEAT).objects.values_list("name", "epoch"))
    assert epochs == {"ada": 1, "linus": 2, "grace": 1, "new": 1}
    assert leases.release_held(SEAT, ["ada", "grace", "new"], "n1") == {"ada", "new"}
    assert leases.holders(SEAT, now=at(6)) == {"linus": "n1", "grace": "n2"}


def test_of_nodes_racing_to_take_the_same_seats_at_once_each_seat_goes_to_exactly_one() -> None:
    seats = [f"s{i}" for i in range(30)]
    won: list[set[str]] = [set(), set(), set()]

    def attempt(i: int) -> bool:
        won[i] = leases.acquire_many(SEAT, seats, f"n{i}", 15)
        return True

    race(3, attempt)
    assert sorted(s for w in won for s in w) == sorted(seats)
    assert leases.holders(SEAT) == {s: f"n{i}" for i, w in enumerate(won) for s in w}
