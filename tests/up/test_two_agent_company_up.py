"""A two-agent company, as a small team would write it, through one real ``manage.py up``.

ada and linus are each their own Slack app (their own signing secret and bot
token) and their own Mattermost bot, each with instructions of their own
(ada's from a file beside the company file, linus's inline), each calling a
model of their own (two local OpenAI-compatible servers), and each granted
the same token-reporting MCP server with a plain grant (``tools: [chat]``):
the bot tokens that server is started with must be the seat's own chat
identity, never the node's ``SLACK_BOT_TOKEN`` / ``MATTERMOST_BOT_TOKEN``.

Signed Slack DMs are POSTed to ``/webhooks/slack``; Mattermost DMs reach each
bot's own websocket, dialled by ``up`` at the local Mattermost server. Which
seat ran and what it was told are read back from ``/api/events``; which token
each seat's tool server had is read where the model received it, the tool
results of the seat's second round.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from chat_servers_support import MattermostBots
from grant_mcp_support import stdio_command
from notifications_support import ADA_MM_ID, LINUS_MM_ID, slack_headers
from seat_apps_support import ADA_APP, ADA_BOT, LINUS_APP, LINUS_BOT, body_of, dm, env_of
from seat_apps_support import SECRETS as APP_SECRETS
from seats_support import json_vendor
from surfaces_support import mm_posted
from tests.up_support import UpProcess, http_call, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OPERATOR = "two-agent-up-operator-token-0123456789"
GRACE_MM_ID = "gracegracegracegracegrace1"
ADA_MD = "You own the deploy pipeline.\nNever deploy on a Friday.\n"
LINUS_SAYS = "Review every diff twice; say LGTM only when it builds."
#: Each seat's app and bot secrets, and the node-wide bot tokens a plain grant must not fall back to.
SECRETS = {
    **env_of("ADA_SLACK_SIGNING_SECRET", "LINUS_SLACK_SIGNING_SECRET", "ADA_SLACK_BOT_TOKEN", "LINUS_SLACK_BOT_TOKEN",
             "ADA_MM_BOT_TOKEN", "LINUS_MM_BOT_TOKEN"),
    "SLACK_BOT_TOKEN": "xoxb-node-wide-bot-token-7e21",
    "MATTERMOST_BOT_TOKEN": "mm-node-wide-bot-token-52c0",
}
#: Each seat: its app, the app's bot user, its Mattermost bot user id, its own tokens as its tool server must report them.
SEATS = {
    "ada": (ADA_APP, ADA_BOT, ADA_MM_ID, {"call_slack": APP_SECRETS["ADA_SLACK_BOT_TOKEN"], "call_mm": APP_SECRETS["ADA_MM_BOT_TOKEN"]}),
    "linus": (LINUS_APP, LINUS_BOT, LINUS_MM_ID,
              {"call_slack": APP_SECRETS["LINUS_SLACK_BOT_TOKEN"], "call_mm": APP_SECRETS["LINUS_MM_BOT_TOKEN"]}),
}
#: A seat's first round: ask its chat server for both bot tokens it was started with.
ASK_TOKENS = [
    {"id": f"call_{key}", "type": "function", "function": {"name": "chat__variable", "arguments": json.dumps({"name": var})}}
    for key, var in (("slack", "SLACK_BOT_TOKEN"), ("mm", "MATTERMOST_BOT_TOKEN"))
]


class Model:
    """One seat's model server: a request without tool results asks for the tokens, one with them answers; all kept."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(body)
        told = tool_results(body)
        message = {"role": "assistant", "content": "done"} if told else {"role": "assistant", "content": None, "tool_calls": ASK_TOKENS}
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop" if told else "tool_calls"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }


def tool_results(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m.get("role") == "tool"}


@pytest.fixture
def models() -> Iterator[dict[str, tuple[Model, str]]]:
    ada, linus = Model(), Model()
    with json_vendor(ada.answer) as ada_url, json_vendor(linus.answer) as linus_url:
        yield {"ada": (ada, ada_url), "linus": (linus, linus_url)}


