"""A seat on one node of a 2-node fleet, operated through the other: a steer, and "where is this delivery?".

Two real `manage.py up` nodes share a nats-server and the PostgreSQL
coordination store (the fleet of ``tests/fleet/test_fleet_up.py``); ada is
pinned to n1. ada's model holds each request until the test lets it go.

Its first answer is an HTTP 500 (no retry inside the round), so the turn fails
and the wake is handed back to come again after n1's backoff: **n2**'s
``GET /api/deliveries/{id}`` reads it waiting, delivery 1 of 25 spent, the
next attempt's time, the failed turn beside it, from n1's history through the
fleet read (the delivery was posted to, and accepted by, n2). The wake comes again and its turn is mid-round 1 when the note is
posted to n2's API: the note crosses the steer scatter (core NATS) to n1,
which answers 202 naming itself, puts the note into round 2's request and
publishes ``agent_turn_steered`` ``delivered`` (round 2). Once the turn has
ended, the delivery reads worked through n2, and a steer through n2 is
refused (409).
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Optional

import pytest

from seats.steering import NO_RUNNING_TURN
from seats_support import Reply, held_model
from tests.browser_support import slack_message
from tests.fleet.test_fleet_up import MOVE_S, TOKEN, Fleet, Node, fleet, seen, watcher  # noqa: F401  (fixtures)
from tests.up.test_up_inflight import Watcher, broker, loop  # noqa: F401  (fixtures)
from tests.up_support import http_json
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.timeout(400)]

NOTE = "Check with linus before merging."
#: n1's spacing before a failed wake comes again: n2 reads it waiting meanwhile, with room for a loaded machine.
BACKOFF_S = "10"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def company(base_url: str) -> str:
    return (
        "org: acme\n"
        f"providers: {{llm: [{{kind: openai, base_url: \"{base_url}\", model: gpt-test, timeout_s: 120, retry: {{attempts: 0}}}}]}}\n"
        "surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}\n"
        "seats:\n"
        "  - {handle: ada, kind: agent, identities: {slack: U0ADA}, placement: {node: n1}}\n"
    )


def steer(url: str, note: str) -> tuple[int, Any]:
    return http_json("POST", f"{url}/api/seats/ada/steer", json.dumps({"note": note}).encode(), AUTH, empty={})


def seat_path(url: str, delivery_id: str) -> Optional[dict[str, Any]]:
    """ada's path for the delivery as ``url``'s node answers it (the fleet's read), with the (type, node) of its
    events as ``rows`` and whether every live node answered as ``complete``; None while no event names it."""
    status, answer = http_json("GET", f"{url}/api/deliveries/{delivery_id}", None, AUTH, empty={})
    if status != 200:
        return None
    (seat,) = answer["delivery"]["seats"]
    rows = [(e["type"], e["node"]) for e in answer["delivery"]["events"]]
    return {**seat, "rows": rows, "complete": answer["coverage"]["complete"]}


def test_a_note_posted_to_one_node_is_delivered_by_the_node_running_the_seats_turn_at_its_next_round(
    fleet: Fleet, watcher: Watcher  # noqa: F811
) -> None:
    replies = [Reply(status=500), Reply(calls=(("look_around", {}),)), Reply(text="merged")]
    with held_model(replies) as model:
        (fleet.tmp / "company.yaml").write_text(company(model.base_url))
        n1 = Node(fleet, "n1")
        n1.env.update(CREWLET_DELIVERY_BACKOFF_BASE_S=BACKOFF_S, CREWLET_DELIVERY_BACKOFF_CAP_S=BACKOFF_S)
        fleet.nodes["n1"] = n1.start()
        wait_until(lambda: fleet.seat_holders() == {"ada": "n1"}, MOVE_S, "n1 holding ada")
        n2 = fleet.start("n2")
        wait_until(lambda: "n2" in fleet.leases_named("n2"), MOVE_S, "n2 on the roster")

        body = json.dumps(slack_message(f"Ev{uuid.uuid4().hex[:10]}", "merge the release branch")).encode()
        posted, sent = http_json("POST", n2.url + "/webhooks/slack", body, {"Content-Type": "application/json"})
        assert posted == 202, sent
        model.gates[0].set()  # the first attempt fails: the wake is handed back for BACKOFF_S
        retrying = wait_until(
            lambda: (p := seat_path(n2.url, sent["delivery_id"])) and p["complete"] and (p["waiting"] or {}).get("retry") and p,
            MOVE_S, "n2 reading the delivery waiting for its retry",
        )
        wait_until(lambda: len(model.requests) >= 2, MOVE_S, "the wake come again: ada's round 1 in flight on n1")
        status, accepted = steer(n2.url, NOTE)
        model.gates[1].set()
        wait_until(lambda: len(model.requests) >= 3, MOVE_S, "ada's round 2 in flight")
        model.gates[2].set()
        [steered] = wait_until(lambda: seen(watcher, "agent_turn_steered", "ada"), MOVE_S, "the note recorded")
        done = wait_until(
            lambda: [e for e in seen(watcher, "agent_turn_completed", "ada") if not e.data.failed], MOVE_S, "ada's turn completed"
        )[0]
        worked = wait_until(
            lambda: (p := seat_path(n2.url, sent["delivery_id"])) and p["complete"] and p["state"] == "worked" and p,
            MOVE_S, "the delivery worked",
        )
        after_status, after = steer(n2.url, "too late")

    # Accepted on n2, failed and handed back on n1: n2 reads both nodes' halves, every live node answering.
    assert retrying["complete"] is True and worked["complete"] is True
    assert (retrying["state"], retrying["turn"]["outcome"]) == ("waiting", "failed"), retrying
    assert {("agent_turn_started", "n1"), ("message_retry_scheduled", "n1")} <= set(retrying["rows"]), retrying["rows"]
    assert any(node == "n2" for _, node in retrying["rows"]), retrying["rows"]
    retry = retrying["waiting"]["retry"]
    assert (retry["delivery"], retry["max_deliveries"]) == (1, 25) and retry["retry_at"] > retrying["routed_at"], retry
    assert worked["turn"]["turn_id"] == done.data.turn_id and worked["turn"]["outcome"] == "ok" and worked["waiting"] is None
    assert status == 202 and accepted["node"] == "n1" and accepted["turn_id"] == done.data.turn_id, accepted
    assert steered.node == "n1" and done.node == "n1"
    assert (steered.data.status, steered.data.phase, steered.data.iteration, steered.data.round) == ("delivered", "respond", 1, 2)
    assert steered.data.note == NOTE and steered.data.note_id == accepted["note_id"]
    assert any(NOTE in str(m.get("content") or "") for m in model.requests[2]["messages"] if m["role"] == "user")
    assert after_status == 409 and after["reason"] == f"seat 'ada' {NO_RUNNING_TURN}", after
