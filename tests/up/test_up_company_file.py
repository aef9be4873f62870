"""The company file across restarts of a real `manage.py up`: edited (here, only a seat's instructions file), it is
the company the next start runs and says so — a log line and ``config_revision_activated`` naming the file; unchanged,
the active revision runs and one line says which and why."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.browser_support import slack_message
from tests.up_support import UpProcess, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "company-file-up-operator-token-0123456789"
COMPANY = """\
org: acme
providers:
  llm: [{kind: echo}]
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}, instructions_file: ada.md}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}
"""


def system_prompt_of_a_turn(up: UpProcess) -> str:
    """Wake ada with a direct message; the system prompt of the phase it ran."""
    message = json.dumps(slack_message(f"Ev{uuid.uuid4().hex[:10]}", "what is your job?")).encode()
    status, accepted = http_json("POST", f"{up.url}/webhooks/slack", message, {"Content-Type": "application/json"})
    assert status == 202, accepted
    trace = accepted["trace_id"]
    rows = wait_until(
        lambda: up.api(f"/api/events?trace_id={trace}&type=agent_phase_completed")["events"], 90, "ada's phase completed"
    )
    return str(up.api(f"/api/events/{rows[0]['id']}")["event"]["wire"]["system_prompt"])


def test_an_edited_company_file_runs_after_a_restart_and_an_unchanged_one_keeps_the_active_revision(tmp_path: Path) -> None:
    path = tmp_path / "acme.yaml"
    path.write_text(COMPANY)
    (tmp_path / "ada.md").write_text("Version one: you own the deploy.")
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_OPERATOR_TOKEN=TOKEN)
    shown = str(path.resolve())

    def start() -> UpProcess:
        return UpProcess(tmp_path, "--company", str(path), node="t1", env=env)

    with start() as up:
        first = up.wait_for("event=company_file_imported")
        wait_until(lambda: len(up.events("config_revision_activated")) == 1, 60, "the first import's activation was recorded")
        assert "Version one" in system_prompt_of_a_turn(up)
        assert up.terminate() == 0, up.output()
    assert "revision=1 " in first and 'reason="the store had no active revision"' in first

    (tmp_path / "ada.md").write_text("Version two: you own the deploy and the pager.")
    with start() as up:
        second = up.wait_for("event=company_file_imported")
        wait_until(lambda: len(up.events("config_revision_activated")) == 2, 60, "the edited file's activation was recorded")
        one, two = up.events("config_revision_activated")
        prompt = system_prompt_of_a_turn(up)
        assert up.terminate() == 0, up.output()
    assert 'reason="the file differs from revision 1, which it was last imported as"' in second and "revision=2 " in second
    assert (one["revision"], one["source_file"]) == (1, shown)
    assert (two["revision"], two["previous_revision"], two["activated_by"], two["source_file"]) == (2, 1, "up", shown)
    assert "Version two: you own the deploy and the pager." in prompt and "Version one" not in prompt

    with start() as up:
        unchanged = up.wait_for("event=company_file_")
        prompt = system_prompt_of_a_turn(up)
        stored = up.events("config_revision_activated")
        assert up.terminate() == 0, up.output()
    assert "event=company_file_unchanged revision=2 " in unchanged
    assert 'reason="the file is unchanged since it was imported as this revision"' in unchanged
    assert len(stored) == 2  # no activation: the revision that ran before runs again
    assert "Version two" in prompt
