"""A steer sent to one node of a 2-node fleet reaches the seat's running turn on the other node, at its next round.

Two real `manage.py up` nodes share a nats-server and the PostgreSQL
coordination store (the fleet of ``tests/fleet/test_fleet_up.py``); ada is
pinned to n1. ada's model holds each request until the test lets it go, so the
turn is mid-round 1 when the note is posted to **n2**'s API: the note crosses
the steer scatter (core NATS) to n1, which answers 202 naming itself, puts the
note into round 2's request and publishes ``agent_turn_steered`` ``delivered``
(round 2). Once the turn has ended, a steer through n2 is refused (409).
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from seats.steering import NO_RUNNING_TURN
from seats_support import Reply, held_model
from tests.fleet.test_fleet_up import MOVE_S, TOKEN, Fleet, fleet, seen, watcher  # noqa: F401  (fixtures)
from tests.up.test_up_inflight import Watcher, broker, loop  # noqa: F401  (fixtures)
from tests.up_support import http_json
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.timeout(400)]

NOTE = "Check with linus before merging."


def company(base_url: str) -> str:
    return (
        "org: acme\n"
        f"providers: {{llm: [{{kind: openai, base_url: \"{base_url}\", model: gpt-test, timeout_s: 120}}]}}\n"
        "surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}\n"
        "seats:\n"
        "  - {handle: ada, kind: agent, identities: {slack: U0ADA}, placement: {node: n1}}\n"
    )


def steer(url: str, note: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    return http_json("POST", f"{url}/api/seats/ada/steer", json.dumps({"note": note}).encode(), headers, empty={})


def test_a_note_posted_to_one_node_is_delivered_by_the_node_running_the_seats_turn_at_its_next_round(
    fleet: Fleet, watcher: Watcher  # noqa: F811
) -> None:
    with held_model([Reply(calls=(("look_around", {}),)), Reply(text="merged")]) as model:
        (fleet.tmp / "company.yaml").write_text(company(model.base_url))
        n1 = fleet.start("n1")
        wait_until(lambda: fleet.seat_holders() == {"ada": "n1"}, MOVE_S, "n1 holding ada")
        n2 = fleet.start("n2")
        wait_until(lambda: "n2" in fleet.leases_named("n2"), MOVE_S, "n2 on the roster")

        n1.post_slack("U0ADA", "D0ADA", "merge the release branch")
        wait_until(lambda: len(model.requests) >= 1, MOVE_S, "ada's round 1 in flight on n1")
        status, accepted = steer(n2.url, NOTE)
        model.gates[0].set()
        wait_until(lambda: len(model.requests) >= 2, MOVE_S, "ada's round 2 in flight")
        model.gates[1].set()
        [steered] = wait_until(lambda: seen(watcher, "agent_turn_steered", "ada"), MOVE_S, "the note recorded")
        [done] = wait_until(lambda: seen(watcher, "agent_turn_completed", "ada"), MOVE_S, "ada's turn completed")
        after_status, after = steer(n2.url, "too late")

    assert status == 202 and accepted["node"] == "n1" and accepted["turn_id"] == done.data.turn_id, accepted
    assert steered.node == "n1" and done.node == "n1"
    assert (steered.data.status, steered.data.phase, steered.data.iteration, steered.data.round) == ("delivered", "respond", 1, 2)
    assert steered.data.note == NOTE and steered.data.note_id == accepted["note_id"]
    assert any(NOTE in str(m.get("content") or "") for m in model.requests[1]["messages"] if m["role"] == "user")
    assert after_status == 409 and after["reason"] == f"seat 'ada' {NO_RUNNING_TURN}", after
