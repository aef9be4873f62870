"""A fleet of real `manage.py up` processes: one nats-server, one PostgreSQL coordination store, a store each.

Each node runs ``stream.type: nats`` against the nats-server this test starts
and its own events database beside the one coordination database they share,
with ``fleet.lease_ttl_s`` at its floor (5 s) and a short ack clock, so a
crash's cost is seen in seconds. The test watches ``crewlet.events.>`` with
its own client (every event names the node that published it) and reads the
seat leases straight from the coordination store.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from crewlet.fleet.placement import REASON_PINNED_NODE_NOT_LIVE
from tests.browser_support import LoopThread
from tests.up.test_up_inflight import Up, Watcher, broker, loop  # noqa: F401  (fixtures)
from tests.up_support import UpProcess, http_json, pg_client_env, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.timeout(400)]

TTL_S = 5.0
ACK_WAIT_S = 5.0
#: Generous bounds for a loaded 2-core machine (what is measured is printed, not asserted).
MOVE_S = 60.0
AGENTS = ("s1", "s2", "s3", "s4")

TOKEN = "fleet-test-operator-token-0123456789abcdef"
SLACK_ID = {"s1": "U0S1", "s2": "U0S2", "s3": "U0S3", "s4": "U0S4", "pinned": "U0PIN"}
#: Four seats any node may run, and one pinned to n3 (a node the tests start late, or never).
PLACEMENT = {"pinned": "placement: {node: n3}"}
COMPANY = "org: acme\nproviders: {llm: [{kind: echo, delay_s: 3}]}\n" \
    "surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}\nseats:\n" + "".join(
        f"  - {{handle: {seat}, kind: agent, identities: {{slack: {user}}}, {PLACEMENT.get(seat, 'placement: {}')}}}\n"
        for seat, user in SLACK_ID.items()
    )


def _pg(dbname: str = "postgres") -> psycopg.Connection:
    return psycopg.connect(
        host=os.environ.get("CREWLET_PG_HOST", "/var/run/postgresql"),
        port=os.environ.get("CREWLET_PG_PORT") or None,
        user=os.environ.get("CREWLET_PG_USER") or None,
        password=os.environ.get("CREWLET_PG_PASSWORD") or None,
        dbname=dbname,
        autocommit=True,
    )


class Fleet:
    """The databases of one fleet (made empty for the test) and the nodes started on them."""

    def __init__(self, tmp: Path, broker_url: str, nodes: tuple[str, ...] = ("n1", "n2", "n3")) -> None:
        base = os.environ.get("CREWLET_PG_DBNAME", "crewlet") + "_fleet"
        self.tmp = tmp
        self.broker_url = broker_url
        self.coordination = base
        self.events = {n: f"{base}_events_{n}" for n in nodes}
        with _pg() as admin:
            for name in (self.coordination, *self.events.values()):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{name}"')
        (tmp / "company.yaml").write_text(COMPANY)
        self.nodes: dict[str, Node] = {}

    def start(self, name: str, **env: str) -> "Node":
        node = Node(self, name, **env)
        self.nodes[name] = node
        return node.start()

    def seat_holders(self) -> dict[str, str]:
        """The live seat leases: seat -> node."""
        with _pg(self.coordination) as db:
            rows = db.execute(
                "SELECT name, holder FROM crewlet_seat_lease WHERE holder <> '' AND expires_at > now()"
            ).fetchall()
        return dict(rows)

    def leases_named(self, holder: str) -> list[str]:
        """Every lease row (seat, duty, node), live or not, still naming ``holder``."""
        with _pg(self.coordination) as db:
            rows = db.execute(
                "SELECT name FROM crewlet_seat_lease WHERE holder = %s UNION ALL "
                "SELECT name FROM crewlet_duty_lease WHERE holder = %s UNION ALL "
                "SELECT name FROM crewlet_node_lease WHERE holder = %s",
                (holder, holder, holder),
            ).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        for node in self.nodes.values():
            node.kill()


class Node(Up):
    """One `up` of the fleet: node ``name`` on the shared coordination store and its own events database (``extra``: more settings)."""

    def __init__(self, fleet: Fleet, name: str, **extra: str) -> None:
        env = up_env(
            CREWLET_DATABASE="postgres",
            CREWLET_PG_DBNAME=fleet.coordination,
            CREWLET_PG_EVENTS_DBNAME=fleet.events[name],
            CREWLET_STREAM_TYPE="nats",
            CREWLET_STREAM_URL=fleet.broker_url,
            CREWLET_VAR_DIR=str(fleet.tmp / name),
            CREWLET_FLEET_LEASE_TTL_S=str(TTL_S),
            CREWLET_STREAM_ACK_WAIT_S=str(ACK_WAIT_S),
            CREWLET_OPERATOR_TOKEN=TOKEN,
            **pg_client_env(),
            **extra,
        )
        UpProcess.__init__(self, fleet.tmp, "--company", str(fleet.tmp / "company.yaml"), node=name, env=env)


@pytest.fixture
def fleet(broker: Any, tmp_path: Path) -> Iterator[Fleet]:  # noqa: F811
    made = Fleet(tmp_path, broker.url)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def watcher(loop: LoopThread, broker: Any) -> Iterator[Watcher]:  # noqa: F811
    watching = Watcher(loop, broker, ACK_WAIT_S)
    yield watching
    watching.close()


def seen(watcher: Watcher, etype: str, seat: str = "") -> list[Any]:
    """The events of ``etype`` (about ``seat``, when given) the watcher has seen so far."""
    return [
        e for e in watcher.loop.call(lambda: list(watcher.events))
        if e.type == etype and (not seat or getattr(e.data, "seat", "") == seat)
    ]


def owners_over_time(watcher: Watcher) -> dict[str, list[tuple[str, str]]]:
    """Per seat, the (event type, node) of every acquisition and release, in the order they happened."""
    moves = sorted(seen(watcher, "agent_spawned") + seen(watcher, "agent_terminated"), key=lambda e: e.timestamp)
    out: dict[str, list[tuple[str, str]]] = {}
    for e in moves:
        out.setdefault(e.data.seat, []).append((e.type, e.node))
    return out


def assert_one_node_at_a_time(watcher: Watcher) -> None:
    """No seat was acquired by a node while another still held it (clean stops only: a killed node says nothing)."""
    for seat, history in owners_over_time(watcher).items():
        holder = ""
        for kind, node in history:
            if kind == "agent_spawned":
                assert holder in ("", node), f"{seat} acquired by {node} while {holder} held it: {history}"
                holder = node
            elif node == holder:
                holder = ""


def holders_if(fleet: Fleet, condition: Any) -> dict[str, str] | None:
    """The live seat leases when they meet ``condition``, else None (for :func:`wait_until`)."""
    holders = fleet.seat_holders()
    return holders if condition(holders) else None


def unplaceable_named(watcher: Watcher, seat: str) -> list[Any]:
    return [e for e in seen(watcher, "seats_unplaceable") if any(s.get("seat") == seat for s in e.data.seats)]


def test_a_pinned_seat_waits_for_its_node_the_seats_split_and_a_clean_stop_hands_them_over_without_the_ttl(
    fleet: Fleet, watcher: Watcher
) -> None:
    n1 = fleet.start("n1")
    wait_until(lambda: fleet.seat_holders() == {s: "n1" for s in AGENTS}, MOVE_S, "n1 running every unpinned seat")
    reported = wait_until(lambda: unplaceable_named(watcher, "pinned"), MOVE_S, "pinned reported unplaceable")
    assert [s["reason"] for s in reported[0].data.seats if s["seat"] == "pinned"] == [REASON_PINNED_NODE_NOT_LIVE]
    assert reported[0].node == "n1"

    n1.post_slack("U0PIN", "D0PIN", "for the pinned seat, before its node exists")
    wait_until(lambda: seen(watcher, "external_notification") or seen(watcher, "inbound_delivery"), MOVE_S, "the wake")

    n3 = fleet.start("n3")
    started = time.monotonic()
    wait_until(lambda: seen(watcher, "agent_turn_started", "pinned"), MOVE_S, "the pinned seat's waiting mail drained")
    drained_s = time.monotonic() - started
    assert {e.node for e in seen(watcher, "agent_turn_started", "pinned")} == {"n3"}
    split = wait_until(
        lambda: holders_if(fleet, lambda h: sorted(h.values()).count("n3") == 2 and len(h) == 5),
        MOVE_S, "the seats split between n1 and n3",
    )
    assert split["pinned"] == "n3"
    # Each node's API names the node running every seat (the lease holder, whichever node is asked).
    for node in (n1, n3):
        status, body = http_json("GET", node.url + "/api/seats/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, body
        assert {s["handle"]: s["node"] for s in body["seats"]} == split

    assert n3.terminate() == 0
    assert fleet.leases_named("n3") == [], "a clean stop gives every lease back at once"
    stopped = time.monotonic()
    wait_until(lambda: fleet.seat_holders() == {s: "n1" for s in AGENTS}, MOVE_S, "n1 running n3's seats again")
    handed_s = time.monotonic() - stopped
    assert_one_node_at_a_time(watcher)
    assert n1.proc is not None and n1.proc.poll() is None
    print(f"\npinned mail drained {drained_s:.2f}s after its node started; clean stop handed over in {handed_s:.2f}s "
          f"(lease TTL {TTL_S:.0f}s)")


def test_a_killed_nodes_seats_run_elsewhere_within_a_ttl_and_a_sweep_its_unacked_mail_is_worked_once_and_it_rejoins(
    fleet: Fleet, watcher: Watcher
) -> None:
    fleet.start("n1")
    n2 = fleet.start("n2")
    holders = wait_until(
        lambda: holders_if(fleet, lambda h: sorted(h.values()) == ["n1", "n1", "n2", "n2"]),
        MOVE_S, "the four seats split two and two",
    )
    victim = sorted(s for s, n in holders.items() if n == "n2")[0]
    n2.post_slack(SLACK_ID[victim], "D0KILL", "a turn in flight when its node dies")
    wait_until(lambda: seen(watcher, "agent_turn_started", victim), MOVE_S, f"{victim}'s turn on n2")
    assert {e.node for e in seen(watcher, "agent_turn_started", victim)} == {"n2"}

    n2.kill()
    killed = time.monotonic()
    wait_until(lambda: fleet.seat_holders() == {s: "n1" for s in AGENTS}, MOVE_S, "n1 running the dead node's seats")
    moved_s = time.monotonic() - killed
    done = wait_until(lambda: seen(watcher, "agent_turn_completed", victim), MOVE_S, "the trigger worked on n1")
    worked_s = time.monotonic() - killed
    assert [e.node for e in done] == ["n1"]
    assert len(seen(watcher, "agent_turn_started", victim)) == 2  # the dead node's, then n1's: never two at once
    first, second = sorted(seen(watcher, "agent_turn_started", victim), key=lambda e: e.timestamp)
    assert (first.node, second.node) == ("n2", "n1")
    # Started again on its own event store, the killed node is on the roster again and takes its share back.
    fleet.start("n2")
    wait_until(lambda: holders_if(fleet, lambda h: sorted(h.values()) == ["n1", "n1", "n2", "n2"]), MOVE_S,
               "the restarted node taking its share again")
    print(f"\nkill -9: seats moved {moved_s:.2f}s after the kill (TTL {TTL_S:.0f}s, sweep every {TTL_S / 3:.2f}s); "
          f"the in-flight trigger was worked on n1 {worked_s:.2f}s after it (ack clock {ACK_WAIT_S:.0f}s)")


def test_a_second_node_on_a_live_nodes_event_store_refuses_to_start_naming_both(fleet: Fleet) -> None:
    fleet.start("n1")
    intruder = Node(fleet, "n2")
    intruder.env["CREWLET_PG_EVENTS_DBNAME"] = fleet.events["n1"]
    fleet.nodes["n2"] = intruder
    with pytest.raises(AssertionError, match="not seen in time"):
        intruder.start()
    assert intruder.proc is not None and intruder.proc.wait(timeout=60) != 0
    refusal = [line for line in intruder.output().splitlines() if "refuses to start" in line]
    assert refusal and "node n2" in refusal[0] and "live node n1" in refusal[0], intruder.output()[-3000:]
    assert fleet.leases_named("n2") == []
