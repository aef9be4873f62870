"""GET /api/deliveries/{id} over stored rows: the rows naming a delivery, the digest and the turn its wake became."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from crewlet.events.types.notification import coalesced_trigger_id
from eventstore.questions import NodeScope
from eventstore_support import AT, make_event, store

pytestmark = [pytest.mark.django_db(databases=["default", "events"])]

T0 = AT - timedelta(hours=1)
S = timedelta(seconds=1)


def test_a_wake_merged_into_a_digest_reads_worked_by_the_digests_turn_and_a_lookalike_id_is_not_it(api_client: Any, scope: NodeScope) -> None:
    delivery = "Ev_1%a"
    merged = coalesced_trigger_id(["wake-1", "wake-0"])
    store(
        make_event("inbound_delivery", T0, event_id="in-1", surface="slack", provider="slack", event_name="message", delivery_id=delivery),
        make_event("external_notification", T0 + S, event_id="wake-1", seat="ada", delivery_id=delivery, extras={"why": "dm"}),
        # Ids LIKE's wildcards and SQLite's case-blind LIKE would take for the delivery's: not its rows.
        make_event("external_notification", T0 + S, event_id="wake-x", seat="ada", delivery_id="EvX1Za"),
        make_event("external_notification", T0 + S, event_id="wake-y", seat="ada", delivery_id="ev_1%a"),
        make_event("notification_skipped", T0 + S, event_id="skip-1", reason="no seat", recipient="U0GHOST", delivery_id=delivery),
        make_event("notifications_coalesced", T0 + 2 * S, event_id="co-1", seat="ada", event_ids=["wake-1", "wake-0"], count=2),
        make_event("agent_turn_started", T0 + 3 * S, event_id="ts-1", seat="ada", turn_id="turn-1", trigger_event_id=merged),
        make_event("agent_turn_completed", T0 + 4 * S, event_id="tc-1", seat="ada", turn_id="turn-1"),
    )
    response = api_client.get(f"/api/deliveries/{delivery.replace('%', '%25')}")
    assert response.status_code == 200, response.content[:300]
    answer = response.json()
    found = answer["delivery"]
    assert answer["coverage"]["complete"] is True
    assert (found["state"], found["accepted"]["event_id"]) == ("worked", "in-1")
    (seat,) = found["seats"]
    assert (seat["seat"], seat["wake_event_id"], seat["why"]) == ("ada", "wake-1", "dm")
    assert seat["coalesced"]["trigger_event_id"] == merged and seat["coalesced"]["event_ids"] == ["wake-1", "wake-0"]
    assert (seat["turn"]["turn_id"], seat["turn"]["outcome"]) == ("turn-1", "ok")
    assert [(k["recipient"], k["reason"]) for k in found["skipped"]] == [("U0GHOST", "no seat")]
    assert [e["id"] for e in found["events"]] == ["in-1", "skip-1", "wake-1", "co-1", "ts-1"]


def test_an_id_no_row_names_is_a_404_that_says_which_history_it_looked_at(api_client: Any, scope: NodeScope) -> None:
    response = api_client.get("/api/deliveries/nothing-here")
    body = response.json()
    assert response.status_code == 404
    assert (body["param"], body["reason"]) == ("delivery_id", "no such delivery in the history")
    assert body["coverage"]["complete"] is True and body["at"]
