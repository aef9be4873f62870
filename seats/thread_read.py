"""A turn's conversation, read from its backend with the seat's own credentials: the vendor half of the thread block.

Each surface's conversation is read with the very calls the shipped tool
servers make (:mod:`seats.tools.servers`), through the same vendor clients,
with the credentials and the URL the seat's grant of that server gives it
(``seats[].tools: [{server: slack, env: {SLACK_BOT_TOKEN: ADA_SLACK_BOT_TOKEN}}]``,
else the server's own variables; :func:`seat_access`):

* slack — the thread (``conversations.replies``, every page); a direct
  message at the top of its channel, the channel's latest messages
  (``conversations.history``, newest first, one page: Slack does not say how
  many are older);
* mattermost — the thread of the post (``GET /api/v4/posts/{id}/thread``);
* github — the issue's or pull request's comments (every page);
* jira — the issue's comments (the total first, then its newest page);
* confluence — the page's footer comments (every page).

Every message is named by the identity its own wake carries in the
completion ledger (:func:`crewlet.events.backend_ids.message_identity`), and
marked ``own`` when the seat wrote it (its id on the surface,
``Seat.own_ids``). A read that fails raises :class:`ThreadReadError` with the
vendor's words, never a token. A seat granted no shipped server of the
surface has no conversation to read (None): any other credentials would read
as somebody else.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, TypeVar, cast

from atlassian import ConfluenceV2, Jira
from mcp.server.mcpserver.exceptions import ToolError

from crewlet.company.builtin_servers import BUILTIN_SERVERS, CONFLUENCE, GITHUB, JIRA, MATTERMOST, SLACK, builtin_grant
from crewlet.company.org import Organization, Seat, grant_env
from crewlet.events.backend_ids import comment_message_id, message_identity, slack_message_id
from seats.tools.servers import confluence as confluence_server, github as github_server, mattermost as mattermost_server
from seats.tools.servers import slack as slack_server
from seats.tools.servers.atlassian_client import CLIENT_ERRORS, refusal as atlassian_refusal

T = TypeVar("T")
#: The most pages one read follows (a thread longer than this many full pages is refused, not cut at its oldest end).
MAX_PAGES = 25


class ThreadReadError(Exception):
    """The conversation could not be read; the message says why, in the vendor's words."""


@dataclass(frozen=True)
class ThreadMessage:
    """One message of a conversation as the thread block shows it."""

    #: The completion ledger's key of the message: the one its own wake carries.
    identity: str
    #: Who wrote it, as the surface names them (an id, a login).
    author: str
    text: str
    #: The seat itself wrote it.
    own: bool = False


@dataclass(frozen=True)
class Conversation:
    """What was read: the messages oldest first, and how many older ones were not (None: some, the vendor says not how many)."""

    surface: str
    messages: list[ThreadMessage] = field(default_factory=list)
    older: Optional[int] = 0


@dataclass(frozen=True)
class Access:
    """Where the seat's shipped server of a surface calls, and with what: its URL and its variables' values."""

    url: str
    values: Mapping[str, str]

    def value(self, name: str) -> str:
        return self.values.get(name, "")


def seat_access(org: Organization, seat: Seat, surface: str, environ: Optional[Mapping[str, str]] = None) -> Optional[Access]:
    """The URL and credentials of ``seat``'s grant of the shipped ``surface`` server; None when it is granted none, or no token."""
    kind = BUILTIN_SERVERS.get(surface)
    server = builtin_grant(org, seat, surface) if kind is not None else None
    if kind is None or server is None:
        return None
    env = os.environ if environ is None else environ
    values = {name: env.get(variable, "").strip() for name, variable in grant_env(seat, server).items()}
    url = server.env.get(kind.url_env, "")
    return Access(url, values) if url and values.get(kind.token_env) else None


def _seat_tools(tools: type[T], made: object) -> T:
    """A shipped server's tools whose client accessor (``client``) answers ``made``, the seat's own client.

    The tools make their client from the environment a tool server is started
    with; in the engine the seat's credentials are this client's instead.
    """
    bound = type(f"{tools.__name__}AsSeat", (tools,), {"client": lambda self: made})
    return cast(T, bound())


