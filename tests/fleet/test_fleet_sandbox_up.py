"""A coding run outlives its node: ``kill -9`` of the node running it moves the seat, and the new holder takes the run over.

Two real ``manage.py up`` nodes on one nats-server and the PostgreSQL
coordination store (the fleet of ``tests/fleet/test_fleet_up.py``); ada's job
(a real bubblewrap sandbox) waits for a file the test creates. The node
running ada is killed mid-run with mail waiting; the other node takes ada,
holds her inbox before attaching it (the mail still waits), starts the run's
next attempt itself, and once the job finishes tells ada in a turn of its
own before the waiting mail runs. Read through the surviving node's fleet reads.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.test_fleet_up import MOVE_S, TOKEN, Fleet, Node, fleet  # noqa: F401  (fixtures)
from tests.seats.test_sandbox_up import WAITS_FOR_THE_GATE, company
from tests.up.test_up_inflight import broker, loop  # noqa: F401  (fixtures)
from tests.up_support import http_json
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.timeout(400)]

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def api(node: Node, path: str) -> Any:
    status, answer = http_json("GET", node.url + path, None, AUTH)
    assert status == 200, (path, answer)
    return answer


def events(node: Node, etype: str) -> list[dict[str, Any]]:
    rows = api(node, f"/api/events?type={etype}&seat=ada")["events"]
    return [api(node, f"/api/events/{row['id']}")["event"]["wire"] for row in reversed(rows)]


def prompts(node: Node) -> list[str]:
    return [p["user_prompt"] for p in events(node, "agent_phase_completed")]


def say(node: Node, text: str) -> None:
    event = {"type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE", "text": f"<@U0ADA> {text}",
             "ts": f"1718000000.{uuid.uuid4().int % 10**6:06d}"}
    body = {"type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex[:10]}", "event": event,
            "authorizations": [{"user_id": "U0ADA", "is_bot": True}]}
    status, answer = http_json("POST", node.url + "/webhooks/slack", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert status == 202, answer


def depth(node: Node) -> Any:
    return next(s["depth"] for s in api(node, "/api/seats")["seats"] if s["handle"] == "ada")


def test_kill_9_of_the_node_running_a_coding_run_moves_the_run_and_its_hold_to_the_seats_next_holder(
    fleet: Fleet, tmp_path: Path  # noqa: F811
) -> None:
    company(tmp_path, WAITS_FOR_THE_GATE)
    for name in ("n1", "n2"):
        fleet.start(name)
    holder = wait_until(lambda: fleet.seat_holders().get("ada"), MOVE_S, "a node running ada")
    running = fleet.nodes[holder]
    survivor = next(node for name, node in fleet.nodes.items() if name != holder)
    say(survivor, "please build the parser")
    wait_until(lambda: events(survivor, "sandbox_run_started"), MOVE_S, "the run started")
    say(survivor, "while you are busy")
    wait_until(lambda: depth(survivor) == 1, MOVE_S, "the mail waits in ada's inbox")

    running.kill()
    wait_until(lambda: fleet.seat_holders().get("ada") == survivor.node, MOVE_S, "the survivor holds ada")
    # The dead node's history is out of the fleet's reads now: what is read is the survivor's own.
    started = wait_until(
        lambda: [e for e in events(survivor, "sandbox_run_started") if e["node"] == survivor.node], MOVE_S,
        "the survivor started the run again",
    )
    assert depth(survivor) == 1 and prompts(survivor) == []  # held before its inbox was attached: nothing ran
    [run] = api(survivor, "/api/sandbox/runs")["runs"]
    assert (run["node"], run["attempt"], run["holds"]) == (survivor.node, 2, True)

    (tmp_path / "gate" / "open").touch()
    wait_until(lambda: any("while you are busy" in p for p in prompts(survivor)), MOVE_S, "the waiting mail's turn")
    told, waited = prompts(survivor)
    [completed] = events(survivor, "sandbox_run_completed")
    assert "finished: build the parser" in told and "while you are busy" in waited
    assert started[0]["node"] == completed["node"] == survivor.node and started[0]["payload"]["attempt"] == 2
    assert completed["outcome"] == "succeeded" and depth(survivor) == 0
