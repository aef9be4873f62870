"""Local servers that speak GitHub's, Jira's and Confluence's REST APIs for the calls the shipped tracker tools make.

* :class:`GitHubApi`: GitHub's REST API under a GitHub Enterprise Server
  style base (``<url>/api/v3``) — ``POST`` and ``GET
  /repos/{owner}/{repo}/issues/{number}/comments`` (201 with the issue
  comment; 200 with the list), ``POST
  /repos/{owner}/{repo}/issues/comments/{id}/reactions`` (201 with the
  reaction) — shaped from the REST reference's examples; an unknown token is
  401 ``{"message": "Bad credentials"}``, an unknown issue 404 ``Not Found``.
* :class:`JiraApi`: Jira's REST API v2 — ``POST`` and ``GET
  /rest/api/2/issue/{key}/comment`` (201 with the comment; 200 with
  ``startAt``/``maxResults``/``total``/``comments``); 401 for credentials it
  does not know, 404 with ``errorMessages`` for an unknown issue.
* :class:`ConfluenceApi`: Confluence Cloud's REST API v2 under ``/wiki`` —
  ``POST /wiki/api/v2/footer-comments`` (200 with the comment, as the
  reference says) and ``GET /wiki/api/v2/pages/{id}/footer-comments``
  (``results`` and ``_links``); errors in v2's ``{"errors": [{status, code,
  title, detail}]}``.

Each records every call (verb, path, the whole ``Authorization`` header,
the JSON body and query) in a :class:`~chat_vendor_support.CallLog`, so a
test asserts the exact call and its credentials. Each runs on a thread of its
own, so a test in-process and a ``manage.py up`` child reach it alike.
"""
from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Iterator, Optional, Protocol, TypeVar
from urllib.parse import parse_qsl, urlsplit

from chat_vendor_support import CallLog
from seats_support import loopback_http, send_json

#: An answer: the status and the JSON body (an object or, for a GitHub listing, an array).
Answer = tuple[int, Any]


