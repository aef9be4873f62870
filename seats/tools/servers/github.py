"""GitHub's tools for a seat: an MCP server over stdio on PyGithub.

Granted with ``mcp_servers: {github: {builtin: github}}``, the engine runs it
as ``python -m seats.tools.servers.github`` with the seat's token in
``GITHUB_TOKEN`` (a fine-grained or classic personal access token, or a
GitHub App installation token) and the REST API's base in ``GITHUB_API_URL``
(``surfaces.github.api_url``, default ``https://api.github.com``; GitHub
Enterprise Server's is ``https://<host>/api/v3``). PyGithub's client runs
lazily, so each tool is exactly one REST call:

* ``add_comment`` — ``POST /repos/{owner}/{repo}/issues/{issue_number}/comments``:
  a comment on the issue or on the pull request's conversation (a pull
  request is an issue to this endpoint);
* ``read_comments`` — ``GET /repos/{owner}/{repo}/issues/{issue_number}/comments``,
  oldest first, a page at a time;
* ``add_reaction`` — ``POST /repos/{owner}/{repo}/issues/comments/{comment_id}/reactions``
  (GitHub answers a reaction already there with the one it has).

The token needs, on each repository the seat answers in: *Issues: read and
write* and *Pull requests: read and write* (fine-grained, or a GitHub App's
permissions), or the ``repo`` scope (``public_repo`` for public
repositories only) on a classic token. A refusal is a tool error the model
reads, with GitHub's status and message.
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional

import requests
from github import Auth, Github, GithubException
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from crewlet.company.builtin_servers import GITHUB
from seats.tools.servers.common import ADDS, ADDS_ONCE, READS, VendorCalls, from_env, message_text, page_limit, server, tool

#: How long one REST call may take, in seconds (the engine's own ``tools.call_timeout_s`` bounds the tool call).
CALL_TIMEOUT_S = 30
#: The most comments one ``read_comments`` page returns (GitHub's own cap for ``per_page`` is 100).
MAX_PAGE = 100
#: ``owner/name`` as GitHub spells a repository (checked, so a value never reaches a URL path unchecked).
_REPO = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}")
#: The reactions GitHub accepts (``content`` of the reactions API).
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
#: The longest comment GitHub stores, in characters.
MAX_COMMENT_CHARS = 65_536


def api_url() -> str:
    """``GITHUB_API_URL`` without its trailing slash (PyGithub appends ``/repos/...``)."""
    return (os.environ.get(GITHUB.url_env, "").strip() or GITHUB.default_url).rstrip("/")


def client(token: str, base_url: str, *, timeout_s: int = CALL_TIMEOUT_S, per_page: int = 30) -> Github:
    """A lazy PyGithub client for ``token`` at ``base_url``: objects are made without a request, so a call is one call.

    No retries of its own: a rate limit or a refusal reaches the model at
    once, within the engine's bound on the tool call, instead of a wait it
    cannot see.
    """
    return Github(base_url=base_url, auth=Auth.Token(token), timeout=timeout_s, per_page=per_page, retry=None, lazy=True)


def refusal(what: str, exc: Exception) -> str:
    """What a failed call tells the model: GitHub's status and message, or why GitHub was not reached."""
    if isinstance(exc, GithubException):
        data = exc.data if isinstance(exc.data, dict) else {}
        message = str(data.get("message") or exc.message or "")
        return f"GitHub refused {what}: HTTP {exc.status}" + (f": {message[:500]}" if message else "")
    return f"could not reach GitHub's {what} at {api_url()}: {type(exc).__name__}: {str(exc)[:300]}"


def repo_arg(value: str) -> str:
    """``owner/name``, or a :class:`ToolError` naming what is wanted."""
    text = value.strip() if isinstance(value, str) else ""
    if not _REPO.fullmatch(text):
        raise ToolError(f"repo must be a repository as owner/name, e.g. octo-org/octo-repo (got {text[:100]!r})")
    return text


def number_arg(value: int, field: str) -> int:
    """A positive id or number (an issue's, a comment's)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolError(f"{field} must be a positive integer (got {value!r})")
    return value


class GitHubTools(VendorCalls[Github]):
    """The tools' calls, each one REST call through one client made on first use."""

    name = "github"
    instructions = (
        "Read and answer GitHub issues and pull requests as this seat. The reply target you are given names the "
        "repo and issue_number: answer there with add_comment."
    )
    errors = (GithubException, requests.RequestException)

    def connect(self) -> Github:
        return client(from_env(GITHUB.token_env, "the seat's GitHub token"), api_url())

    def refusal(self, what: str, exc: Exception) -> str:
        return refusal(what, exc)

    @tool(ADDS)
    def add_comment(self, repo: str, issue_number: int, body: str) -> dict[str, Any]:
        """Comment ``body`` (Markdown) on issue or pull request ``issue_number`` of ``repo`` (owner/name)."""
        repo, number = repo_arg(repo), number_arg(issue_number, "issue_number")
        text = message_text(body, "body")
        if len(text) > MAX_COMMENT_CHARS:
            raise ToolError(f"body is {len(text)} characters; GitHub stores at most {MAX_COMMENT_CHARS}")
        made = self.call(
            f"POST /repos/{repo}/issues/{number}/comments",
            lambda g: g.get_repo(repo).get_issue(number).create_comment(text),
        )
        return {"id": made.id, "html_url": made.html_url, "repo": repo, "issue_number": number}

    @tool(READS)
    def read_comments(self, repo: str, issue_number: int, limit: int = 30, page: int = 1) -> dict[str, Any]:
        """The comments of issue or pull request ``issue_number`` of ``repo``, oldest first, ``limit`` per page."""
        repo, number = repo_arg(repo), number_arg(issue_number, "issue_number")
        limit, page = page_limit(limit, MAX_PAGE), number_arg(page, "page")

        def read(g: Github) -> list[Any]:
            g.per_page = limit  # the page size of the next listing (the tools' calls run one at a time)
            return list(g.get_repo(repo).get_issue(number).get_comments().get_page(page - 1))

        comments = self.call(f"GET /repos/{repo}/issues/{number}/comments", read)
        return {
            "repo": repo,
            "issue_number": number,
            "page": page,
            "comments": [
                {"id": c.id, "user": c.user.login if c.user else "", "body": c.body, "created_at": c.created_at.isoformat()}
                for c in comments
            ],
            "has_more": len(comments) == limit,
        }

    @tool(ADDS_ONCE)
    def add_reaction(self, repo: str, issue_number: int, comment_id: int, content: str) -> str:
        """React to comment ``comment_id`` on issue or pull request ``issue_number`` of ``repo`` (content: +1, -1, laugh, confused, heart, hooray, rocket, eyes)."""
        repo, number = repo_arg(repo), number_arg(issue_number, "issue_number")
        comment = number_arg(comment_id, "comment_id")
        if content not in REACTIONS:
            raise ToolError(f"content must be one of {', '.join(REACTIONS)} (got {str(content)[:40]!r})")
        self.call(
            f"POST /repos/{repo}/issues/comments/{comment}/reactions",
            lambda g: g.get_repo(repo).get_issue(number).get_comment(comment).create_reaction(content),
        )
        return f"reacted {content} to comment {comment} in {repo}"


def build(tools: Optional[GitHubTools] = None) -> MCPServer:
    """The GitHub server with its three tools."""
    return server(tools or GitHubTools())


if __name__ == "__main__":
    build().run("stdio")