def company(models: dict[str, tuple[Model, str]], mattermost_url: str) -> str:
    seats = "".join(
        f"  - handle: {handle}\n    kind: agent\n    role: {role}\n"
        f"    identities: {{mattermost: {SEATS[handle][2]}}}\n"
        f"    slack: {{app_id: {SEATS[handle][0]}, signing_secret_env: {handle.upper()}_SLACK_SIGNING_SECRET, "
        f"bot_token_env: {handle.upper()}_SLACK_BOT_TOKEN}}\n"
        f"    mattermost: {{bot_token_env: {handle.upper()}_MM_BOT_TOKEN}}\n"
        f"    {instructions}\n"
        f"    providers: [{{kind: openai, base_url: \"{models[handle][1]}\", model: {handle}-model}}]\n"
        "    tools: [chat]\n"
        for handle, role, instructions in (
            ("ada", "engineer", "instructions_file: prompts/ada.md"), ("linus", "reviewer", f'instructions: "{LINUS_SAYS}"'),
        )
    )
    return (
        "org: acme\nproviders: {llm: [{kind: echo}]}\n"
        f"mcp_servers:\n  chat: {{command: {json.dumps(stdio_command())}, env_from: [SLACK_BOT_TOKEN, MATTERMOST_BOT_TOKEN]}}\n"
        f'surfaces:\n  slack: {{}}\n  mattermost: {{mode: socket, server: "{mattermost_url}"}}\n'
        "seats:\n" + seats
        + f"  - {{handle: grace, kind: human, role: lead, identities: {{slack: U0GRACE, mattermost: {GRACE_MM_ID}}}}}\n"
    )