def _tool_read(make: Callable[[], Any]) -> Any:
    """A shipped tool's call, its refusal (a :class:`ToolError` in the vendor's words) raised as a read error."""
    try:
        return make()
    except ToolError as exc:
        raise ThreadReadError(str(exc)) from None


def read_slack(access: Access, seat: Seat, target: Mapping[str, Any], limit: int, timeout_s: float) -> Conversation:
    """A Slack thread, every page; a direct message's channel (no thread) its latest ``limit`` messages."""
    made = slack_server.web_client(access.value(SLACK.token_env), access.url, timeout_s=timeout_s, retries=False)
    tools = _seat_tools(slack_server.SlackTools, made)
    channel, root = str(target["channel"]), str(target.get("thread_ts") or "")
    mine = set(seat.own_ids(SLACK.surface))
    raw: list[dict[str, Any]] = []
    older: Optional[int] = 0
    if root:
        cursor = ""
        for _ in range(MAX_PAGES):
            page = _tool_read(lambda: tools.read_thread(channel, root, slack_server.MAX_PAGE, cursor))
            raw.extend(page["messages"])
            cursor = page["next_cursor"] if page["has_more"] else ""
            if not cursor:
                break
        else:
            raise ThreadReadError(f"the thread {channel}:{root} is longer than {MAX_PAGES} pages of {slack_server.MAX_PAGE}")
    else:
        answer = _tool_read(lambda: tools.call(
            "conversations.history", lambda c: c.conversations_history(channel=channel, limit=limit)
        ))
        raw = [m for m in reversed(answer.get("messages") or []) if isinstance(m, dict)]
        older = None if answer.get("has_more") else 0
    messages = [
        ThreadMessage(message_identity(SLACK.surface, slack_message_id(channel, str(m.get("ts")))), str(m.get("user") or m.get("bot_id") or ""),
                      str(m.get("text") or ""), own=str(m.get("user") or "") in mine)
        for m in raw if m.get("ts")
    ]
    return Conversation(SLACK.surface, messages, older)


def read_mattermost(access: Access, seat: Seat, target: Mapping[str, Any], limit: int, timeout_s: float) -> Conversation:
    """The thread the post belongs to (its root's, whichever post of it is named)."""
    try:
        made = mattermost_server.driver(access.url, access.value(MATTERMOST.token_env), timeout_s=timeout_s, retries=False)
    except ValueError as exc:
        raise ThreadReadError(str(exc)) from None
    try:
        thread = _tool_read(lambda: _seat_tools(mattermost_server.MattermostTools, made).read_thread(str(target.get("post_id") or target["root_id"])))
    finally:
        made.close()
    mine = set(seat.own_ids(MATTERMOST.surface))
    messages = [
        ThreadMessage(message_identity(MATTERMOST.surface, str(p["id"])), str(p.get("user_id") or ""), str(p.get("message") or ""),
                      own=str(p.get("user_id") or "") in mine)
        for p in thread["posts"] if p.get("id")
    ]
    return Conversation(MATTERMOST.surface, messages)


def read_github(access: Access, seat: Seat, target: Mapping[str, Any], limit: int, timeout_s: float) -> Conversation:
    """The comments of the issue or pull request, every page."""
    made = github_server.client(access.value(GITHUB.token_env), access.url, timeout_s=max(1, int(timeout_s)))
    tools = _seat_tools(github_server.GitHubTools, made)
    repo, number = str(target["repo"]), int(target["issue_number"])
    raw: list[dict[str, Any]] = []
    for page in range(1, MAX_PAGES + 1):
        listed = _tool_read(lambda: tools.read_comments(repo, number, github_server.MAX_PAGE, page))
        raw.extend(listed["comments"])
        if not listed["has_more"]:
            break
    else:
        raise ThreadReadError(f"{repo}#{number} has more than {MAX_PAGES * github_server.MAX_PAGE} comments")
    mine = {i.lower() for i in seat.own_ids(GITHUB.surface)}
    messages = [
        ThreadMessage(message_identity(GITHUB.surface, comment_message_id(c["id"])), str(c.get("user") or ""), str(c.get("body") or ""),
                      own=str(c.get("user") or "").lower() in mine)
        for c in raw
    ]
    return Conversation(GITHUB.surface, messages)


