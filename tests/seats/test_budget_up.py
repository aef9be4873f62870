"""A seat over its daily token ceiling, through a real ``manage.py up``: refused, held with its mail waiting, released by a revision.

One local OpenAI-compatible server plays ada's model; each call bills 16
tokens (11 in, 5 out) and ada's ``budget.tokens_per_day`` is 10. grace's
first DM is answered and spends the day; the next turn ends with
``budget_exhausted`` and ada's mail waits under the budget hold — the
mailbox depth shows it, nothing is dead-lettered — until a config revision,
written and activated from another process the way the admin does, raises the
ceiling: every node's poller applies it, the hold lifts, and the held mail is
answered once each.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.up_support import UpProcess, http_call, http_json, up_env
from seats_support import Reply, model_server, trigger_of
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "budget-up-operator-token-0123456789abcdef"
HEAD = "org: acme\nproviders:\n  llm:\n    - {{kind: openai, base_url: \"{url}\", model: local-7b}}\n"
TAIL = (
    "surfaces:\n  slack: {{signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}\n"
    "seats:\n"
    "  - {{handle: ada, kind: agent, role: engineer, identities: {{slack: U0ADA}}, budget: {{tokens_per_day: {ceiling}}}}}\n"
    "  - {{handle: grace, kind: human, role: lead, identities: {{slack: U0GRACE}}}}\n"
)


def company(url: str, ceiling: int) -> str:
    return HEAD.format(url=url) + TAIL.format(ceiling=ceiling)


def direct_message(text: str) -> bytes:
    return json.dumps({
        "type": "event_callback",
        "event_id": f"Ev{uuid.uuid4().hex[:10]}",
        "event": {"type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE", "text": f"<@U0ADA> {text}",
                  "ts": f"1718000000.{uuid.uuid4().int % 10**6:06d}"},
        "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
    }).encode()


def answered(up: UpProcess) -> list[dict[str, Any]]:
    return [t for t in up.events("agent_turn_completed", "ada") if not t["failed"]]


def depth(up: UpProcess) -> float:
    status, _, body = http_call("GET", up.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    found = [line.split()[-1] for line in body.decode().splitlines() if line.startswith('crewlet_mailbox_depth{seat="ada"}')]
    return float(found[0]) if found else -1.0


def asked(server: Any, word: str) -> int:
    """How many of ada's model calls were asked the DM starting ``word`` (its own turn's, or a digest's; not an episode of it)."""
    return sum(word in trigger_of(r) for r in server.of_seat("ada"))


def snapshot(up: UpProcess) -> dict[str, Any]:
    """The projection's snapshot, as the first frame of ``/ws/stream`` shows it."""
    from websockets.sync.client import connect

    url = up.url.replace("http://", "ws://") + "/ws/stream"
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, open_timeout=30) as ws:
        return dict(json.loads(ws.recv(timeout=30)))


def say(up: UpProcess, text: str) -> None:
    status, _ = http_json("POST", up.url + "/webhooks/slack", direct_message(text), {"Content-Type": "application/json"}, empty={})
    assert status == 202


def test_a_seat_over_its_daily_ceiling_is_refused_its_mail_waits_and_a_revision_raising_it_runs_the_mail_once_each(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with model_server() as server:
        server.scripts = {"ada": [Reply(text="ada: on it")]}
        (tmp_path / "acme.yaml").write_text(company(server.base_url, 10))
        env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused", CREWLET_NODE_BUDGET_METERS_EVERY_S="0.5")
        with UpProcess(tmp_path, "--data-dir", str(data), "--company", str(tmp_path / "acme.yaml"), node="b1", env=env) as up:
            say(up, "first: when is the deploy?")
            wait_until(lambda: answered(up), 120, "the first DM answered, spending 16 of 10")
            say(up, "second: and the release notes?")
            wait_until(lambda: up.events("budget_exhausted", "ada"), 120, "the next turn refused")
            say(up, "third: and the changelog?")
            wait_until(lambda: depth(up) == 2, 60, "the refused trigger and the third DM waiting in ada's mailbox")
            held = wait_until(lambda: snapshot(up)["budgets"]["held"], 60, "the held seat on the live snapshot")
            live = snapshot(up)
            [refused] = up.events("budget_exhausted", "ada")
            calls_while_held = len(server.of_seat("ada"))
            dead_while_held = up.api("/api/dead-letters")["dead_letters"]

            raised = company(server.base_url, 100000)
            up.manage(
                "shell", "-c",
                "from crewlet.company import revisions; from crewlet.engine import activation; "
                f"r = revisions.create_revision({raised!r}, author='ops', note='raise ada'); "
                "assert activation.activate(r.pk, 'ops')",
                extra_env={"CREWLET_VAR_DIR": str(data)},
            )
            wait_until(lambda: asked(server, "third:") and depth(up) == 0, 120, "the held mail answered, ada's mailbox drained")
            after = wait_until(lambda: (lambda s: s if not s["budgets"]["held"] else None)(snapshot(up)), 30, "no seat held")
            turns = up.events("agent_turn_started", "ada")
            answered_turns, events_of_refused = answered(up), up.events("budget_exhausted", "ada")
            dead = up.api("/api/dead-letters")["dead_letters"]
            assert up.terminate() == 0, up.output()

    assert (refused["scope"], refused["period"], refused["spend"], refused["ceiling"]) == ("seat", "day", 16, 10)
    assert refused["window"] and refused["resets_at"].endswith("T00:00:00.000000Z")  # the company's zone is UTC
    ada = next(s for s in live["seats"] if s["handle"] == "ada")
    assert (ada["state"], ada["reason"]) == ("stopped", "budget") and "day budget" in ada["last_error"]
    assert [h["seat"] for h in held] == ["ada"] and held[0]["windows"][0]["raise"] == "seats[ada].budget.tokens_per_day"
    assert calls_while_held == 1 and dead_while_held == [] and dead == []  # held: no model call, nothing dead-lettered
    # Once each: the held two in one digest (one conversation, one drain) or in two turns, never twice.
    assert [asked(server, word) for word in ("first:", "second:", "third:")] == [1, 1, 1]
    assert len(answered_turns) == len(turns) - 1 and len(events_of_refused) == 1  # every turn answered but the refused one
    assert next(s for s in after["seats"] if s["handle"] == "ada")["state"] == "idle"
    assert [w["ceiling"] for w in after["budgets"]["windows"]] == [100000]
