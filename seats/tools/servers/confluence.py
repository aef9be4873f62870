"""Confluence's tools for a seat: an MCP server over stdio on ``atlassian-python-api``'s Confluence Cloud client.

Granted with ``mcp_servers: {confluence: {builtin: confluence}}``, the engine
runs it as ``python -m seats.tools.servers.confluence`` with the site in
``CONFLUENCE_URL`` (``surfaces.confluence.server``:
``https://<site>.atlassian.net/wiki``), the seat's API token in
``CONFLUENCE_TOKEN`` and the account's email in ``CONFLUENCE_USER`` (HTTP
Basic, as Atlassian Cloud wants). It speaks Confluence Cloud's REST API v2,
where page comments live since v1's content calls were deprecated there;
each tool is one call:

* ``add_comment`` — ``POST /wiki/api/v2/footer-comments``: a comment on the
  page (``pageId``), or a reply in the thread of one of its comments
  (``parentCommentId``), the text as storage-format paragraphs;
* ``read_comments`` — ``GET /wiki/api/v2/pages/{page_id}/footer-comments``
  with ``body-format=storage``, a page at a time (``cursor``).

Confluence has no public REST call to like a comment, so there is no
reaction tool. The account needs *View* on the space and *Add comments*
(a space permission); an API token with scopes needs
``read:comment:confluence`` and ``write:comment:confluence``. A refusal is a
tool error the model reads, with Confluence's status and message.
"""
from __future__ import annotations

import html
import re
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

from atlassian import ConfluenceV2
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from crewlet.company.builtin_servers import CONFLUENCE
from seats.tools.servers.atlassian_client import CLIENT_ERRORS, credentials, refusal
from seats.tools.servers.common import ADDS, READS, VendorCalls, message_text, page_limit, server, tool

#: A page's or a comment's id: Confluence's content ids are numbers.
_CONTENT_ID = re.compile(r"[0-9]{1,20}")
#: The most comments one ``read_comments`` page returns (Confluence's own cap for ``limit`` is 250).
MAX_PAGE = 100
#: The representation a comment is written in and read back as.
STORAGE = "storage"
#: Where a comment is created (``/wiki`` is the site URL's).
FOOTER_COMMENTS = "api/v2/footer-comments"


def content_id_arg(value: str, field: str) -> str:
    """A page or comment id (digits), or a :class:`ToolError` naming what is wanted."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not _CONTENT_ID.fullmatch(text):
        raise ToolError(f"{field} must be a Confluence content id, digits like 1234567 (got {text[:100]!r})")
    return text


def storage(text: str) -> str:
    """Plain text as Confluence's storage format: each blank-line-separated paragraph a ``<p>``, its lines kept."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    return "".join("<p>" + "<br />".join(html.escape(line) for line in p.splitlines()) + "</p>" for p in paragraphs)


class ConfluenceTools(VendorCalls[ConfluenceV2]):
    """The tools' calls through one client made on first use."""

    name = "confluence"
    instructions = (
        "Read and answer Confluence page comments as this seat. The reply target you are given names the "
        "page_id (and the comment to answer, parent_comment_id): answer there with add_comment."
    )
    errors = CLIENT_ERRORS

    def connect(self) -> ConfluenceV2:
        return ConfluenceV2(**credentials(CONFLUENCE, "Confluence"))

    def refusal(self, what: str, exc: Exception) -> str:
        return refusal("Confluence", what, exc)

    @tool(ADDS)
    def add_comment(self, page_id: str, body: str, parent_comment_id: str = "") -> dict[str, Any]:
        """Comment ``body`` (plain text) on the page ``page_id``; with ``parent_comment_id``, as a reply to that comment of the page."""
        page = content_id_arg(page_id, "page_id")
        parent = content_id_arg(parent_comment_id, "parent_comment_id") if str(parent_comment_id).strip() else ""
        value = storage(message_text(body, "body"))
        where: dict[str, str] = {"parentCommentId": parent} if parent else {"pageId": page}
        data = {**where, "body": {"representation": STORAGE, "value": value}}
        made = self.call(f"POST /wiki/{FOOTER_COMMENTS}", lambda c: c.post(FOOTER_COMMENTS, data=data))
        made = made if isinstance(made, dict) else {}
        return {"id": made.get("id"), "page_id": str(made.get("pageId") or page), "parent_comment_id": parent or None}

    @tool(READS)
    def read_comments(self, page_id: str, limit: int = 25, cursor: str = "") -> dict[str, Any]:
        """The footer comments of the page ``page_id``; pass ``next_cursor`` back as ``cursor`` for more."""
        page = content_id_arg(page_id, "page_id")
        params: dict[str, Any] = {"body-format": STORAGE, "limit": page_limit(limit, MAX_PAGE)}
        if cursor.strip():
            params["cursor"] = cursor.strip()
        answer = self.call(
            f"GET /wiki/api/v2/pages/{page}/footer-comments",
            lambda c: c.get(c.get_endpoint("page_footer_comments", id=page), params=params),
        )
        answer = answer if isinstance(answer, dict) else {}
        following = str((answer.get("_links") or {}).get("next") or "")
        return {
            "page_id": page,
            "comments": [
                {"id": c.get("id"), "author_id": (c.get("version") or {}).get("authorId", ""),
                 "created_at": (c.get("version") or {}).get("createdAt", ""),
                 "body": ((c.get("body") or {}).get(STORAGE) or {}).get("value", "")}
                for c in answer.get("results") or [] if isinstance(c, dict)
            ],
            "next_cursor": (parse_qs(urlsplit(following).query).get("cursor") or [""])[0],
        }


def build(tools: Optional[ConfluenceTools] = None) -> MCPServer:
    """The Confluence server with its two tools."""
    return server(tools or ConfluenceTools())


if __name__ == "__main__":
    build().run("stdio")