def basic(user: str, token: str) -> str:
    """The ``Authorization`` header of HTTP Basic ``user:token``, as an Atlassian Cloud client sends it."""
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def _send(handler: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
    send_json(handler, status, payload, content_type="application/json;charset=UTF-8")


def _serve(answer: Callable[[str, str, str, dict[str, Any]], Answer]) -> type[BaseHTTPRequestHandler]:
    """A handler that reads the JSON body and the query and answers with ``answer(verb, path, authorization, args)``."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            parts = urlsplit(self.path)
            args: dict[str, Any] = dict(parse_qsl(parts.query))
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if raw:
                body = json.loads(raw)
                args.update(body if isinstance(body, dict) else {"_body": body})
            _send(self, *answer(self.command, parts.path, self.headers.get("Authorization") or "", args))

        do_GET = do_POST = _serve  # noqa: N815 - http.server's naming

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


class GitHubApi:
    """GitHub's REST API for the issue comment and reaction calls; ``url`` is ``surfaces.github.api_url``."""

    PREFIX = "/api/v3"

    def __init__(self, log: CallLog, tokens: set[str]) -> None:
        self.log = log
        #: The ``Authorization`` headers it accepts (PyGithub sends ``token <token>``).
        self.auth = {f"token {t}" for t in tokens}
        #: (owner/repo, number) -> its comments, oldest first.
        self.issues: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self._ids = itertools.count(1_000_000_001)
        self._lock = threading.Lock()
        self.url = ""

    def comment(self, repo: str, number: int, login: str, body: str) -> dict[str, Any]:
        """A comment as the REST API lists it (``GET /repos/{owner}/{repo}/issues/comments/{id}``'s example)."""
        cid = next(self._ids)
        api = f"{self.url}/repos/{repo}"
        made = {
            "id": cid, "node_id": f"IC_{cid}", "url": f"{api}/issues/comments/{cid}",
            "html_url": f"https://github.example/{repo}/issues/{number}#issuecomment-{cid}", "body": body,
            "user": {"login": login, "id": 583231, "node_id": "MDQ6VXNlcjU4MzIzMQ==", "type": "User", "site_admin": False},
            "created_at": "2024-06-10T12:00:00Z", "updated_at": "2024-06-10T12:00:00Z",
            "issue_url": f"{api}/issues/{number}", "author_association": "MEMBER",
        }
        with self._lock:
            self.issues.setdefault((repo, number), []).append(made)
        return made

    def answer(self, verb: str, path: str, auth: str, args: dict[str, Any]) -> Answer:
        self.log.add("github", verb, path, auth, args)
        if auth not in self.auth:
            return 401, {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest", "status": "401"}
        found = re.fullmatch(rf"{self.PREFIX}/repos/([^/]+/[^/]+)/issues/(\d+)/comments", path)
        if found and (found[1], int(found[2])) in self.issues:
            repo, number = found[1], int(found[2])
            if verb == "POST":
                return 201, self.comment(repo, number, "ada-bot", str(args.get("body", "")))
            page, size = int(args.get("page", 1)), int(args.get("per_page", 30))
            return 200, self.issues[(repo, number)][(page - 1) * size: page * size]
        found = re.fullmatch(rf"{self.PREFIX}/repos/([^/]+/[^/]+)/issues/comments/(\d+)/reactions", path)
        if found and verb == "POST":
            return 201, {"id": next(self._ids), "node_id": "MDg6UmVhY3Rpb24x", "content": args.get("content"),
                         "user": {"login": "ada-bot", "id": 583231, "type": "User"}, "created_at": "2024-06-10T12:00:01Z"}
        return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest", "status": "404"}


class JiraApi:
    """Jira's REST API v2 for the issue comment calls; ``url`` is ``surfaces.jira.server``."""

    def __init__(self, log: CallLog, auth: set[str], issues: set[str]) -> None:
        self.log = log
        self.auth = auth
        #: Each issue's comments, oldest first.
        self.comments: dict[str, list[dict[str, Any]]] = {key: [] for key in issues}
        self._ids = itertools.count(10100)
        self.url = ""

    def answer(self, verb: str, path: str, auth: str, args: dict[str, Any]) -> Answer:
        self.log.add("jira", verb, path, auth, args)
        if auth not in self.auth:
            return 401, {"errorMessages": ["You are not authenticated. Authentication required to perform this operation."], "errors": {}}
        found = re.fullmatch(r"/rest/api/2/issue/([A-Z][A-Z0-9_]*-\d+)/comment", path)
        if not found or found[1] not in self.comments:
            return 404, {"errorMessages": ["Issue does not exist or you do not have permission to see it."], "errors": {}}
        key = found[1]
        if verb == "POST":
            if not str(args.get("body") or "").strip():
                return 400, {"errorMessages": [], "errors": {"comment": "Comment body can not be empty!"}}
            cid = str(next(self._ids))
            author = {"self": f"{self.url}/rest/api/2/user?accountId=5b10ac8d82e05b22cc7d4ada", "accountId": "5b10ac8d82e05b22cc7d4ada",
                      "displayName": "Ada (bot)", "active": True, "timeZone": "UTC", "accountType": "atlassian"}
            made = {"self": f"{self.url}/rest/api/2/issue/10000/comment/{cid}", "id": cid, "author": author,
                    "body": args["body"], "updateAuthor": author, "created": "2024-06-10T12:00:00.000+0000",
                    "updated": "2024-06-10T12:00:00.000+0000", "jsdPublic": True}
            self.comments[key].append(made)
            return 201, made
        start, size = int(args.get("startAt", 0)), int(args.get("maxResults", 5000))
        listed = self.comments[key]
        return 200, {"startAt": start, "maxResults": size, "total": len(listed), "comments": listed[start:start + size]}


class ConfluenceApi:
    """Confluence Cloud's REST API v2 for the footer comment calls; ``url`` is ``surfaces.confluence.server`` (``…/wiki``)."""

    def __init__(self, log: CallLog, auth: set[str], pages: set[str]) -> None:
        self.log = log
        self.auth = auth
        #: Each page's footer comments, oldest first.
        self.comments: dict[str, list[dict[str, Any]]] = {page: [] for page in pages}
        #: A comment id -> the page it is on (the comments a reply may answer).
        self.on_page: dict[str, str] = {}
        self._ids = itertools.count(16800001)
        self.url = ""

    @staticmethod
    def error(status: int, code: str, title: str) -> Answer:
        return status, {"errors": [{"status": status, "code": code, "title": title, "detail": None}]}

    def known_comment(self, page: str, comment_id: str) -> None:
        """A comment of ``page`` made elsewhere (the one a webhook told of), so a reply to it is accepted."""
        self.on_page[comment_id] = page

    def answer(self, verb: str, path: str, auth: str, args: dict[str, Any]) -> Answer:
        self.log.add("confluence", verb, path, auth, args)
        if auth not in self.auth:
            return self.error(401, "UNAUTHORIZED", "Unauthorized")
        if verb == "POST" and path == "/wiki/api/v2/footer-comments":
            parent = str(args.get("parentCommentId") or "")
            page = self.on_page.get(parent, "") if parent else str(args.get("pageId") or "")
            if page not in self.comments:
                return self.error(404, "NOT_FOUND", "Not Found")
            cid = str(next(self._ids))
            body = args.get("body") or {}
            made = {
                "id": cid, "status": "current", "title": "Re: Some random test page", "pageId": page,
                **({"parentCommentId": parent} if parent else {}),
                "version": {"createdAt": "2024-06-10T12:00:00.000Z", "message": "", "number": 1, "minorEdit": False,
                            "authorId": "5b10ac8d82e05b22cc7d4ada"},
                "body": {str(body.get("representation")): {"representation": body.get("representation"), "value": body.get("value")}},
                "_links": {"webui": f"/spaces/~admin/pages/{page}?focusedCommentId={cid}#comment-{cid}"},
            }
            self.comments[page].append(made)
            self.on_page[cid] = page
            return 200, made
        found = re.fullmatch(r"/wiki/api/v2/pages/(\d+)/footer-comments", path)
        if verb == "GET" and found:
            if found[1] not in self.comments:
                return self.error(404, "NOT_FOUND", "Not Found")
            return 200, {"results": self.comments[found[1]], "_links": {"base": self.url}}
        return self.error(404, "NOT_FOUND", "Not Found")


class _Vendor(Protocol):
    url: str

    def answer(self, verb: str, path: str, auth: str, args: dict[str, Any]) -> Answer: ...


V = TypeVar("V", bound=_Vendor)


@contextlib.contextmanager
def _on_loopback(api: V, path: str) -> Iterator[V]:
    """``api`` served on loopback; its ``url`` is ``http://127.0.0.1:<port>`` and ``path``."""
    with loopback_http(_serve(api.answer)) as port:
        api.url = f"http://127.0.0.1:{port}{path}"
        yield api


def github_api(log: CallLog, tokens: set[str]) -> "contextlib.AbstractContextManager[GitHubApi]":
    """A :class:`GitHubApi` on loopback; its ``url`` is the API base (``http://127.0.0.1:<port>/api/v3``)."""
    return _on_loopback(GitHubApi(log, tokens), GitHubApi.PREFIX)


def jira_api(log: CallLog, auth: set[str], issues: set[str]) -> "contextlib.AbstractContextManager[JiraApi]":
    """A :class:`JiraApi` on loopback; its ``url`` is the site (``http://127.0.0.1:<port>``)."""
    return _on_loopback(JiraApi(log, auth, issues), "")


def confluence_api(log: CallLog, auth: set[str], pages: set[str]) -> "contextlib.AbstractContextManager[ConfluenceApi]":
    """A :class:`ConfluenceApi` on loopback; its ``url`` is the site's wiki (``http://127.0.0.1:<port>/wiki``)."""
    return _on_loopback(ConfluenceApi(log, auth, pages), "/wiki")


def only_call(calls: list[Any], what: Optional[str] = None) -> Any:
    """The one call of ``calls``; fails naming them all otherwise."""
    assert len(calls) == 1, (what, calls)
    return calls[0]


__all__ = ["ConfluenceApi", "GitHubApi", "JiraApi", "basic", "confluence_api", "github_api", "jira_api", "only_call"]
