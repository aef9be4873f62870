"""A stateless node in a fleet of real `manage.py up` processes: its events kept by the data nodes in custody.

Two data nodes (``da``, ``db``: an event store each) and a stateless node
(``sx``: ``node.data: false``) on one nats-server and one coordination store.
``da`` is made silent (SIGSTOP) while ``sx`` works, so the batches claimed for
it move to ``db``; let go again, ``da`` writes its late copies of them, and the
same rows sit on both stores until ``da`` settles. ``da`` is then killed
(``kill -9``) holding them, and started again: its first settle pass drops
them (or keeps them, for a batch whose claim came back to it). Throughout, a fleet read through ``db`` lists and counts every row of
``sx`` once, and asks the second question (``kept``) only while some store
holds a row it has not settled.
"""
from __future__ import annotations

import os
import re
import signal
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator
from urllib.parse import urlencode

import pytest

from tests.fleet.test_fleet_up import MOVE_S, TOKEN, Fleet, Node, _pg
from tests.up.test_up_inflight import broker, loop  # noqa: F401  (fixtures)
from tests.up_support import http_call
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.timeout(400)]

NODES = ("da", "db", "sx")
KEPT_ASKED = re.compile(r"^crewlet_history_kept_questions_total (\S+)$", re.M)


@pytest.fixture
def fleet(broker: Any, tmp_path: Any) -> Iterator[Fleet]:  # noqa: F811
    made = Fleet(tmp_path, broker.url, nodes=NODES)
    try:
        yield made
    finally:
        made.close()


def rows_of(fleet: Fleet, node: str) -> dict[str, str]:
    """{id: custody batch ("" settled)} of ``sx``'s rows in ``node``'s store."""
    with _pg(fleet.events[node]) as db:
        return {str(i): str(b) for i, b in db.execute("SELECT id, custody_batch FROM eventstore_event WHERE node = 'sx'")}


def unsettled(fleet: Fleet) -> int:
    return sum(1 for node in ("da", "db") for batch in rows_of(fleet, node).values() if batch)


def kept_asked(node: Node) -> int:
    """How many rounds of ``node``'s reads asked ``kept``, as its ``/metrics`` says."""
    status, _, body = http_call("GET", node.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body
    found = KEPT_ASKED.search(body.decode())
    assert found is not None, "the kept counter is on /metrics"
    return int(float(found.group(1)))


def _listed(node: Node) -> tuple[list[str], bool]:
    page = node.api("/api/events?" + urlencode({"node": "sx", "limit": 500}))
    return [row["id"] for row in page["events"]], bool(page["coverage"]["complete"])


def fleet_rows(node: Node) -> tuple[list[str], int, bool]:
    """``sx``'s rows as a fleet read through ``node`` lists them, how many the series counts, and whether every node
    answered: the listing read before and after the series, until no row came in between (``sx`` may still be working)."""

    def snapshot() -> tuple[list[str], int, bool] | None:
        listed, complete = _listed(node)
        until = (datetime.now(timezone.utc) + timedelta(minutes=1)).isoformat()
        series = node.api("/api/events/series?" + urlencode({"node": "sx", "window": "1h", "bucket": "1m", "until": until}))
        again, still = _listed(node)
        if sorted(again) != sorted(listed) or still != complete:
            return None
        return listed, sum(int(bar["total"]) for bar in series["bars"]), complete

    found: tuple[list[str], int, bool] = wait_until(snapshot, MOVE_S, "a listing that did not change during the series")
    return found


def test_a_stateless_nodes_events_are_read_fleet_wide_and_counted_once_while_a_killed_keepers_late_copies_wait_to_be_settled(
    fleet: Fleet,
) -> None:
    da = fleet.start("da", CREWLET_HISTORY_CUSTODY_SETTLE_S="3600")  # it settles at start only
    db = fleet.start("db", CREWLET_HISTORY_CUSTODY_SETTLE_S="1")
    fleet_rows(db)
    assert kept_asked(db) == 0  # a fleet with no stateless node never asks it

    sx = fleet.start("sx", CREWLET_NODE_DATA="false", CREWLET_HISTORY_CUSTODY_TIMEOUT_S="2")
    sx.post_slack("U0S1", "D0S1", "to a stateless node")
    wait_until(lambda: fleet_rows(db)[0], MOVE_S, "sx's rows readable through db")
    with _pg(fleet.events["sx"]) as own:
        assert own.execute("SELECT count(*) FROM eventstore_event").fetchone() == (0,)  # it keeps no rows of its own

    os.kill(da.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        for i in range(3):
            sx.post_slack("U0S1", "D0S1", f"while da is silent {i}")
        wait_until(lambda: "custody_claim_moved" in sx.output_so_far(), MOVE_S, "a batch claimed for da moved to db")
    finally:
        os.kill(da.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]

    # Let go, da writes the batches it was sent while silent: the same rows as db's, unsettled on da.
    both = wait_until(lambda: set(rows_of(fleet, "da")) & set(rows_of(fleet, "db")), MOVE_S, "a row on both stores")
    assert all(rows_of(fleet, "da")[i] for i in both)
    before = kept_asked(db)
    listed, counted, complete = wait_until(lambda: (r := fleet_rows(db))[2] and r, MOVE_S, "a complete read")
    assert len(listed) == len(set(listed)) == counted  # each row listed and counted once
    assert set(listed) == set(rows_of(fleet, "da")) | set(rows_of(fleet, "db"))
    assert kept_asked(db) > before  # asked: a row was named by a store that had not settled it

    da.kill()  # kill -9, holding rows it has not settled
    assert set(rows_of(fleet, "da")) & both
    # Its first pass, at start, drops the late copies; later batches it settles within a second.
    da = fleet.start("da", CREWLET_HISTORY_CUSTODY_SETTLE_S="1")
    wait_until(lambda: unsettled(fleet) == 0, MOVE_S, "every batch settled")
    on_da, on_db = set(rows_of(fleet, "da")), set(rows_of(fleet, "db"))
    assert not on_da & on_db  # each row on one store, for good
    assert both <= on_da | on_db  # the late copies' rows are kept by the keeper their claim names: none lost

    def held() -> dict[str, str]:
        return {**rows_of(fleet, "da"), **rows_of(fleet, "db")}

    def settled_read() -> tuple[list[str], int, int] | None:
        before, asked = held(), kept_asked(db)
        listed, counted, complete = fleet_rows(db)
        after = held()
        if after != before or any(after.values()) or not complete:
            return None  # a batch came or was in flight (or a node did not answer): read again
        return listed, counted, kept_asked(db) - asked

    listed, counted, asked = wait_until(settled_read, MOVE_S, "a complete read with nothing in flight")
    assert sorted(listed) == sorted(on_da | on_db) and counted == len(listed)
    assert asked == 0  # no row in flight: the second question is not asked
    assert deliveries(fleet) == 4  # every post to sx kept, once, though its first keeper went silent and was killed


def deliveries(fleet: Fleet) -> int:
    """How many of ``sx``'s webhook deliveries the data nodes' stores hold, across both."""
    total = 0
    for node in ("da", "db"):
        with _pg(fleet.events[node]) as db:
            (count,) = db.execute("SELECT count(*) FROM eventstore_event WHERE node = 'sx' AND type LIKE 'webhook:%%'").fetchone()
            total += int(count)
    return total