class Company:
    """The running ``up``, the Mattermost server its bots dial, and every Slack signature the test sent."""

    def __init__(self, process: UpProcess, mattermost: MattermostBots) -> None:
        self.process, self.mattermost = process, mattermost
        self.signatures: list[str] = []

    def events(self, query: str) -> list[dict[str, Any]]:
        status, body = http_json("GET", f"{self.process.url}/api/events?{query}", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert status == 200, body
        return list(body["events"])

    def slack_dm(self, app: str, bot: str, channel: str, secret_env: str) -> tuple[int, Any]:
        body = body_of(dm(app, bot, "which tokens were you given?", event_id=f"Ev{uuid.uuid4().hex[:10]}", channel=channel))
        headers = slack_headers(body, SECRETS[secret_env])
        self.signatures.append(headers["X-Slack-Signature"])
        status, _, raw = http_call("POST", f"{self.process.url}/webhooks/slack", body, {"Content-Type": "application/json", **headers})
        return status, json.loads(raw) if raw else None

    def woken(self, query: str) -> set[str]:
        """The seats whose turns ``query``'s events ran, once one of them completed."""
        def rows() -> list[dict[str, Any]]:
            found = self.events(query)
            return found if any(row["type"] == "agent_turn_completed" for row in found) else []

        return {row["seat"] for row in wait_until(rows, 90, f"a completed turn among {query}") if row["type"] == "agent_turn_started"}

    def system_prompts(self, seat: str, turns: int) -> list[str]:
        """The ``system_prompt`` of each phase ``seat`` completed, once there are ``turns`` of them."""
        def phases() -> list[dict[str, Any]]:
            found = self.events(f"type=agent_phase_completed&seat={seat}")
            return found if len(found) >= turns else []

        rows = wait_until(phases, 90, f"{turns} phases of {seat}")
        prompts = []
        for row in rows:
            status, body = http_json("GET", f"{self.process.url}/api/events/{row['id']}", headers={"Authorization": f"Bearer {OPERATOR}"})
            assert status == 200, body
            prompts.append(str(body["event"]["wire"]["system_prompt"]))
        return prompts


def test_two_agent_seats_each_their_own_slack_app_mattermost_bot_instructions_model_and_tool_token(
    tmp_path: Path, models: dict[str, tuple[Model, str]]
) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "ada.md").write_text(ADA_MD)
    bots = {APP_SECRETS["ADA_MM_BOT_TOKEN"]: ADA_MM_ID, APP_SECRETS["LINUS_MM_BOT_TOKEN"]: LINUS_MM_ID}
    with MattermostBots(bots) as mattermost:
        (tmp_path / "acme.yaml").write_text(company(models, mattermost.url))
        env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_OPERATOR_TOKEN=OPERATOR,
                     CREWLET_SOCKET_RETRY_MIN_S="0.05", CREWLET_SOCKET_RETRY_MAX_S="0.5", **SECRETS)
        with UpProcess(tmp_path, "--company", str(tmp_path / "acme.yaml"), node="two1", env=env) as process:
            up = Company(process, mattermost)
            # A signed DM to each app wakes that app's seat, and no other.
            for seat, (app, bot, _, _) in SEATS.items():
                status, answer = up.slack_dm(app, bot, f"D0{seat.upper()}", f"{seat.upper()}_SLACK_SIGNING_SECRET")
                assert status == 202 and answer["accepted"], answer
                assert up.woken(f"trace_id={answer['trace_id']}") == {seat}
            # ada's app, signed with linus's secret: refused with the reason, and it reaches nobody.
            status, answer = up.slack_dm(ADA_APP, ADA_BOT, "D0FORGED", "LINUS_SLACK_SIGNING_SECRET")
            assert (status, answer) == (401, {"error": "X-Slack-Signature does not match the body "
                                                       "(checked with the signing secret of the Slack app A0ADA of seat ada)"})
            assert up.events("conversation_key=slack:D0FORGED") == []
            # A Mattermost DM to each seat's bot, on that bot's own socket, wakes that seat.
            wait_until(lambda: mattermost.bot_connected(ADA_MM_ID) and mattermost.bot_connected(LINUS_MM_ID), 60, "both bots' sockets open")
            for seat, (_, _, bot, _) in SEATS.items():
                frame = mm_posted(f"post{seat}", "which tokens were you given?", channel=f"dm-{seat}", user=GRACE_MM_ID, mentions=())
                frame["data"].update(channel_type="D", channel_name=f"{GRACE_MM_ID}__{bot}", channel_display_name="@grace")
                mattermost.post(bot, frame)
                assert up.woken(f"conversation_key=mattermost:dm-{seat}") == {seat}
            prompts = {seat: up.system_prompts(seat, turns=2) for seat in SEATS}
            assert process.terminate() == 0, process.output()
            output = process.output()

    framing = {"ada": "You are Ada, the engineer at acme.", "linus": "You are Linus, the reviewer at acme."}
    own = {"ada": ADA_MD, "linus": LINUS_SAYS}
    for seat, (model, _) in models.items():
        # Each phase of the seat: the engine's framing first, the seat's own instructions after it.
        assert len(prompts[seat]) == 2
        assert all(p.startswith(framing[seat]) and p.endswith(f"\n\n{own[seat]}") for p in prompts[seat]), prompts[seat]
        # Its model server saw its requests alone: two turns of two rounds, each with its instructions.
        assert [(r["user"], r["model"]) for r in model.requests] == [(seat, f"{seat}-model")] * 4
        assert {r["messages"][0]["content"] for r in model.requests} <= set(prompts[seat])
        # Each turn's tool call reported the seat's own bot tokens (a plain grant: its Slack app's and its bot's).
        assert [tool_results(r) for r in model.requests if tool_results(r)] == [SEATS[seat][3]] * 2
    assert "Traceback" not in output, output[-6000:]
    for value in [*SECRETS.values(), *up.signatures]:
        assert value not in output, "a secret, token or signature is in up's output"
