"""A fleet of three member `up`s whose brokers form an R3 cluster, and a fourth `up` that is a leaf of it.

The members are real ``manage.py up`` processes (``stream.cluster`` with a
``leaf_port`` each); the leaf is a real ``up`` whose embedded nats-server runs
no JetStream and dials them over ``stream.leaf.urls``. All four share one
PostgreSQL coordination store and keep an events database each, so the leaf
takes seats, routes, answers fleet reads and serves the web app as a member
does. ``kill -9`` of the member the leaf is attached to moves the leaf to
another member and that member's seats to the nodes left, with every accepted
delivery run once.
"""
from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path

import pytest

from tests.browser_support import slack_message
from tests.cluster_support import cluster_settings, free_ports, node_name, start_together, stop_together, up_node_env
from tests.fleet.test_fleet_up import Fleet, _pg
from tests.up.test_up_leaf import attached_to
from tests.up_support import UpProcess, http_call, pg_client_env, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SECRET = secrets.token_hex(16)
TOKEN = "fleet-leaf-test-operator-token-0123456789ab"
LEAF = "leaf1"
#: Seats any node may run (enough that every member holds one) and one pinned to the leaf; each turn takes a second.
FREE = ("ada", "bob", "cy", "dee", "eve", "fay")
SLACK_ID = {**{seat: f"U0{seat.upper()}" for seat in FREE}, "lea": "U0LEA"}
SEATS = "".join(f"  - {{handle: {seat}, kind: agent, identities: {{slack: U0{seat.upper()}}}, placement: {{}}}}\n" for seat in FREE)
COMPANY = f"""\
org: acme
providers: {{llm: [{{kind: echo, delay_s: 1}}]}}
surfaces: {{slack: {{signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}}}
seats:
{SEATS}  - {{handle: lea, kind: agent, identities: {{slack: U0LEA}}, placement: {{node: {LEAF}}}}}
  - {{handle: grace, kind: human, identities: {{slack: U0GRACE}}}}
"""


def delivery(seat: str, n: int) -> bytes:
    """A DM to ``seat`` in a channel of its own (its own conversation, its own turn)."""
    body = slack_message(f"Ev{uuid.uuid4().hex[:12]}", f"job {n}", to=SLACK_ID[seat])
    body["event"]["channel"] = f"D{n:08d}"
    return json.dumps(body).encode()


def post(node: UpProcess, body: bytes) -> int:
    status, _, _ = http_call("POST", node.url + "/webhooks/slack", body, {"Content-Type": "application/json"})
    return status


def completions(fleet: Fleet) -> dict[str, int]:
    """Completed turns per conversation over every node's own event store (a killed node's rows included)."""
    counts: dict[str, int] = {}
    for dbname in fleet.events.values():
        with _pg(dbname) as db:
            for (body,) in db.execute("SELECT body FROM eventstore_event WHERE type = 'agent_turn_completed'"):
                key = str(json.loads(body).get("conversation_key", ""))
                counts[key] = counts.get(key, 0) + 1
    return counts


