"""The shipped chat servers (``builtin: slack`` / ``builtin: mattermost``) as a seat's toolbox runs them, against local vendor APIs.

Each server is the real child process the engine starts (``python -m
seats.tools.servers.<kind>`` with the environment the builtin form gives
it), reached through :class:`~seats.tools.mcp.McpToolbox`; each vendor is a
loopback server speaking its HTTP API (``tests/chat_vendor_support.py``),
and every assertion is on the exact request it received.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

import pytest
import pytest_asyncio
from mcp import Client

from chat_vendor_support import CallLog, MattermostApi, SlackWebApi, mattermost_api, slack_web_api
from crewlet.company.conf import ToolSettings
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import parse_company
from seats_support import environment
from seats.tools import ToolCall
from seats.tools.mcp import McpToolbox
from seats.tools.mcp_transport import open_transport

pytestmark = pytest.mark.integration  # the chat servers are real MCP server processes

ADA_SLACK_TOKEN = "xoxb-ada-0000-granted"
ADA_MM_TOKEN = "ada-mattermost-bot-token"
ADA_MM_USER = "adabotuser00000000000000aa"
SETTINGS = ToolSettings(call_timeout_s=30.0, start_timeout_s=60.0, restart_backoff_s=0.05)
#: What each tool is, as MCP's hints say it: (read only, destructive, idempotent).
HINTS = {
    "reply_in_thread": (False, False, False),
    "post_message": (False, False, False),
    "add_reaction": (False, False, True),
    "read_thread": (True, False, True),
}


def company(slack_url: str, mattermost_url: str) -> Organization:
    return parse_company(
        {
            "org": "acme",
            "surfaces": {"slack": {"api_url": slack_url}, "mattermost": {"server": mattermost_url}},
            "mcp_servers": {"slack": {"builtin": "slack"}, "mm": {"builtin": "mattermost"}},
            "seats": [{"handle": "ada", "kind": "agent", "tools": ["slack", "mm"]}],
        }
    )



class Vendors:
    def __init__(self, log: CallLog, slack: SlackWebApi, mattermost: MattermostApi, org: Organization, box: McpToolbox) -> None:
        self.log, self.slack, self.mattermost, self.org, self.box = log, slack, mattermost, org, box

    async def call(self, tool: str, /, **arguments: Any) -> Any:
        return await self.box.call("ada", ToolCall(id=f"call-{tool}", name=tool, arguments=arguments))


@contextlib.asynccontextmanager
async def vendors(prefix: str = "", **env: str) -> AsyncIterator[Vendors]:
    log = CallLog()
    with slack_web_api(log, {ADA_SLACK_TOKEN}) as slack, mattermost_api(log, {ADA_MM_TOKEN: ADA_MM_USER}, prefix) as mm:
        org = company(slack.url, mm.url)
        tokens = {"SLACK_BOT_TOKEN": ADA_SLACK_TOKEN, "MATTERMOST_BOT_TOKEN": ADA_MM_TOKEN, **env}
        with environment(**tokens):
            box = McpToolbox(CompanyHolder(org), settings=SETTINGS)
            try:
                await box.specs("ada")
                yield Vendors(log, slack, mm, org, box)
            finally:
                await box.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def chat() -> AsyncIterator[Vendors]:
    """Ada's two chat servers, started once for the tests that only add to what the vendors hold."""
    async with vendors() as running:
        yield running


async def listed(org: Organization, name: str) -> dict[str, Any]:
    ada = org.seat_by_handle("ada")
    assert ada is not None
    (granted,) = [g for g in org.granted_servers(ada) if g.name == name]
    with environment(SLACK_BOT_TOKEN="unused", MATTERMOST_BOT_TOKEN="unused"):
        async with Client(open_transport(granted, asyncio.Event(), seat="ada")) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", ["slack", "mm"])
async def test_each_chat_server_lists_its_four_tools_annotated_as_the_read_or_the_write_each_is(chat: Vendors, name: str) -> None:
    tools = await listed(chat.org, name)
    assert set(tools) == set(HINTS)
    for tool_name, (read_only, destructive, idempotent) in HINTS.items():
        hints = tools[tool_name].annotations
        assert (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint) == (
            read_only, destructive, idempotent, True
        ), tool_name


@pytest.mark.asyncio(loop_scope="module")
async def test_a_slack_reply_is_chat_post_message_in_that_thread_with_the_granted_token(chat: Vendors) -> None:
    result = await chat.call("slack__reply_in_thread", channel="C0DEV", thread_ts="1718000000.000100", text="on it")
    assert result.ok, result.error
    (posted,) = chat.log.of("slack", "chat.postMessage")
    assert (posted.verb, posted.token) == ("POST", ADA_SLACK_TOKEN)
    assert posted.args == {"channel": "C0DEV", "thread_ts": "1718000000.000100", "text": "on it"}
    answer = json.loads(result.content)
    assert answer["channel"] == "C0DEV" and answer["thread_ts"] == "1718000000.000100" and answer["ts"]

    thread = await chat.call("slack__read_thread", channel="C0DEV", thread_ts="1718000000.000100")
    assert thread.ok, thread.error
    (reply,) = json.loads(thread.content)["messages"]
    assert (reply["text"], reply["ts"], reply["bot_id"]) == ("on it", answer["ts"], "B0ADABOT")
    (read,) = chat.log.of("slack", "conversations.replies")
    assert (read.token, read.args["channel"], read.args["ts"]) == (ADA_SLACK_TOKEN, "C0DEV", "1718000000.000100")


