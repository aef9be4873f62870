"""Turns that outlast provider trouble, through a real ``manage.py up``: retries in a round, reads worked again, writes abandoned.

One local OpenAI-compatible server plays each seat's model (scripted per
seat: the request's ``user``), and a real MCP server over stdio is every
seat's toolbox — ``tt__read_file`` is annotated ``readOnlyHint: true``,
``tt__write`` is not. A Slack DM wakes each seat:

* ada — a read, then HTTP 429 with ``Retry-After: 1``: the round waits (the
  header's second scaled by ``delivery.provider_retry_scale``) and retries;
  one turn, one answer;
* bob — the same, but the 429 outlasts the entry's one retry: the turn fails
  having only read, so the delivery is redelivered and answered later;
* cy — a write, then HTTP 400: abandoned with ``turn_trigger_skipped``
  ``wrote outside the engine before breaking``, never worked again, and the
  seat's ``last_error`` says so;
* dee — reads until its ``max_rounds`` (2): ``turn.guard_breach`` ``max_iter``,
  a failed turn, then worked again and answered.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.mcp_support import stdio_command
from tests.up_support import UpProcess, http_call, http_json, up_env
from seats_support import Reply, model_server
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "turn-outlasts-up-operator-token-0123456789"
#: A provider's ``Retry-After: 1`` becomes a 10 ms wait: the header honoured, scaled.
SCALE = "0.01"
SEATS = {"ada": "U0ADA", "bob": "U0BOB", "cy": "U0CY", "dee": "U0DEE"}
RATE_LIMITED = Reply(status=429, headers=(("Retry-After", "1"),))


def company(base_url: str) -> str:
    seats = "\n".join(
        f"  - {{handle: {h}, kind: agent, role: engineer, identities: {{slack: {u}}}, tools: [tt]"
        + (", max_rounds: 2}" if h == "dee" else "}")
        for h, u in SEATS.items()
    )
    return (
        "org: acme\n"
        "providers:\n  llm:\n"
        f"    - {{kind: openai, base_url: \"{base_url}\", model: local-7b, retry: {{attempts: 1, max_wait_s: 5}}}}\n"
        f"mcp_servers:\n  tt: {{command: {json.dumps(stdio_command())}}}\n"
        "surfaces:\n  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}\n"
        f"seats:\n{seats}\n  - {{handle: grace, kind: human, role: lead, identities: {{slack: U0GRACE}}}}\n"
    )


def direct_message(handle: str, user: str) -> dict[str, Any]:
    """grace's Slack DM to the seat, in that seat's own DM channel."""
    return {
        "type": "event_callback",
        "event_id": f"Ev{uuid.uuid4().hex[:10]}",
        "event": {"type": "message", "channel": f"D0{handle.upper()}", "channel_type": "im", "user": "U0GRACE",
                  "text": f"<@{user}> when is the deploy?", "ts": "1718000000.000100"},
        "authorizations": [{"user_id": user, "is_bot": True}],
    }


def answered(up: UpProcess, seat: str) -> list[dict[str, Any]]:
    return [t for t in up.events("agent_turn_completed", seat) if not t["failed"]]


def metric(up: UpProcess, line_start: str) -> str:
    status, _, body = http_call("GET", up.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    return next((line for line in body.decode().splitlines() if line.startswith(line_start)), "")


def live_seat(up: UpProcess, handle: str) -> dict[str, Any]:
    """The seat's live row, as the first frame of ``/ws/stream`` (the projection's snapshot) shows it."""
    from websockets.sync.client import connect

    with connect(up.url.replace("http://", "ws://") + "/ws/stream", additional_headers={"Authorization": f"Bearer {TOKEN}"}, open_timeout=30) as ws:
        snapshot = json.loads(ws.recv(timeout=30))
    return next(s for s in snapshot["seats"] if s["handle"] == handle)


def test_a_round_outlasts_a_429_a_read_only_failure_is_worked_again_and_a_write_then_a_break_is_abandoned(tmp_path: Path) -> None:
    notes, written = tmp_path / "notes.txt", tmp_path / "written.txt"
    notes.write_text("the deploy is on Friday")
    read = Reply(calls=(("tt__read_file", {"path": str(notes)}),))
    with model_server() as server:
        server.scripts = {
            "ada": [read, RATE_LIMITED, Reply(text="ada: Friday")],
            "bob": [read, RATE_LIMITED, RATE_LIMITED, read, Reply(text="bob: Friday")],
            "cy": [Reply(calls=(("tt__write", {"path": str(written), "text": "cy was here"}),)), Reply(status=400)],
            "dee": [read, read, Reply(text="dee: Friday")],
        }
        (tmp_path / "acme.yaml").write_text(company(server.base_url))
        env = up_env(
            CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused", CREWLET_DELIVERY_PROVIDER_RETRY_SCALE=SCALE,
            CREWLET_DELIVERY_BACKOFF_BASE_S="0.1", CREWLET_DELIVERY_BACKOFF_CAP_S="0.2",
        )
        with UpProcess(tmp_path, "--data-dir", str(tmp_path / "data"), "--company", str(tmp_path / "acme.yaml"), node="t1", env=env) as up:
            for handle, user in SEATS.items():
                body = json.dumps(direct_message(handle, user)).encode()
                status, _ = http_json("POST", up.url + "/webhooks/slack", body, {"Content-Type": "application/json"}, empty={})
                assert status == 202

            for handle in ("ada", "bob", "dee"):
                wait_until(lambda: answered(up, handle), 120, f"{handle} answered")
            wait_until(lambda: up.events("turn_trigger_skipped", "cy"), 120, "cy's trigger abandoned")

            ada_turns, bob_turns = up.events("agent_turn_started", "ada"), up.events("agent_turn_started", "bob")
            [ada_phase] = up.events("agent_phase_completed", "ada")
            bob_phases = up.events("agent_phase_completed", "bob")
            [cy_skip] = up.events("turn_trigger_skipped", "cy")
            cy_turns = up.events("agent_turn_started", "cy")
            [breach] = up.events("turn.guard_breach", "dee")
            dee_done = up.events("agent_turn_completed", "dee")
            skipped = {h: up.events("turn_trigger_skipped", h) for h in ("ada", "bob", "dee")}
            retries = metric(up, 'crewlet_llm_retries_total{kind="rate_limited"}')
            cy_depth = metric(up, 'crewlet_mailbox_depth{seat="cy"}')
            cy_live = live_seat(up, "cy")
            assert up.terminate() == 0, up.output()

    # ada: the 429 on round 2 (after a read-only call) was retried after its Retry-After, scaled: one turn, one answer.
    assert len(ada_turns) == 1 and not ada_phase["failed"] and ada_phase["response"] == "ada: Friday"
    first, second = ada_phase["rounds"]
    assert [c["tool"] for c in first["tool_calls"]] == ["read.file"] and second["stop_reason"] == "end"
    assert second["retries"] == [{"attempt": 1, "kind": "rate_limited", "wait_s": 0.01, "retry_after_s": 1.0}]
    assert len(server.of_seat("ada")) == 3
    # bob: the bound ran out, the turn had only read — redelivered and answered, never skipped.
    assert len(bob_turns) == 2 and [p["failed"] for p in bob_phases] == [True, False]
    assert bob_phases[0]["rounds"][1]["retries"][0]["kind"] == "rate_limited" and bob_phases[1]["response"] == "bob: Friday"
    assert skipped == {"ada": [], "bob": [], "dee": []}
    # cy: it wrote, then the model broke — abandoned with its phrase, not redelivered, and the seat says so.
    assert written.read_text() == "cy was here" and len(cy_turns) == 1 and len(server.of_seat("cy")) == 2
    assert cy_skip["reason"] == "wrote outside the engine before breaking" and cy_skip["turn_id"] == cy_turns[0]["turn_id"]
    assert cy_live["last_error"].startswith("wrote outside the engine before breaking: ") and cy_depth.endswith(" 0.0")
    # dee: max_rounds is a max_iter guard breach (a failed turn, not a stop); having only read, it was worked again.
    assert breach["guard"] == "max_iter" and [t["failed"] for t in dee_done] == [True, False]
    assert breach["turn_id"] == dee_done[0]["turn_id"] and dee_done[0]["error"].startswith("max_iter: ")
    assert retries.endswith(" 2.0")  # ada's one retry and bob's one
