"""Per-grant credentials through a real ``manage.py up``: two seats granted one stdio and one HTTP MCP server, each with its own token.

The model is a local OpenAI-compatible server: a seat's first round calls
``chat__variable`` (a stdio child saying which ``SLACK_BOT_TOKEN`` it was
started with) and ``tracker__header`` (a streamable-HTTP server saying which
``Authorization`` it was sent), its second round answers. What each seat's
tools answered is read where the model received it, the tool results of the
seat's second round; the tokens themselves must appear nowhere in ``up``'s
output.
"""
from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from grant_mcp_support import http_server, stdio_command
from seats_support import json_vendor
from tests.process_support import descendants
from up_support import UpProcess, http_json, turn_completed, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

OPERATOR = "grants-up-operator-token-0123456789"
API_KEY_ENV = "GRANTS_OPENAI_KEY"
#: Each seat's own values, and the one a plain grant would read: none of them may reach the log.
SECRETS = {
    "ADA_SLACK_BOT_TOKEN": "ada-bot-token-4c1e93",
    "GRACE_SLACK_BOT_TOKEN": "grace-bot-token-b77a20",
    "SLACK_BOT_TOKEN": "shared-bot-token-0d5f11",
    "ADA_TRACKER_AUTH": "Basic YWRhOmFkYS10cmFja2VyLXBhc3M=",
    "GRACE_TRACKER_AUTH": "Basic Z3JhY2U6Z3JhY2UtdHJhY2tlcg==",
    API_KEY_ENV: "sk-grants-test-key",
}
ROUND_ONE = [
    {"id": "call_env", "type": "function",
     "function": {"name": "chat__variable", "arguments": json.dumps({"name": "SLACK_BOT_TOKEN"})}},
    {"id": "call_header", "type": "function",
     "function": {"name": "tracker__header", "arguments": json.dumps({"name": "authorization"})}},
]


class Vendor:
    """The model: round one calls both tools, round two answers; the tool results it was sent are kept per seat."""

    def __init__(self) -> None:
        self.results: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        results = {m["tool_call_id"]: m["content"] for m in body["messages"] if m.get("role") == "tool"}
        if results:
            with self._lock:
                self.results[body["user"]] = results
            message: dict[str, Any] = {"role": "assistant", "content": "done"}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": ROUND_ONE}
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "created": 0, "model": "gpt-test",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if results == {} else "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }


@pytest.fixture
def vendor() -> Iterator[tuple[Vendor, str]]:
    model = Vendor()
    with json_vendor(model.answer) as base_url:
        yield model, base_url


def company(base_url: str, tracker_url: str, identities: bool = False) -> str:
    """Two seats granted ``chat`` and ``tracker``: the token mapped in each grant, or (``identities``) each seat's own Slack app."""
    if identities:
        seats = (
            "  - handle: ada\n"
            "    slack: {app_id: A0ADA, signing_secret_env: ADA_SLACK_SIGNING_SECRET, bot_token_env: ADA_SLACK_BOT_TOKEN}\n"
            "    tools: [chat, {server: tracker, headers: {Authorization: ADA_TRACKER_AUTH}}]\n"
            "  - handle: grace\n"
            "    slack: {app_id: A0GRACE, signing_secret_env: GRACE_SLACK_SIGNING_SECRET, bot_token_env: GRACE_SLACK_BOT_TOKEN}\n"
            "    tools: [chat, {server: tracker, headers: {authorization: GRACE_TRACKER_AUTH}}]\n"
        )
    else:
        seats = (
            "  - handle: ada\n"
            "    identities: {slack: U0ADA}\n"
            "    tools: [{server: chat, env: {SLACK_BOT_TOKEN: ADA_SLACK_BOT_TOKEN}},\n"
            "            {server: tracker, headers: {Authorization: ADA_TRACKER_AUTH}}]\n"
            "  - handle: grace\n"
            "    identities: {slack: U0GRACE}\n"
            "    tools: [{server: chat, env: {SLACK_BOT_TOKEN: GRACE_SLACK_BOT_TOKEN}},\n"
            "            {server: tracker, headers: {authorization: GRACE_TRACKER_AUTH}}]\n"
        )
    return (
        "org: acme\n"
        f"providers: {{llm: [{{kind: openai, base_url: \"{base_url}\", model: gpt-test, api_key_env: {API_KEY_ENV}}}]}}\n"
        "mcp_servers:\n"
        f"  chat: {{command: {json.dumps(stdio_command())}, env_from: [SLACK_BOT_TOKEN, SLACK_TEAM_ID]}}\n"
        f"  tracker: {{url: \"{tracker_url}\", headers_from: {{Authorization: TRACKER_AUTH}}}}\n"
        "surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}\n"
        "seats:\n" + seats
    )


