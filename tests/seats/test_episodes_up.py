"""Conversation sessions through a real ``manage.py up`` (SQLite, the embedded broker): what a seat did on a conversation
reaches that conversation's next turn, and a thread's turns are its history.

A local OpenAI-compatible server plays ada's model (``seats_support.model_server``)
and records every request, so what is asserted is what the model was sent.
grace writes to ada in their DM, then replies in a thread of that DM: two
partitions, one conversation (``slack:D0ADA``), so the reply's turn opens with
the episode of the first. Two mentions in a channel thread are another
conversation, whose history ``/api/turns?conversation=`` lists apart from the DM's.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from seats import episodes
from seats_support import Reply, model_server, user_text
from tests.up_support import ADA_ASKS_LINUS_ON_SLACK, UpProcess, dashboard_page, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN = "episodes-up-operator-token-0123456789abcdef"
DM = "D0ADA"
ROOT = "1718000000.000100"
THREAD = "slack:C0DEV:1718000100.000100"


def message(text: str, channel: str, ts: str, *, thread_ts: str = "") -> bytes:
    """grace to ada on Slack: in their DM (``im``), or mentioning her in a channel thread."""
    event: dict[str, Any] = {
        "type": "message", "channel": channel, "channel_type": "im" if channel.startswith("D") else "channel",
        "user": "U0GRACE", "text": f"<@U0ADA> {text}", "ts": ts,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return json.dumps({
        "type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex[:10]}", "event": event,
        "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
    }).encode()


def api(up: UpProcess, path: str) -> Any:
    status, body = http_json("GET", up.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, empty={})
    assert status == 200, (path, body)
    return body


def say(up: UpProcess, body: bytes) -> None:
    status, answer = http_json("POST", up.url + "/webhooks/slack", body, {"Content-Type": "application/json"}, empty={})
    assert status == 202, answer


def answered(up: UpProcess, count: int) -> list[dict[str, Any]]:
    """ada's completed turns, oldest first, once there are ``count``; empty before."""
    rows = api(up, "/api/turns?seat=ada")["turns"]
    done = [t for t in rows if t["outcome"] == "ok"]
    return done[::-1] if len(done) >= count else []


def test_a_dms_next_turn_is_given_the_episode_of_the_first_and_a_threads_turns_are_its_history(tmp_path: Path) -> None:
    with model_server() as model:
        model.scripts = {"ada": [Reply(text="ada: noted")]}
        company = f'org: acme\nproviders:\n  llm:\n    - {{kind: openai, base_url: "{model.base_url}", model: m}}\n'
        (tmp_path / "acme.yaml").write_text(company + ADA_ASKS_LINUS_ON_SLACK)
        env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused", CREWLET_VAR_DIR=str(tmp_path / "data"))
        with UpProcess(tmp_path, "--company", str(tmp_path / "acme.yaml"), node="e1", env=env) as up:
            say(up, message("first: when is the deploy?", DM, ROOT))
            wait_until(lambda: answered(up, 1), 120, "the DM's first turn")
            say(up, message("second: and the release notes?", DM, "1718000000.000200", thread_ts=ROOT))
            dm_turns = wait_until(lambda: answered(up, 2), 120, "the DM thread reply's turn")
            say(up, message("third: is the channel thread tracked?", "C0DEV", "1718000100.000100"))
            wait_until(lambda: answered(up, 3), 120, "the channel thread's first turn")
            say(up, message("fourth: and now?", "C0DEV", "1718000100.000200", thread_ts="1718000100.000100"))
            wait_until(lambda: answered(up, 4), 120, "the channel thread's second turn")

            dm_history = api(up, f"/api/turns?conversation=slack:{DM}")
            thread_history = api(up, f"/api/turns?conversation={THREAD}")
            written = api(up, "/api/events?type=episode_written&seat=ada")["events"]
            page = dashboard_page(up, "/seats/ada/")
            assert up.terminate() == 0, up.output()

    first, second, third, fourth = (user_text(r) for r in model.of_seat("ada"))
    # The DM's first turn had no past; the thread reply in the same DM was given the first turn's episode.
    assert episodes.BLOCK_OPEN.split("(")[0] not in first
    block = episodes.BLOCK_OPEN.format(conversation=f"slack:{DM}")
    assert second.startswith(block) and second.index(episodes.BLOCK_CLOSE) < second.index("second: and the release notes?")
    given = second.split(episodes.BLOCK_CLOSE)[0]
    assert f"turn {dm_turns[0]['turn_id']}, completed" in given
    assert "first: when is the deploy?" in given.split("answered:")[0].split("asked:")[1]
    assert "answered: ada: noted" in given
    # The channel thread is another conversation: its first turn was given nothing of the DM's, its second its own.
    assert block not in third and "first: when is the deploy?" not in third
    assert fourth.startswith(episodes.BLOCK_OPEN.format(conversation=THREAD)) and "third: is the channel thread tracked?" in fourth

    # History by thread: each conversation's turns, the DM's from both of its partitions, answered by every node.
    assert [t["turn_id"] for t in dm_history["turns"]] == [t["turn_id"] for t in dm_turns[::-1]]
    assert {t["conversation_key"] for t in dm_history["turns"]} == {f"slack:{DM}"} and dm_history["coverage"]["complete"]
    assert len(thread_history["turns"]) == 2 and {t["conversation_key"] for t in thread_history["turns"]} == {THREAD}
    assert sorted(row["conversation_key"] for row in written) == sorted([f"slack:{DM}"] * 2 + [THREAD] * 2)
    # The seat's page lists its episodes, each linked to its conversation's history.
    assert page.count("data-episode=") == 4 and f"?conversation=slack%3A{DM}" in page
