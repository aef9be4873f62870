"""Mattermost's chat tools for a seat: an MCP server over stdio on ``mattermostautodriver``'s driver.

Granted with ``mcp_servers: {mattermost: {builtin: mattermost}}``, the engine
runs it as ``python -m seats.tools.servers.mattermost`` with the seat's bot
token in ``MATTERMOST_BOT_TOKEN`` and the server's URL in ``MATTERMOST_URL``
(the company's ``surfaces.mattermost.server``; a server under a path,
``https://example.com/chat``, works too). The driver is the maintained one
generated from Mattermost's own OpenAPI description of REST API v4. Its
tools, each one endpoint:

* ``reply_in_thread`` — ``POST /api/v4/posts`` with ``root_id``: the answer
  in the thread the seat was woken from (``mattermost:<channel>:<root>``);
* ``post_message`` — ``POST /api/v4/posts`` at the top of a channel;
* ``add_reaction`` — ``POST /api/v4/reactions`` as the bot itself
  (``GET /api/v4/users/me`` names it, once);
* ``read_thread`` — ``GET /api/v4/posts/{post_id}/thread``: the thread's
  posts, oldest first.

The bot account needs to be a member of the channels it answers in, with
the permission to create posts and reactions there (a bot account's
default). A refusal from the server is a tool error the model reads,
naming the server's own message.
"""
from __future__ import annotations

import logging
from typing import Any, Optional
from urllib.parse import urlsplit

import httpx
from mattermostautodriver import TypedDriver
from mattermostautodriver.client import Client
from mattermostautodriver.exceptions import InvalidMattermostError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from crewlet.company.builtin_servers import MATTERMOST
from seats.tools.servers.common import ADDS, ADDS_ONCE, READS, VendorCalls, from_env, message_text, need_text, server, tool

# The driver sets its loggers to INFO as it is imported and logs every refusal at ERROR itself, once per call.
# Whoever calls it here reports a failure with its context (the tool error the model reads; the working
# indicator's one warning per turn), so the driver's own lines are muted rather than repeated.
for _name in ("mattermostautodriver.api", "mattermostautodriver.websocket"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

#: How long one REST call may take, in seconds (the engine's own ``tools.call_timeout_s`` bounds the tool call).
CALL_TIMEOUT_S = 30.0
#: What a call raises when the server refused it or was not reached: the driver's errors are httpx's ``HTTPError``
#: (a refusal it knows, ``MattermostError``, and a transport failure) and ``InvalidMattermostError`` (a refusal whose
#: body is not Mattermost's error shape).
DRIVER_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, InvalidMattermostError)


def server_url() -> str:
    """``MATTERMOST_URL``, required: a self-hosted server has no default."""
    return from_env(MATTERMOST.url_env, "the Mattermost server's URL")


def driver(base_url: str, token: str, *, timeout_s: float = CALL_TIMEOUT_S, retries: bool = True) -> TypedDriver:
    """A driver for ``token`` at ``base_url`` (``scheme://host[:port][/path]``); ``retries=False`` drops its own retries.

    The driver builds its URLs from scheme, host and port; a server under a
    path gets a client that keeps the path after them.
    """
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{MATTERMOST.url_env} must be an http:// or https:// URL (got {base_url[:200]!r})")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    options = {
        "scheme": parts.scheme, "url": host, "port": port, "token": token,
        "request_timeout": timeout_s, "max_retries": 3 if retries else 0,
    }
    path = parts.path.rstrip("/")
    made = TypedDriver(options, client_cls=_client_under(path) if path else Client)
    made.client.token = token  # what login() sets for a token, without its round trip
    return made


def _client_under(path: str) -> type[Client]:
    """The driver's client with every URL under ``path`` (a server behind a reverse proxy's sub-path)."""

    class UnderPath(Client):
        def __init__(self, options: dict[str, Any]) -> None:
            super().__init__(options)
            self._url = f"{self.url}{path}"

    return UnderPath


