"""``GET /api/deliveries/{id}`` and its dashboard page through a real `manage.py up` (SQLite, the echo model).

A Slack delivery to a paused seat reads waiting, held by that pause, first in
the inbox; once the seat is resumed it reads worked, with the turn that took
it; an id no event names is a 404 that says so.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.browser_support import slack_message
from tests.up_support import UpProcess, dashboard_pages, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "delivery-up-operator-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
COMPANY = """\
org: acme
providers:
  llm:
    - kind: echo
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}
"""


def call(up: UpProcess, method: str, path: str, body: Optional[dict[str, Any]] = None) -> tuple[int, Any]:
    return http_json(method, up.url + path, json.dumps(body).encode() if body is not None else None, AUTH)


def delivery(up: UpProcess, delivery_id: str) -> dict[str, Any]:
    """The answer's ``delivery`` with the answer's ``coverage`` beside it; {} while no event names it."""
    status, answer = call(up, "GET", f"/api/deliveries/{delivery_id}")
    return {**answer["delivery"], "coverage": answer["coverage"]} if status == 200 else {}


def test_a_delivery_to_a_paused_seat_waits_held_by_the_pause_and_reads_worked_with_its_turn_once_resumed(tmp_path: Path) -> None:
    company = tmp_path / "company.yaml"
    company.write_text(COMPANY)
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_OPERATOR_TOKEN=TOKEN)
    with UpProcess(tmp_path, "--company", str(company), node="t1", env=env) as up:
        assert call(up, "POST", "/api/seats/ada/pause", {"reason": "maintenance"})[0] == 200
        status, accepted = call(up, "POST", "/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "deploy please"))
        assert status == 202, accepted
        delivery_id = accepted["delivery_id"]

        waiting = wait_until(
            lambda: (d := delivery(up, delivery_id)) and d["seats"] and (d["seats"][0]["waiting"] or {}).get("held_by") and d,
            60, "the delivery read waiting behind the pause",
        )
        assert waiting["state"] == "waiting" and waiting["accepted"] is not None and waiting["source"] == "slack"
        (seat,) = waiting["seats"]
        assert (seat["seat"], seat["state"], seat["turn"]) == ("ada", "waiting", None)
        assert seat["waiting"]["seat_state"] == "paused" and seat["waiting"]["position"] == 1
        assert seat["waiting"]["held_by"]["kind"] == "pause" and seat["waiting"]["held_by"]["reason"] == "maintenance"

        assert call(up, "POST", "/api/seats/ada/resume", {})[0] == 200
        worked = wait_until(lambda: (d := delivery(up, delivery_id)) and d["state"] == "worked" and d, 60, "the delivery read worked")
        (seat,) = worked["seats"]
        status, started = call(up, "GET", "/api/events?type=agent_turn_started&seat=ada")
        assert [row["turn_id"] for row in started["events"]] == [seat["turn"]["turn_id"]]
        assert seat["turn"]["outcome"] == "ok" and seat["waiting"] is None
        assert "agent_turn_started" in [e["type"] for e in worked["events"]]
        assert worked["coverage"]["complete"] is True and [n["id"] for n in worked["coverage"]["nodes"]] == ["t1"]

        status, missing = call(up, "GET", "/api/deliveries/no-such-delivery")
        assert status == 404 and missing["reason"] == "no such delivery in the history" and missing["param"] == "delivery_id"

        link = f'/deliveries/event/{seat["wake_event_id"]}/'
        page, events_page, followed = dashboard_pages(up, f"/deliveries/{delivery_id}/", "/events/", link)
        assert f'data-delivery="{delivery_id}"' in page and 'data-state="worked"' in page and seat["turn"]["turn_id"] in page
        # The event log's wake row links to the delivery's page, through the event that names it.
        assert link in events_page and f'data-delivery="{delivery_id}"' in followed
        assert up.terminate() == 0, up.output()
