"""Giving a seat tools, the way it runs: ``manage.py up`` with the README's offline company, a Slack mention, a note written."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from tests.browser_support import slack_message
from tests.process_support import REPO_ROOT, descendants, is_running
from up_support import UpProcess, http_json, turn_completed, up_env
from waiting_support import wait_until

TOKEN = "tools-up-operator-token-0123456789"
NOTES_COMPANY = REPO_ROOT / "crewlet" / "companies" / "notes.yaml"


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_slack_mention_makes_ada_write_a_note_through_her_mcp_tool_in_two_recorded_rounds(tmp_path: Path) -> None:
    # The shipped company names its paths relative to where `up` runs (bin/up runs in the repository):
    # this run's directory gets the same two, so the file is used exactly as shipped.
    os.symlink(REPO_ROOT / ".venv", tmp_path / ".venv")
    os.symlink(REPO_ROOT / "seats", tmp_path / "seats")
    data_dir = tmp_path / "data"
    env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN)
    with UpProcess(tmp_path, "--data-dir", str(data_dir), "--company", str(NOTES_COMPANY), node="t1", env=env) as up:
        mention = slack_message(f"Ev{uuid.uuid4().hex[:10]}", "remember the deploy is on Friday")
        status, accepted = http_json(
            "POST", f"{up.url}/webhooks/slack", json.dumps(mention).encode(), {"Content-Type": "application/json"}
        )
        assert status == 202 and accepted["accepted"], accepted
        types = turn_completed(up.url + "/", accepted["trace_id"], TOKEN)
        note = tmp_path / "var" / "notes" / "inbox.md"
        assert "remember the deploy is on Friday" in note.read_text()

        rows = up.api(f"/api/events?trace_id={accepted['trace_id']}&type=agent_phase_completed")["events"]
        (row,) = [r for r in rows if r["type"] == "agent_phase_completed"]
        phase = up.api(f"/api/events/{row['id']}")["event"]["wire"]  # the body's fields ride the envelope
        servers = [pid for pid in descendants(up.proc.pid) if "notes_server.py" in command_line(pid)]
    assert "agent_turn_completed" in types and "tool_server_unavailable" not in types
    assert "The message came from slack:D0ADA;" in phase["system_prompt"]  # where a chat tool would answer
    first, second = phase["rounds"]
    assert (first["stop_reason"], second["stop_reason"]) == ("tool_use", "end")
    (called,) = first["tool_calls"]
    assert (called["server"], called["tool"], called["ok"]) == ("notes", "write_note", True)
    assert second["tool_calls"] == []
    # The session was the node's: kept while it ran, and its child stopped with it.
    assert len(servers) == 1
    wait_until(lambda: not any(is_running(pid) for pid in servers), timeout_s=10, what="the notes server stopped with up")
