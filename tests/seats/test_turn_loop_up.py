"""The tool loop through a real `manage.py up`: a Slack mention wakes ada, whose scripted model asks linus with a2a_ask;
and a person's pause with stop_running, posted to the API, ends a looping turn at its next round.

Offline: the echo model's script is the model, ``a2a_ask`` the tool. What is
asserted is read back the way an operator reads it, through ``/api/events``.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.browser_support import slack_message
from tests.up_support import ADA_ASKS_LINUS_ON_SLACK, UpProcess, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "turn-loop-up-operator-token-0123456789abcdef"
COMPANY = """\
org: acme
providers:
  llm:
    - kind: echo
      match: "ask linus"
      script:
        - {tool: a2a_ask, arguments: {to: linus, brief: "is the deploy green?"}}
""" + ADA_ASKS_LINUS_ON_SLACK


def test_a_slack_mention_runs_adas_tool_loop_and_linus_answer_wakes_her_with_the_channel_closed(tmp_path: Path) -> None:
    company = tmp_path / "company.yaml"
    company.write_text(COMPANY)
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_OPERATOR_TOKEN=TOKEN)
    with UpProcess(tmp_path, "--company", str(company), node="t1", env=env) as up:
        body = slack_message(f"Ev{uuid.uuid4().hex[:10]}", "please ask linus about the deploy")
        assert up.call("/webhooks/slack", "POST", body)[0] == 202

        wait_until(lambda: len(up.events("agent_phase_completed", "ada")) == 2, 60, "ada asked, then was woken")
        closed = up.events("a2a_channel_closed")
        asking, woken = up.events("agent_phase_completed", "ada")
        [answering] = up.events("agent_phase_completed", "linus")
        assert up.terminate() == 0, up.output()

    rounds = asking["rounds"]
    assert [r["stop_reason"] for r in rounds] == ["tool_use"]  # the turn ends after a2a_ask
    [ask] = rounds[0]["tool_calls"]
    assert (ask["name"], ask["ok"]) == ("a2a_ask", True)
    assert asking["tool_calls"][0]["arguments"] == {"to": "linus", "brief": "is the deploy green?"}
    assert answering["user_prompt"] == "ada: is the deploy green?"
    assert woken["user_prompt"] == f"linus: {answering['response']}"
    [channel] = closed
    cid = channel["channel_id"]
    assert (channel["closed_by"], channel["turn_id"], channel["work_key"]) == (
        "linus", answering["turn_id"], f"a2a:{cid}"
    )


LOOPING = """\
org: acme
providers:
  llm:
    - kind: echo
      delay_s: 1.0
      repeat: true
      script:
        - {tool: nope, arguments: {}}
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}, max_rounds: 100}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}
"""


def test_a_pause_with_stop_running_posted_to_the_api_ends_a_looping_turn_at_its_next_round(tmp_path: Path) -> None:
    company = tmp_path / "company.yaml"
    company.write_text(LOOPING)
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_OPERATOR_TOKEN=TOKEN)
    with UpProcess(tmp_path, "--company", str(company), node="t1", env=env) as up:
        assert up.call("/webhooks/slack", "POST", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "loop until stopped"))[0] == 202
        wait_until(lambda: up.events("agent_turn_started", "ada"), 60, "ada's turn began")
        assert up.call("/api/seats/ada/pause", "POST", {"reason": "wrong repo", "stop_running": True})[0] == 200
        wait_until(lambda: up.events("agent_turn_completed", "ada"), 60, "the turn ended")
        [stopped] = up.events("agent_turn_stopped", "ada")
        [phase] = up.events("agent_phase_completed", "ada")
        [done] = up.events("agent_turn_completed", "ada")
        [paused] = up.events("seat_paused", "ada")
        assert up.terminate() == 0, up.output()

    assert (stopped["stopped_by"], stopped["reason"]) == (paused["paused_by"], "wrong repo")
    assert (done["stopped"], done["failed"]) == (True, False)
    reasons = [r["stop_reason"] for r in phase["rounds"]]
    assert reasons[-1] == "paused" and set(reasons[:-1]) == {"tool_use"} and len(reasons) < 100
