"""Steering a running turn through a real ``manage.py up``: ``POST /api/seats/{handle}/steer`` and ``agent_turn_steered``.

ada's model is a local OpenAI-compatible server that holds each request until
the test lets it go, so the turn is reliably mid-round when a note is sent.
Its first answer asks for a tool nobody offered (a result the model reads, so
there is a second round); its second ends the turn. grace's Slack DM wakes ada.

* before any turn runs, a steer is refused (409, the reason says there is no
  running turn) and nothing is recorded;
* a note sent while round 1 is in flight — through the operator's MCP server's
  ``seat_steer``, with the official client — is in round 2's request, marked as
  a person's note, and recorded ``delivered`` at phase respond, iteration 1,
  round 2, with the note, its id (the one the tool answered), who sent it and
  when; the call is one ``operator_acted`` (outcome ``accepted``, never the note);
* a note sent while round 2 (the last) is in flight is never read: ``expired``;
* bad requests are refused with the field and what is allowed;
* the running turn's dashboard page carries the steer box.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from crewlet.http.auth import SEEDED_TOKEN_NAME
from eventstore.console import operator_mcp as om
from seats.steering import NO_RUNNING_TURN
from tests.up_support import UpProcess, dashboard_page, http_json, up_env
from seats_support import Reply, held_model
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "steer-up-operator-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
FIRST_NOTE = "Use the staging cluster, not production."
LATE_NOTE = "Also mention the rollback plan."


def company(base_url: str) -> str:
    return (
        "org: acme\n"
        f"providers:\n  llm:\n    - {{kind: openai, base_url: \"{base_url}\", model: local-7b, timeout_s: 120}}\n"
        "surfaces:\n  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}\n"
        "seats:\n"
        "  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}}\n"
        "  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}\n"
    )


def direct_message() -> dict[str, Any]:
    return {
        "type": "event_callback",
        "event_id": f"Ev{uuid.uuid4().hex[:10]}",
        "event": {"type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE",
                  "text": "<@U0ADA> please ship the release", "ts": f"1718000000.{uuid.uuid4().int % 10**6:06d}"},
        "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
    }


def steer(up: UpProcess, handle: str, body: Any, headers: dict[str, str] = AUTH) -> tuple[int, Any]:
    return http_json("POST", f"{up.url}/api/seats/{handle}/steer", json.dumps(body).encode(), headers, empty={})


def steer_over_mcp(up: UpProcess, handle: str, note: str) -> tuple[bool, Any]:
    """``seat_steer`` called by the official MCP client with the operator token: (is_error, its answer or text)."""

    async def call() -> Any:
        async with httpx2.AsyncClient(headers={"Authorization": AUTH["Authorization"]}, timeout=httpx2.Timeout(30.0)) as http:
            async with streamable_http_client(up.url + om.MCP_PATH, http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    return await session.call_tool(om.TOOL_SEAT_STEER, {"handle": handle, "note": note})

    result = asyncio.run(call())
    text = "".join(getattr(block, "text", "") for block in result.content)
    return result.is_error, text if result.is_error else json.loads(text)


def two(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return found if len(found) >= 2 else []


def texts(request: dict[str, Any]) -> list[str]:
    return [str(m.get("content") or "") for m in request["messages"] if m["role"] == "user"]


def test_a_note_reaches_the_running_turn_at_its_next_round_and_one_no_round_reads_expires(tmp_path: Path) -> None:
    replies = [Reply(calls=(("look_around", {}),)), Reply(text="shipped to staging")]
    with held_model(replies) as model:
        (tmp_path / "acme.yaml").write_text(company(model.base_url))
        env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused", CREWLET_VAR_DIR=str(tmp_path / "data"))
        with UpProcess(tmp_path, "--company", str(tmp_path / "acme.yaml"), node="s1", env=env) as up:
            idle_status, idle = steer(up, "ada", {"note": "anyone there?"})
            refusals = {
                "unknown seat": steer(up, "nobody", {"note": "hi"}),
                "human seat": steer(up, "grace", {"note": "hi"}),
                "empty note": steer(up, "ada", {"note": ""}),
                "extra field": steer(up, "ada", {"note": "hi", "urgent": True}),
                "long note": steer(up, "ada", {"note": "x" * 4001}),
                "no token": steer(up, "ada", {"note": "hi"}, {"Content-Type": "application/json"}),
            }

            status, _ = http_json("POST", up.url + "/webhooks/slack", json.dumps(direct_message()).encode(),
                                  {"Content-Type": "application/json"}, empty={})
            assert status == 202
            wait_until(lambda: len(model.requests) >= 1, 120, "ada's round 1 is in flight")
            [started] = wait_until(lambda: up.events("agent_turn_started", "ada"), 120, "ada's turn started on record")
            running_page = dashboard_page(up, f"/turns/{started['turn_id']}/")
            first_error, first = steer_over_mcp(up, "ada", FIRST_NOTE)
            model.gates[0].set()
            wait_until(lambda: len(model.requests) >= 2, 120, "ada's round 2 is in flight")
            late_status, late = steer(up, "ada", {"note": LATE_NOTE})
            model.gates[1].set()

            steered = wait_until(lambda: two(up.events("agent_turn_steered", "ada")), 120, "both notes recorded")
            [done] = wait_until(lambda: up.events("agent_turn_completed", "ada"), 120, "ada's turn completed")
            after_status, after = steer(up, "ada", {"note": "too late"})
            steered_after = up.events("agent_turn_steered", "ada")
            [acted] = up.events("operator_acted")
            assert up.terminate() == 0, up.output()

    # No running turn: refused with the reason, nothing recorded.
    assert idle_status == 409 and idle["reason"] == f"seat 'ada' {NO_RUNNING_TURN}" and idle["param"] == "handle", idle
    assert after_status == 409 and after["reason"] == idle["reason"] and len(steered_after) == 2
    assert {k: s for k, (s, _) in refusals.items()} == {
        "unknown seat": 404, "human seat": 409, "empty note": 400, "extra field": 400, "long note": 400, "no token": 401,
    }, refusals
    assert refusals["empty note"][1]["param"] == "note" and refusals["long note"][1]["param"] == "note"
    # The running turn's page has the steer box, posting to the seat's steer route.
    assert '<form id="steer" data-seat="ada"' in running_page and "/steer`" in running_page
    # Accepted while a turn runs: which node, which turn.
    assert first_error is False and late_status == 202, (first, late)
    assert (acted["tool"], acted["outcome"], acted["transport"], acted["token"]) == ("seat_steer", "accepted", "mcp", SEEDED_TOKEN_NAME)
    assert FIRST_NOTE not in json.dumps(acted)  # never the arguments
    assert first["node"] == "s1" and first["turn_id"] == late["turn_id"] == done["turn_id"]
    # Round 2's request carries the note, marked as a person's; round 1's did not.
    assert not any(FIRST_NOTE in t for t in texts(model.requests[0]))
    [marked] = [t for t in texts(model.requests[1]) if FIRST_NOTE in t]
    assert marked.startswith(f"[A note from {SEEDED_TOKEN_NAME}, a person steering this turn while it runs]")
    by_id = {e["note_id"]: e for e in steered}
    delivered, expired = by_id[first["note_id"]], by_id[late["note_id"]]
    assert (delivered["status"], delivered["phase"], delivered["iteration"], delivered["round"]) == ("delivered", "respond", 1, 2)
    assert delivered["note"] == FIRST_NOTE and delivered["steered_by"] == SEEDED_TOKEN_NAME and delivered["sent_at"]
    assert delivered["turn_id"] == done["turn_id"] and delivered["steered_by_seat"] == ""
    assert (expired["status"], expired["round"], expired["note"]) == ("expired", 0, LATE_NOTE)
    assert expired["turn_id"] == done["turn_id"] and not done["failed"]