def refusal(what: str, exc: Exception) -> str:
    """What a failed call tells the model: the server's status and message, or why it was not reached."""
    if isinstance(exc, httpx.TransportError):
        return f"could not reach Mattermost for {what}: {type(exc).__name__}: {exc}"
    status = getattr(exc, "status_code", None)
    message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    return f"Mattermost refused {what}: HTTP {status or '?'}: {message[:500]}"


class MattermostTools(VendorCalls[TypedDriver]):
    """The tools' calls through one driver made on first use; the bot's own user id asked once."""

    name = "mattermost"
    instructions = (
        "Read and answer Mattermost conversations as this seat's own bot. The post that woke you names its "
        "channel and thread (mattermost:<channel_id>:<root_id>): answer there with reply_in_thread."
    )
    errors = DRIVER_ERRORS

    def __init__(self) -> None:
        super().__init__()
        self._me = ""

    def connect(self) -> TypedDriver:
        token = from_env(MATTERMOST.token_env, "the seat's Mattermost bot token")
        try:
            return driver(server_url(), token)
        except ValueError as exc:
            raise ToolError(str(exc)) from None

    def refusal(self, what: str, exc: Exception) -> str:
        return refusal(what, exc)

    def me(self) -> str:
        if not self._me:
            self._me = str(self.call("GET /api/v4/users/me", lambda d: d.users.get_user("me"))["id"])
        return self._me

    @tool(ADDS)
    def reply_in_thread(self, channel_id: str, root_id: str, message: str) -> dict[str, Any]:
        """Post ``message`` as a reply in the thread whose root post is ``root_id``, in ``channel_id``."""
        channel_id, root_id, text = need_text(channel_id, "channel_id"), need_text(root_id, "root_id"), message_text(message, "message")
        post = self.call(
            "POST /api/v4/posts", lambda d: d.posts.create_post(channel_id=channel_id, message=text, root_id=root_id)
        )
        return {"id": post.get("id"), "channel_id": post.get("channel_id", channel_id), "root_id": post.get("root_id", root_id)}

    @tool(ADDS)
    def post_message(self, channel_id: str, message: str) -> dict[str, Any]:
        """Post ``message`` as a new post at the top of ``channel_id`` (not in a thread)."""
        channel_id, text = need_text(channel_id, "channel_id"), message_text(message, "message")
        post = self.call("POST /api/v4/posts", lambda d: d.posts.create_post(channel_id=channel_id, message=text))
        return {"id": post.get("id"), "channel_id": post.get("channel_id", channel_id)}

    @tool(ADDS_ONCE)
    def add_reaction(self, post_id: str, emoji_name: str) -> str:
        """React to the post ``post_id`` with the emoji ``emoji_name`` (e.g. white_check_mark)."""
        post_id, emoji = need_text(post_id, "post_id"), need_text(emoji_name, "emoji_name", 64).strip(":")
        me = self.me()
        self.call(
            "POST /api/v4/reactions",
            lambda d: d.reactions.save_reaction({"user_id": me, "post_id": post_id, "emoji_name": emoji}),
        )
        return f"reacted :{emoji}: to post {post_id}"

    @tool(READS)
    def read_thread(self, post_id: str) -> dict[str, Any]:
        """Every post of the thread ``post_id`` belongs to (its root or any reply), oldest first."""
        post_id = need_text(post_id, "post_id")
        thread = self.call(f"GET /api/v4/posts/{post_id}/thread", lambda d: d.posts.get_post_thread(post_id))
        posts = thread.get("posts") if isinstance(thread, dict) else None
        listed = [p for p in (posts or {}).values() if isinstance(p, dict)]
        listed.sort(key=lambda p: (p.get("create_at") or 0, str(p.get("id"))))
        return {
            "post_id": post_id,
            "posts": [
                {k: p[k] for k in ("id", "user_id", "message", "create_at", "root_id") if p.get(k) not in (None, "")}
                for p in listed
            ],
        }


def build(tools: Optional[MattermostTools] = None) -> MCPServer:
    """The Mattermost server with its four tools."""
    return server(tools or MattermostTools())


if __name__ == "__main__":
    build().run("stdio")
