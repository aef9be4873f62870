"""Jira's tools for a seat: an MCP server over stdio on ``atlassian-python-api``'s ``Jira`` client.

Granted with ``mcp_servers: {jira: {builtin: jira}}``, the engine runs it as
``python -m seats.tools.servers.jira`` with the site in ``JIRA_URL``
(``surfaces.jira.server``: ``https://<site>.atlassian.net``, or a Data
Center's base URL), the seat's API token in ``JIRA_TOKEN`` and, on Atlassian
Cloud, the account's email in ``JIRA_USER`` (HTTP Basic; without a user the
token is sent as a Data Center personal access token, ``Bearer``). It speaks
Jira's REST API v2, which Cloud and Data Center both serve and which takes a
comment's body as plain text (wiki markup); each tool is one call:

* ``add_comment`` — ``POST /rest/api/2/issue/{issue_key}/comment`` with ``body``;
* ``read_comments`` — ``GET /rest/api/2/issue/{issue_key}/comment``, oldest
  first, ``startAt``/``maxResults`` a page at a time.

Jira has no public REST call to react to a comment, so there is no reaction
tool. The account needs the project's *Browse projects* and *Add comments*
permissions. A refusal is a tool error the model reads, with Jira's status
and its ``errorMessages``.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from atlassian import Jira
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from crewlet.company.builtin_servers import JIRA
from seats.tools.servers.atlassian_client import CLIENT_ERRORS, credentials, refusal
from seats.tools.servers.common import ADDS, READS, VendorCalls, message_text, page_limit, server, tool

#: An issue key as Jira writes it: the project's key, a dash, the issue's number.
_ISSUE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,254}-[0-9]{1,18}")
#: The most comments one ``read_comments`` page returns.
MAX_PAGE = 100
#: The longest comment Jira stores by default, in characters (``jira.text.field.character.limit``).
MAX_COMMENT_CHARS = 32_767


def issue_key_arg(value: str) -> str:
    """An issue key (``PROJ-123``), or a :class:`ToolError` naming what is wanted."""
    text = value.strip() if isinstance(value, str) else ""
    if not _ISSUE_KEY.fullmatch(text):
        raise ToolError(f"issue_key must be a Jira issue key like PROJ-123 (got {text[:100]!r})")
    return text.upper()


class JiraTools(VendorCalls[Jira]):
    """The tools' calls through one client made on first use."""

    name = "jira"
    instructions = (
        "Read and answer Jira issues as this seat. The reply target you are given names the issue_key: answer "
        "there with add_comment."
    )
    errors = CLIENT_ERRORS

    def connect(self) -> Jira:
        return Jira(**credentials(JIRA, "Jira"), api_version="2")

    def refusal(self, what: str, exc: Exception) -> str:
        return refusal("Jira", what, exc)

    @tool(ADDS)
    def add_comment(self, issue_key: str, body: str) -> dict[str, Any]:
        """Comment ``body`` (plain text or Jira wiki markup) on the issue ``issue_key`` (e.g. PROJ-123)."""
        key, text = issue_key_arg(issue_key), message_text(body, "body")
        if len(text) > MAX_COMMENT_CHARS:
            raise ToolError(f"body is {len(text)} characters; Jira stores at most {MAX_COMMENT_CHARS}")
        made = self.call(f"POST /rest/api/2/issue/{key}/comment", lambda j: j.issue_add_comment(key, text))
        made = made if isinstance(made, dict) else {}
        return {"id": made.get("id"), "issue_key": key, "self": made.get("self")}

    @tool(READS)
    def read_comments(self, issue_key: str, limit: int = 50, start_at: int = 0) -> dict[str, Any]:
        """The comments of the issue ``issue_key``, oldest first: ``limit`` from ``start_at``."""
        key, limit = issue_key_arg(issue_key), page_limit(limit, MAX_PAGE)
        if isinstance(start_at, bool) or not isinstance(start_at, int) or start_at < 0:
            raise ToolError(f"start_at must be 0 or more (got {start_at!r})")
        params = {"startAt": start_at, "maxResults": limit, "orderBy": "created"}
        answer = self.call(
            f"GET /rest/api/2/issue/{key}/comment",
            lambda j: j.get(j.resource_url(f"issue/{key}/comment"), params=params),
        )
        answer = answer if isinstance(answer, dict) else {}
        comments = [c for c in answer.get("comments") or [] if isinstance(c, dict)]
        total = answer.get("total")
        return {
            "issue_key": key,
            "comments": [
                {"id": c.get("id"), "author": (c.get("author") or {}).get("displayName", ""), "body": c.get("body"),
                 "created": c.get("created")}
                for c in comments
            ],
            "start_at": start_at,
            "total": total,
            "has_more": isinstance(total, int) and start_at + len(comments) < total,
        }


def build(tools: Optional[JiraTools] = None) -> MCPServer:
    """The Jira server with its two tools."""
    return server(tools or JiraTools())


if __name__ == "__main__":
    build().run("stdio")
