"""A seat's memory through a real `manage.py up`: a turn remembers, reflection learns, the next turn is given both;
the API lists and forgets; a restart replays the memory of all its seats in one read.

Offline: the echo model's script is the model (it calls ``memory_remember``
when asked to remember, and otherwise answers with its prompt, so the memory
block it was given is in its answer); ``providers.reflection`` is a second
scripted echo answering the reflection's JSON. Read back the way an operator
reads it: ``/api/events`` and ``/api/seats/{handle}/memory``.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.browser_support import slack_message
from tests.seats.test_seat_instructions_up import dashboard_page
from tests.up_support import UpProcess, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "seat-memory-up-operator-token-0123456789abcdef"
COMPANY = """\
org: acme
providers:
  llm:
    - kind: echo
      match: "please remember"
      script:
        - {tool: memory_remember, arguments: {key: deploy, value: "deploys happen on Thursdays at five"}}
        - {answer: noted}
  reflection:
    - kind: echo
      script:
        - {answer: '{"counterparties": {"U0GRACE": "plans the deploys"}, "facts": {}}'}
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}
# The next turn is given memory alone: an episode would quote the first turn's "please remember" to the echo's match.
episodes: {recent: 0}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}, tools: [memory], reflection: on}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}
""" + "".join(f"  - {{handle: f{i}, kind: agent, role: engineer}}\n" for i in range(1, 17))  # more seats than one round of attaches


def say(up: UpProcess, text: str) -> None:
    assert up.call("/webhooks/slack", "POST", slack_message(f"Ev{uuid.uuid4().hex[:10]}", text))[0] == 202


def test_a_turn_remembers_a_row_the_next_turn_is_given_it_and_an_operator_lists_and_forgets_it(tmp_path: Path) -> None:
    company = tmp_path / "company.yaml"
    company.write_text(COMPANY)
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_OPERATOR_TOKEN=TOKEN)
    with UpProcess(tmp_path, "--company", str(company), node="t1", env=env) as up:
        say(up, "please remember when we deploy")
        wait_until(lambda: up.events("reflection_completed", "ada"), 60, "ada remembered and reflected")
        say(up, "when is the deploy?")
        wait_until(lambda: len(up.events("agent_phase_completed", "ada")) == 2, 60, "ada answered")
        remembering, answering = up.events("agent_phase_completed", "ada")
        sizes = up.events("prompt.size", "ada")
        reflected = up.events("reflection_completed", "ada")[0]
        handed = up.events("turn_completed", "ada")
        spends = up.events("auxiliary_spend", "ada")
        profiles = up.events("counterparty_profile_updated", "ada")

        page = dashboard_page(up, "/seats/ada/memory/?table=notes")
        status, listed = up.call("/api/seats/ada/memory?table=notes")
        refused = up.call("/api/seats/ada/memory?table=Not%20A%20Table")
        forgotten = up.call("/api/seats/ada/memory?table=notes&key=deploy", "DELETE")
        after = up.call("/api/seats/ada/memory")[1]
        [audit] = up.events("operator_acted")
        assert up.terminate() == 0, up.output()
    log = up.output()

    assert remembering["tool_calls"][0]["name"] == "memory_remember"
    assert "counterparty/U0GRACE: plans the deploys" in answering["user_prompt"]  # the person it talks to, first
    assert "notes/deploy: deploys happen on Thursdays at five" in answering["user_prompt"]  # then the search's hit
    assert "deploys happen on Thursdays at five" in answering["response"]
    assert [s["memory_rows"] for s in sizes] == [0, 2] and sizes[1]["memory_bytes"] > 0
    assert reflected["rows"] == [{"table": "counterparty", "key": "U0GRACE"}] and reflected["turn_id"] == remembering["turn_id"]
    assert handed[0]["turn_id"] == remembering["turn_id"] and handed[0]["node"] == reflected["node"] == "t1"
    assert profiles[0]["counterparty"] == "U0GRACE"
    assert spends[0]["stage"] == "reflection" and spends[0]["calls"] == 1 and spends[0]["input_tokens"] > 0
    assert "event=seat_memory_replayed seat=ada rows=0" in log

    assert status == 200 and [(r["table"], r["key"], r["value"], r["written_by"]) for r in listed["rows"]] == [
        ("notes", "deploy", "deploys happen on Thursdays at five", "turn")
    ]
    assert 'data-table="notes" data-key="deploy"' in page and "deploys happen on Thursdays at five" in page
    assert 'data-key="U0GRACE"' not in page and 'class="chip" href="?table=counterparty"' in page  # filtered
    assert refused[0] == 400 and refused[1]["param"] == "table" and "Not A Table" in refused[1]["reason"]
    assert forgotten == (200, {"forgotten": True, "table": "notes", "key": "deploy"})
    assert [(r["table"], r["key"], r["written_by"]) for r in after["rows"]] == [("counterparty", "U0GRACE", "reflection")]
    assert (audit["tool"], audit["outcome"]) == ("seat_memory_forget", "forgotten")
    assert audit["token"] and audit["position"].startswith("crewlet.memory.ada.notes.")

    with UpProcess(tmp_path, "--company", str(company), node="t1", env=env) as again:
        replayed = again.call("/api/seats/ada/memory")[1]
        assert again.terminate() == 0, again.output()
    restarted = again.output()
    assert [(r["table"], r["key"]) for r in replayed["rows"]] == [("counterparty", "U0GRACE")]  # from the stream: a stop drops the copy
    assert "event=seat_memory_replayed_together seats=17 rows=1 messages=2 " in restarted  # the row, and the forget's tombstone
    assert "event=seat_memory_replayed seat=ada rows=1 messages=2 tombstones=1 " in restarted
