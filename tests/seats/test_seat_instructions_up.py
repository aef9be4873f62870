"""Two agent seats, each with its own instructions and its own model, through a real `manage.py up`.

Each seat's provider chain is an OpenAI-compatible server of its own on
loopback (``seats_support.model_server``); a direct message to each seat must
reach that seat's server only, with that seat's instructions after the
engine's framing in the system prompt — read back from the phase's
``system_prompt`` through ``/api/``, from what each server received, and from
the seat's dashboard page.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from seats_support import model_server
from tests.browser_support import slack_message
from tests.up_support import UpProcess, dashboard_page, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN = "seat-instructions-up-operator-token-0123456789"
ADA_MD = "You own the deploy pipeline.\nNever deploy on a Friday.\n"
LINUS_SAYS = "Review every diff twice; say LGTM only when it builds."


def company(ada_url: str, linus_url: str) -> str:
    return f"""\
org: acme
providers:
  llm: [{{kind: echo}}]
surfaces:
  slack: {{signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}
seats:
  - handle: ada
    kind: agent
    role: engineer
    identities: {{slack: U0ADA}}
    instructions_file: prompts/ada.md
    providers: [{{kind: openai, base_url: "{ada_url}", model: ada-model}}]
  - handle: linus
    kind: agent
    role: reviewer
    identities: {{slack: U0LINUS}}
    instructions: "{LINUS_SAYS}"
    providers: [{{kind: openai, base_url: "{linus_url}", model: linus-model}}]
  - {{handle: grace, kind: human, role: lead, identities: {{slack: U0GRACE}}}}
"""


def phase_of(up: UpProcess, seat: str) -> dict[str, Any]:
    rows = wait_until(
        lambda: up.api(f"/api/events?type=agent_phase_completed&seat={seat}")["events"], 90, f"{seat}'s phase completed"
    )
    return dict(up.api(f"/api/events/{rows[0]['id']}")["event"]["wire"])


def system_message(request: dict[str, Any]) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "system")


def test_each_seat_answers_through_its_own_model_with_its_own_instructions_after_the_engines_framing(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "ada.md").write_text(ADA_MD)
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_OPERATOR_TOKEN=TOKEN)
    with model_server(reply="ada here") as ada_model, model_server(reply="linus here") as linus_model:
        path = tmp_path / "acme.yaml"
        path.write_text(company(ada_model.base_url, linus_model.base_url))
        with UpProcess(tmp_path, "--company", str(path), node="t1", env=env) as up:
            for to, channel in (("U0ADA", "D0ADA"), ("U0LINUS", "D0LINUS")):
                message = slack_message(f"Ev{uuid.uuid4().hex[:10]}", "is the deploy green?", to=to)
                message["event"]["channel"] = channel  # each seat's own direct message
                body = json.dumps(message).encode()
                status, accepted = http_json("POST", f"{up.url}/webhooks/slack", body, {"Content-Type": "application/json"})
                assert status == 202 and accepted["accepted"], accepted
            ada, linus = phase_of(up, "ada"), phase_of(up, "linus")
            page = dashboard_page(up, "/seats/ada/")
            assert up.terminate() == 0, up.output()

    framing = "You are Ada, the engineer at acme. Answer the message below."
    assert ada["system_prompt"] == f"{framing}\n\n{ADA_MD}"
    assert linus["system_prompt"] == f"You are Linus, the reviewer at acme. Answer the message below.\n\n{LINUS_SAYS}"
    assert [r["provider_key"] for r in ada["rounds"]] == ["openai:ada-model"] and ada["response"] == "ada here"
    assert [r["provider_key"] for r in linus["rounds"]] == ["openai:linus-model"] and linus["response"] == "linus here"
    # Each server was called by its own seat alone, with that seat's system prompt.
    assert [(r["model"], system_message(r)) for r in ada_model.requests] == [("ada-model", ada["system_prompt"])]
    assert [(r["model"], system_message(r)) for r in linus_model.requests] == [("linus-model", linus["system_prompt"])]
    # The seat's page shows its instructions, where they came from, and the chain it calls.
    assert 'id="instructions"' in page and "Never deploy on a Friday." in page and "From prompts/ada.md" in page
    assert "<code>openai:ada-model</code>" in page and "the seat's own providers" in page