def test_a_leaf_up_in_a_fleet_of_member_ups_runs_its_seat_answers_fleet_reads_and_survives_its_member_killed(tmp_path: Path) -> None:
    names = [node_name(i) for i in range(3)]
    fleet = Fleet(tmp_path, broker_url="", nodes=(*names, LEAF))
    (tmp_path / "company.yaml").write_text(COMPANY)
    route_ports, leaf_ports, (monitor_port,) = free_ports(3), free_ports(3), free_ports(1)
    common = dict(CREWLET_DATABASE="postgres", CREWLET_PG_DBNAME=fleet.coordination, CREWLET_FLEET_LEASE_TTL_S="5",
                  CREWLET_STREAM_ACK_WAIT_S="5", CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused", **pg_client_env())
    members = [
        UpProcess(
            tmp_path / name, "--company", str(tmp_path / "company.yaml"), node=name,
            env=up_node_env(
                tmp_path, i, route_ports, SECRET,
                settings={"stream": {"cluster": {
                    **cluster_settings(i, route_ports, store_dir=tmp_path / name / "stream")["cluster"], "leaf_port": leaf_ports[i],
                }}},
                CREWLET_PG_EVENTS_DBNAME=fleet.events[name], **common,
            ),
        )
        for i, name in enumerate(names)
    ]
    (tmp_path / LEAF).mkdir()
    leaf = UpProcess(
        tmp_path / LEAF, "--company", str(tmp_path / "company.yaml"), node=LEAF,
        env=up_env(
            CREWLET_VAR_DIR=str(tmp_path / LEAF / "data"),
            CREWLET_STREAM_LEAF_URLS=",".join(f"nats-leaf://127.0.0.1:{p}" for p in leaf_ports),
            CREWLET_STREAM_REPLICAS="3",
            CREWLET_STREAM_MONITOR_PORT=str(monitor_port),
            CREWLET_CLUSTER_SECRET=SECRET,
            CREWLET_PG_EVENTS_DBNAME=fleet.events[LEAF],
            **common,
        ),
    )
    try:
        start_together(members)
        leaf.start()
        assert "event=embedded_broker_leaf_attached" in leaf.output_so_far()
        wait_until(lambda: fleet.seat_holders().get("lea") == LEAF and set(fleet.seat_holders().values()) == {*names, LEAF}
                   and len(fleet.seat_holders()) == len(SLACK_ID) or None, 60, "every seat held, by every node, lea by the leaf")

        # The leaf routes a delivery to a seat a member runs, and its own seat works through the members' streams.
        held = fleet.seat_holders()
        member_seat = next(s for s, n in sorted(held.items()) if n != LEAF)
        assert post(leaf, delivery("lea", 1)) == 202 and post(leaf, delivery(member_seat, 2)) == 202
        wait_until(lambda: completions(fleet).get("slack:D00000001") == 1 and completions(fleet).get("slack:D00000002") == 1,
                   60, "both turns completed")
        # A fleet read through the leaf: every node answered, the leaf's turn and the member's among the rows.
        page = leaf.api("/api/events?type=agent_turn_completed")
        assert page["coverage"]["complete"], page["coverage"]
        assert sorted(n["id"] for n in page["coverage"]["nodes"]) == sorted([*names, LEAF])
        assert {e["seat"]: e["node"] for e in page["events"]} == {"lea": LEAF, member_seat: held[member_seat]}

        # Mail for the leaf's seat and for a seat of the member about to die, accepted just before its kill.
        victim = attached_to(leaf_ports, monitor_port)
        assert victim >= 0
        doomed = next(s for s, n in sorted(held.items()) if n == names[victim])
        assert post(leaf, delivery("lea", 3)) == 202 and post(leaf, delivery(doomed, 4)) == 202
        members[victim].kill()
        wait_until(lambda: attached_to(leaf_ports, monitor_port) not in (-1, victim) or None, 30, "the leaf attached to another member")
        # A refusal while the leaf moves may come after the message was stored: the retry is the same event.
        fifth, answers = delivery("lea", 5), list[int]()

        def accepted() -> bool:
            answers.append(post(leaf, fifth))
            return answers[-1] == 202

        wait_until(accepted, 30, "the leaf accepting a webhook again")
        wanted = {f"slack:D{n:08d}": 1 for n in range(1, 6)}
        wait_until(lambda: all(completions(fleet).get(k, 0) >= 1 for k in wanted), 120, "every accepted delivery completed")
        assert {k: v for k, v in completions(fleet).items() if k in wanted} == wanted, f"the fifth was answered {answers}"
        after = fleet.seat_holders()
        assert after.get("lea") == LEAF and after.get(doomed) not in (None, names[victim]), after  # the seat moved on

        # The leaf keeps no stream files and never logged the cluster secret.
        assert not [p for p in (tmp_path / LEAF).rglob("*") if "jetstream" in p.name.lower() or p.suffix in (".blk", ".idx")]
        assert SECRET not in leaf.output_so_far()
    finally:
        stop_together([leaf, *members])