@pytest.mark.asyncio(loop_scope="module")
async def test_a_slack_reaction_is_reactions_add_and_one_already_there_counts_as_added(chat: Vendors) -> None:
    first = await chat.call("slack__add_reaction", channel="C0DEV", timestamp="1718000000.000200", name=":white_check_mark:")
    chat.slack.fail["reactions.add"] = "already_reacted"
    try:
        again = await chat.call("slack__add_reaction", channel="C0DEV", timestamp="1718000000.000200", name="white_check_mark")
    finally:
        del chat.slack.fail["reactions.add"]
    assert first.ok and again.ok, (first.error, again.error)
    added = [c for c in chat.log.of("slack", "reactions.add") if c.args.get("timestamp") == "1718000000.000200"]
    assert [(c.token, c.args["channel"], c.args["name"]) for c in added] == [(ADA_SLACK_TOKEN, "C0DEV", "white_check_mark")] * 2


@pytest.mark.asyncio(loop_scope="module")
async def test_slacks_refusal_reaches_the_model_with_slacks_error_code(chat: Vendors) -> None:
    chat.slack.fail["chat.postMessage"] = "not_in_channel"
    try:
        result = await chat.call("slack__post_message", channel="C0SECRET", text="hello")
    finally:
        del chat.slack.fail["chat.postMessage"]
    assert not result.ok
    assert result.error == "Error executing tool post_message: Slack refused chat.postMessage: not_in_channel"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_thread_ts_that_is_no_slack_timestamp_is_refused_before_anything_is_sent(chat: Vendors) -> None:
    before = len(chat.log.calls)
    result = await chat.call("slack__reply_in_thread", channel="C0DEV", thread_ts="the last one", text="hi")
    assert not result.ok and "thread_ts must be a Slack message timestamp" in (result.error or "")
    assert len(chat.log.calls) == before


@pytest.mark.asyncio(loop_scope="module")
async def test_a_mattermost_reply_is_a_post_with_the_root_id_and_the_granted_token(chat: Vendors) -> None:
    root = chat.mattermost.add_post("chan0dev", "graceuser", "@ada can you look?")
    result = await chat.call("mm__reply_in_thread", channel_id="chan0dev", root_id=root["id"], message="looking now")
    assert result.ok, result.error
    (posted,) = chat.log.of("mattermost", "/posts")
    assert (posted.verb, posted.token) == ("POST", ADA_MM_TOKEN)
    assert posted.args == {"channel_id": "chan0dev", "root_id": root["id"], "message": "looking now"}

    thread = await chat.call("mm__read_thread", post_id=root["id"])
    assert thread.ok, thread.error
    posts = json.loads(thread.content)["posts"]
    assert [(p["user_id"], p["message"]) for p in posts] == [("graceuser", "@ada can you look?"), (ADA_MM_USER, "looking now")]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_mattermost_reaction_is_saved_as_the_bot_itself(chat: Vendors) -> None:
    post = chat.mattermost.add_post("chan0dev", "graceuser", "deployed")
    result = await chat.call("mm__add_reaction", post_id=post["id"], emoji_name=":tada:")
    assert result.ok, result.error
    (me,) = chat.log.of("mattermost", "/users/me")
    (saved,) = chat.log.of("mattermost", "/reactions")
    assert me.token == saved.token == ADA_MM_TOKEN
    assert saved.args == {"user_id": ADA_MM_USER, "post_id": post["id"], "emoji_name": "tada"}


@pytest.mark.asyncio(loop_scope="module")
async def test_mattermosts_refusal_reaches_the_model_with_its_status_and_message(chat: Vendors) -> None:
    chat.mattermost.fail["/posts"] = 403
    try:
        result = await chat.call("mm__post_message", channel_id="chan0town", message="hello")
    finally:
        del chat.mattermost.fail["/posts"]
    assert not result.ok
    assert result.error == (
        "Error executing tool post_message: Mattermost refused POST /api/v4/posts: HTTP 403: "
        "You do not have the appropriate permissions."
    )


@pytest.mark.asyncio
async def test_a_server_under_a_path_is_reached_there_and_a_missing_token_is_named_to_the_model() -> None:
    async with vendors(prefix="/chat", SLACK_BOT_TOKEN="") as running:
        assert running.mattermost.url.endswith("/chat")
        posted = await running.call("mm__post_message", channel_id="chan0dev", message="hi")
        unset = await running.call("slack__post_message", channel="C0DEV", text="hi")
    assert posted.ok, posted.error
    (call,) = running.log.of("mattermost", "/posts")
    assert call.token == ADA_MM_TOKEN
    assert not unset.ok and "SLACK_BOT_TOKEN is not set" in (unset.error or "")
    assert running.log.of("slack", "chat.postMessage") == []