def direct_message(up: UpProcess, bot: str) -> str:
    """A Slack DM to ``bot`` (through the app ``A<bot's id>``); the trace id it was accepted under."""
    dm = {
        "type": "event_callback",
        "api_app_id": f"A{bot[1:]}",
        "event_id": f"Ev{uuid.uuid4().hex[:10]}",
        "event": {"type": "message", "channel": f"D{bot}", "channel_type": "im", "user": "U0LEAD",
                  "text": "which token do you have?", "ts": "1718000000.000300"},
        "authorizations": [{"user_id": bot, "is_bot": True}],
    }
    status, accepted = http_json(
        "POST", f"{up.url}/webhooks/slack", json.dumps(dm).encode(), {"Content-Type": "application/json"}
    )
    assert status == 202 and accepted["accepted"], accepted
    return str(accepted["trace_id"])


def unset_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if "event=tool_server_variable_unset" in line]


@pytest.mark.parametrize("identities", [False, True], ids=["mapped in each grant", "from each seat's own slack app"])
def test_two_seats_granted_the_same_servers_each_call_them_with_their_own_token_and_no_token_reaches_the_log(
    tmp_path: Path, vendor: tuple[Vendor, str], identities: bool
) -> None:
    model, base_url = vendor
    with http_server() as tracker_url:
        (tmp_path / "company.yaml").write_text(company(base_url, tracker_url, identities))
        env = up_env(CREWLET_OPERATOR_TOKEN=OPERATOR, ADA_SLACK_SIGNING_SECRET="ada-signing", GRACE_SLACK_SIGNING_SECRET="grace-signing", **SECRETS)
        env.pop("SLACK_TEAM_ID", None)
        argv = ("--data-dir", str(tmp_path / "data"), "--company", str(tmp_path / "company.yaml"))
        with UpProcess(tmp_path, *argv, node="g1", env=env) as up:
            # Named at start, once per seat, before any turn: the one variable both grants read and the node lacks.
            at_start = wait_until(lambda: len(unset_warnings(up.output_so_far())) == 2 and unset_warnings(up.output_so_far()),
                                  60, "the unset variable named at start")
            traces = {seat: direct_message(up, bot) for seat, bot in (("ada", "U0ADA"), ("grace", "U0GRACE"))}
            for trace in traces.values():
                assert "agent_turn_completed" in turn_completed(up.url + "/", trace, OPERATOR)
            children = [pid for pid in descendants(up.proc.pid) if "grant_mcp_support.py" in command_line(pid)]  # type: ignore[union-attr]
            output = up.stop()
    assert model.results["ada"] == {"call_env": SECRETS["ADA_SLACK_BOT_TOKEN"], "call_header": SECRETS["ADA_TRACKER_AUTH"]}
    assert model.results["grace"] == {
        "call_env": SECRETS["GRACE_SLACK_BOT_TOKEN"], "call_header": SECRETS["GRACE_TRACKER_AUTH"],
    }
    assert len(children) == 2, "one stdio child per seat's grant"
    assert sorted(("seat=ada" in line, "seat=grace" in line) for line in at_start) == [(False, True), (True, False)]
    assert all("SLACK_TEAM_ID" in line and "server=chat" in line for line in at_start)
    assert unset_warnings(output) == at_start, "named again after start"
    for name, value in SECRETS.items():
        assert value not in output, f"{name}'s value is in up's output"
    assert "Traceback" not in output, output[-4000:]


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
