"""Slack's chat tools for a seat: an MCP server over stdio on ``slack_sdk``'s ``WebClient``.

Granted with ``mcp_servers: {slack: {builtin: slack}}``, the engine runs it as
``python -m seats.tools.servers.slack`` with the seat's bot token in
``SLACK_BOT_TOKEN`` and the Web API base in ``SLACK_API_URL`` (default
``https://slack.com/api/``; an Enterprise Grid proxy or a test's local
server elsewhere). Its tools, each one Web API method:

* ``reply_in_thread`` — ``chat.postMessage`` with ``thread_ts``: the answer in
  the thread the seat was woken from (the channel and the thread root are
  the trigger's, ``slack:<channel>:<thread_ts>``);
* ``post_message`` — ``chat.postMessage`` at the top of a channel;
* ``add_reaction`` — ``reactions.add`` (one already there counts as added);
* ``read_thread`` — ``conversations.replies``: the thread's messages, oldest
  first, a page at a time.

The bot needs the scopes ``chat:write``, ``reactions:write`` and the
``*:history`` scope of each kind of conversation it reads
(``channels:history``, ``groups:history``, ``im:history``,
``mpim:history``). A refusal from Slack (``not_in_channel``,
``missing_scope``...) is a tool error the model reads, naming Slack's code.
"""
from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Optional

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web import WebClient

from crewlet.company.builtin_servers import SLACK
from crewlet.company.org import SLACK_DEFAULT_API_URL
from seats.tools.servers.common import ADDS, ADDS_ONCE, READS, VendorCalls, from_env, message_text, need_text, page_limit, server, tool


#: How long one Web API call may take, in seconds (the engine's own ``tools.call_timeout_s`` bounds the tool call).
CALL_TIMEOUT_S = 30.0
#: A Slack message timestamp: seconds, a dot, microseconds (``1718000000.000100``).
_TS = re.compile(r"\d{1,12}\.\d{1,9}")
#: The most messages one ``read_thread`` page returns (Slack's own cap for ``conversations.replies`` is 1000).
MAX_PAGE = 200


def api_url() -> str:
    """The Web API base from ``SLACK_API_URL``, ending in ``/`` as ``WebClient`` appends method names to it."""
    url = os.environ.get(SLACK.url_env, "").strip() or SLACK_DEFAULT_API_URL
    return url if url.endswith("/") else f"{url}/"


def web_client(token: str, base_url: str, *, timeout_s: float = CALL_TIMEOUT_S, retries: bool = True) -> WebClient:
    """A ``WebClient`` for ``token`` at ``base_url``; ``retries=False`` drops the SDK's retry on a failed connection."""
    client = WebClient(
        token=token, base_url=base_url, timeout=max(1, math.ceil(timeout_s)),
        logger=logging.getLogger("crewlet.seats.tools.servers.slack.sdk"),
    )
    if not retries:
        client.retry_handlers = []
    return client


def refusal(method: str, exc: Exception, url: str = "") -> str:
    """What a failed Web API call says: Slack's error code (and the scope it wanted), or why Slack (at ``url``) was not reached."""
    if isinstance(exc, SlackApiError):
        code = str(exc.response.get("error") or f"HTTP {exc.response.status_code}")
        needed = exc.response.get("needed")
        return f"Slack refused {method}: {code}" + (f" (the bot needs the scope {needed})" if needed else "")
    return f"could not reach Slack's {method} at {url or api_url()}: {type(exc).__name__}: {exc}"


def ts_arg(value: str, field: str) -> str:
    """A message timestamp argument, checked for Slack's shape so a wrong value is refused before it is sent."""
    text = need_text(value, field, 40)
    if not _TS.fullmatch(text):
        raise ToolError(f"{field} must be a Slack message timestamp like 1718000000.000100 (got {text!r})")
    return text


class SlackTools(VendorCalls[WebClient]):
    """The tools' calls, each one Web API method through one ``WebClient`` made on first use."""

    name = "slack"
    instructions = (
        "Read and answer Slack conversations as this seat's own bot. The message that woke you names its "
        "channel and thread (slack:<channel>:<thread_ts>): answer there with reply_in_thread."
    )
    errors = (SlackApiError, SlackClientError, OSError)

    def connect(self) -> WebClient:
        return web_client(from_env(SLACK.token_env, "the seat's Slack bot token"), api_url())

    def refusal(self, what: str, exc: Exception) -> str:
        return refusal(what, exc)

    @tool(ADDS)
    def reply_in_thread(self, channel: str, thread_ts: str, text: str) -> dict[str, Any]:
        """Post ``text`` as a reply in the thread rooted at ``thread_ts`` of ``channel`` (Slack's ids, e.g. C0123, 1718000000.000100)."""
        channel, thread_ts, text = need_text(channel, "channel"), ts_arg(thread_ts, "thread_ts"), message_text(text)
        answer = self.call(
            "chat.postMessage", lambda c: c.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)
        )
        return {"channel": answer.get("channel", channel), "ts": answer.get("ts"), "thread_ts": thread_ts}

    @tool(ADDS)
    def post_message(self, channel: str, text: str) -> dict[str, Any]:
        """Post ``text`` as a new message at the top of ``channel`` (not in a thread)."""
        channel, text = need_text(channel, "channel"), message_text(text)
        answer = self.call("chat.postMessage", lambda c: c.chat_postMessage(channel=channel, text=text))
        return {"channel": answer.get("channel", channel), "ts": answer.get("ts")}

    @tool(ADDS_ONCE)
    def add_reaction(self, channel: str, timestamp: str, name: str) -> str:
        """React to the message ``timestamp`` of ``channel`` with the emoji ``name`` (e.g. white_check_mark)."""
        channel, timestamp = need_text(channel, "channel"), ts_arg(timestamp, "timestamp")
        emoji = need_text(name, "name", 100).strip(":")
        try:
            self.call("reactions.add", lambda c: c.reactions_add(channel=channel, timestamp=timestamp, name=emoji))
        except ToolError as exc:
            if "already_reacted" not in str(exc):
                raise
        return f"reacted :{emoji}: to {timestamp} in {channel}"

    @tool(READS)
    def read_thread(self, channel: str, thread_ts: str, limit: int = 50, cursor: str = "") -> dict[str, Any]:
        """The messages of the thread rooted at ``thread_ts`` in ``channel``, oldest first; pass ``next_cursor`` back as ``cursor`` for more."""
        channel, thread_ts = need_text(channel, "channel"), ts_arg(thread_ts, "thread_ts")
        options: dict[str, Any] = {"channel": channel, "ts": thread_ts, "limit": page_limit(limit, MAX_PAGE)}
        if cursor.strip():
            options["cursor"] = cursor.strip()
        answer = self.call("conversations.replies", lambda c: c.conversations_replies(**options))
        messages = [
            {k: m[k] for k in ("ts", "user", "bot_id", "text", "thread_ts") if m.get(k) not in (None, "")}
            for m in answer.get("messages") or []
            if isinstance(m, dict)
        ]
        meta = answer.get("response_metadata") or {}
        return {
            "channel": channel,
            "thread_ts": thread_ts,
            "messages": messages,
            "has_more": bool(answer.get("has_more")),
            "next_cursor": meta.get("next_cursor", "") if isinstance(meta, dict) else "",
        }


def build(tools: Optional[SlackTools] = None) -> MCPServer:
    """The Slack server with its four tools."""
    return server(tools or SlackTools())


if __name__ == "__main__":
    build().run("stdio")