def _atlassian(access: Access, kind: Any, timeout_s: float) -> dict[str, Any]:
    """The Atlassian client's keyword arguments for the seat: HTTP Basic with a user, a bearer token without one."""
    user = access.value(kind.extra_env[0]) if kind.extra_env else ""
    token = access.value(kind.token_env)
    auth: dict[str, Any] = {"username": user, "password": token} if user else {"token": token}
    return {"url": access.url, "timeout": max(1, int(timeout_s)), **auth}


def read_jira(access: Access, seat: Seat, target: Mapping[str, Any], limit: int, timeout_s: float) -> Conversation:
    """The issue's newest ``limit`` comments (``GET /rest/api/2/issue/{key}/comment``: the total, then the page that ends it)."""
    client = Jira(**_atlassian(access, JIRA, timeout_s), api_version="2")
    key = str(target["issue_key"])
    what = f"GET /rest/api/2/issue/{key}/comment"

    def page(start: int) -> dict[str, Any]:
        params = {"startAt": start, "maxResults": limit, "orderBy": "created"}
        try:
            answer = client.get(client.resource_url(f"issue/{key}/comment"), params=params)
        except CLIENT_ERRORS as exc:
            raise ThreadReadError(atlassian_refusal("Jira", what, exc)) from None
        return answer if isinstance(answer, dict) else {}

    answer = page(0)
    total = answer.get("total")
    start = max(0, total - limit) if isinstance(total, int) else 0
    if start:
        answer = page(start)
    mine = set(seat.own_ids(JIRA.surface))
    messages = []
    for c in answer.get("comments") or []:
        if not isinstance(c, dict) or not c.get("id"):
            continue
        author = c["author"] if isinstance(c.get("author"), dict) else {}
        who = str(author.get("accountId") or author.get("key") or author.get("name") or "")
        messages.append(ThreadMessage(message_identity(JIRA.surface, comment_message_id(c["id"])), who, str(c.get("body") or ""), own=who in mine))
    return Conversation(JIRA.surface, messages, start)


def read_confluence(access: Access, seat: Seat, target: Mapping[str, Any], limit: int, timeout_s: float) -> Conversation:
    """The page's footer comments, every page."""
    tools = _seat_tools(confluence_server.ConfluenceTools, ConfluenceV2(**_atlassian(access, CONFLUENCE, timeout_s)))
    page_id = str(target["page_id"])
    raw: list[dict[str, Any]] = []
    cursor = ""
    for _ in range(MAX_PAGES):
        listed = _tool_read(lambda: tools.read_comments(page_id, confluence_server.MAX_PAGE, cursor))
        raw.extend(listed["comments"])
        cursor = listed["next_cursor"]
        if not cursor:
            break
    else:
        raise ThreadReadError(f"page {page_id} has more than {MAX_PAGES * confluence_server.MAX_PAGE} comments")
    mine = set(seat.own_ids(CONFLUENCE.surface))
    messages = [
        ThreadMessage(message_identity(CONFLUENCE.surface, comment_message_id(c["id"])), str(c.get("author_id") or ""),
                      str(c.get("body") or ""), own=str(c.get("author_id") or "") in mine)
        for c in raw if c.get("id")
    ]
    return Conversation(CONFLUENCE.surface, messages)


Reader = Callable[[Access, Seat, Mapping[str, Any], int, float], Conversation]
#: Each surface's reader: ``(access, seat, reply target, newest-messages limit, timeout) -> Conversation`` (blocking).
READERS: Mapping[str, Reader] = {
    SLACK.surface: read_slack,
    MATTERMOST.surface: read_mattermost,
    GITHUB.surface: read_github,
    JIRA.surface: read_jira,
    CONFLUENCE.surface: read_confluence,
}


__all__ = [
    "Access",
    "Conversation",
    "READERS",
    "ThreadMessage",
    "ThreadReadError",
    "read_confluence",
    "read_github",
    "read_jira",
    "read_mattermost",
    "read_slack",
    "seat_access",
]
