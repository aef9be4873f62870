"""Local servers that speak the chat vendors' HTTP APIs for the calls the chat tools and the working indicator make.

* :class:`SlackWebApi`: Slack's Web API under ``/api/`` — ``chat.postMessage``,
  ``reactions.add``, ``reactions.remove``, ``conversations.replies``,
  ``conversations.history`` —
  answering HTTP 200 with ``{"ok": true, ...}`` or ``{"ok": false, "error":
  <code>}`` as Slack does, the answers shaped from each method's reference
  page (a posted message's ``channel``/``ts``/``message``, a thread's
  ``messages``/``has_more``/``response_metadata.next_cursor``). A token it was
  not given is ``invalid_auth``.
* :class:`MattermostApi`: Mattermost's REST API v4 — ``GET /users/me``,
  ``POST /posts`` (201, the post), ``POST /reactions``,
  ``GET /posts/{id}/thread`` (``order`` and ``posts``), ``POST
  /users/me/typing`` — with Mattermost's error body (``id``, ``message``,
  ``detailed_error``, ``request_id``, ``status_code``) on a refusal, and 401
  for a token it does not know.

Both record every call (verb, path, bearer token, arguments) in one
:class:`CallLog` a test may share between them and its model, so the order
of calls across vendors can be asserted. ``fail`` makes a call answer with a
vendor error, so a test can break one part (the indicator) and watch the
rest. Each runs on a thread of its own (``seats_support.loopback_http``), so
a test in-process and a ``manage.py up`` child reach it alike.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Generic, Iterator, Optional, TypeVar
from urllib.parse import parse_qsl, urlsplit

from seats_support import loopback_http, openai_completion, send_json

SLACK_BOT_ID = "B0ADABOT"
SLACK_BOT_USER = "U0ADABOT"
MATTERMOST_BOT_ID = "adabotuserid0000000000000a"


@dataclass(frozen=True)
class Call:
    """One request a vendor server answered, with its place in the log."""

    seq: int
    vendor: str
    verb: str
    path: str
    token: str
    args: dict[str, Any]


@dataclass
class CallLog:
    """Every call of the vendor servers (and whatever else a test notes), in the order they arrived."""

    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def add(self, vendor: str, verb: str, path: str, token: str, args: dict[str, Any]) -> Call:
        with self._lock:
            call = Call(next(self._seq), vendor, verb, path, token, args)
            self.calls.append(call)
            return call

    def of(self, vendor: str, path: str) -> list[Call]:
        """The calls of ``vendor`` to ``path`` (a Slack method name or a Mattermost path), oldest first."""
        with self._lock:
            return [c for c in self.calls if c.vendor == vendor and c.path == path]


def _wait(gate: Optional[threading.Event]) -> None:
    if gate is not None:
        gate.wait(timeout=60)


def _bearer(handler: BaseHTTPRequestHandler) -> str:
    scheme, _, token = (handler.headers.get("Authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _arguments(handler: BaseHTTPRequestHandler) -> dict[str, Any]:
    """The call's arguments, wherever the client put them: the query, a JSON body or a form body."""
    args: dict[str, Any] = dict(parse_qsl(urlsplit(handler.path).query))
    raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    kind = (handler.headers.get("Content-Type") or "").split(";")[0].strip()
    if raw and kind == "application/json":
        body = json.loads(raw)
        if isinstance(body, dict):
            args.update(body)
    elif raw:
        args.update(parse_qsl(raw.decode()))
    return args


class SlackWebApi:
    """Slack's Web API for the chat tools' and the indicator's methods; ``url`` is the ``api_url`` a company names."""

    def __init__(self, log: CallLog, tokens: set[str]) -> None:
        self.log = log
        self.tokens = tokens
        #: A method name -> the Slack error code it answers with instead of ``ok``.
        self.fail: dict[str, str] = {}
        #: The messages of each thread (channel, thread_ts), oldest first, as ``conversations.replies`` lists them.
        self.threads: dict[tuple[str, str], list[dict[str, Any]]] = {}
        #: Each channel's top-level messages, oldest first (``conversations.history`` lists them newest first).
        self.history: dict[str, list[dict[str, Any]]] = {}
        self._ts = itertools.count(1)
        self.url = ""
        #: While set to an unset event, every call waits for it before it is answered (a vendor that is slow).
        self.gate: Optional[threading.Event] = None

    def answer(self, verb: str, method: str, token: str, args: dict[str, Any]) -> dict[str, Any]:
        self.log.add("slack", verb, method, token, args)
        if token not in self.tokens:
            return {"ok": False, "error": "invalid_auth"}
        if method in self.fail:
            error = self.fail[method]
            extra = {"needed": "reactions:write", "provided": "chat:write"} if error == "missing_scope" else {}
            return {"ok": False, "error": error, **extra}
        if method == "chat.postMessage":
            ts = f"{1718100000 + next(self._ts)}.000100"
            message = {"type": "message", "subtype": "bot_message", "text": args.get("text", ""), "ts": ts,
                       "bot_id": SLACK_BOT_ID, "user": SLACK_BOT_USER}
            if args.get("thread_ts"):
                message["thread_ts"] = args["thread_ts"]
                self.threads.setdefault((args["channel"], args["thread_ts"]), []).append(message)
            return {"ok": True, "channel": args.get("channel"), "ts": ts, "message": message}
        if method in ("reactions.add", "reactions.remove"):
            return {"ok": True}
        if method == "conversations.replies":
            messages = self.threads.get((str(args.get("channel")), str(args.get("ts"))))
            if messages is None:
                return {"ok": False, "error": "thread_not_found"}
            return {"ok": True, "messages": messages, "has_more": False, "response_metadata": {"next_cursor": ""}}
        if method == "conversations.history":
            listed = self.history.get(str(args.get("channel")))
            if listed is None:
                return {"ok": False, "error": "channel_not_found"}
            limit = int(args.get("limit") or 100)
            newest = list(reversed(listed))
            return {"ok": True, "messages": newest[:limit], "has_more": len(newest) > limit,
                    "response_metadata": {"next_cursor": ""}}
        return {"ok": False, "error": "unknown_method"}


@contextlib.contextmanager
def slack_web_api(log: CallLog, tokens: set[str]) -> Iterator[SlackWebApi]:
    """A :class:`SlackWebApi` on loopback; its ``url`` is the Web API base (``http://127.0.0.1:<port>/api/``)."""
    api = SlackWebApi(log, tokens)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            path = urlsplit(self.path).path
            method = path[len("/api/"):] if path.startswith("/api/") else ""
            _wait(api.gate)
            send_json(self, 200, api.answer(self.command, method, _bearer(self), _arguments(self)))

        do_GET = do_POST = _serve  # noqa: N815 - http.server's naming

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        api.url = f"http://127.0.0.1:{port}/api/"
        yield api


def mattermost_error(status: int, error_id: str, message: str) -> dict[str, Any]:
    """Mattermost's error body (``model.AppError`` as the server writes it)."""
    return {"id": error_id, "message": message, "detailed_error": "", "request_id": uuid.uuid4().hex[:26],
            "status_code": status}


class MattermostApi:
    """Mattermost's REST API v4 for the chat tools' and the indicator's endpoints; ``url`` is ``surfaces.mattermost.server``."""

    def __init__(self, log: CallLog, tokens: dict[str, str], prefix: str = "") -> None:
        self.log = log
        #: A bearer token -> the user id it belongs to.
        self.tokens = tokens
        self.prefix = prefix
        #: A path (after ``/api/v4``, e.g. ``/users/me/typing``) -> the status it is refused with.
        self.fail: dict[str, int] = {}
        self.posts: dict[str, dict[str, Any]] = {}
        self.url = ""
        #: While set to an unset event, every call waits for it before it is answered (a vendor that is slow).
        self.gate: Optional[threading.Event] = None

    def add_post(self, channel_id: str, user_id: str, message: str, root_id: str = "", post_id: str = "") -> dict[str, Any]:
        now = int(time.time() * 1000) + len(self.posts)
        post = {"id": post_id or uuid.uuid4().hex[:26], "create_at": now, "update_at": now, "edit_at": 0, "delete_at": 0,
                "is_pinned": False, "user_id": user_id, "channel_id": channel_id, "root_id": root_id, "original_id": "",
                "message": message, "type": "", "props": {}, "hashtags": "", "pending_post_id": "", "reply_count": 0,
                "metadata": {}}
        self.posts[post["id"]] = post
        return post

    def answer(self, verb: str, path: str, token: str, args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.log.add("mattermost", verb, path, token, args)
        user = self.tokens.get(token)
        if user is None:
            return 401, mattermost_error(401, "api.context.session_expired.app_error", "Invalid or expired session, please login again.")
        if path in self.fail:
            status = self.fail[path]
            return status, mattermost_error(status, "api.context.permissions.app_error", "You do not have the appropriate permissions.")
        if verb == "GET" and path == "/users/me":
            return 200, {"id": user, "username": "ada-bot", "is_bot": True, "roles": "system_user"}
        if verb == "POST" and path == "/users/me/typing":
            return 200, {"status": "OK"}
        if verb == "POST" and path == "/posts":
            root = str(args.get("root_id") or "")
            if root and root not in self.posts:
                return 400, mattermost_error(400, "api.post.create_post.root_id.app_error", "Invalid RootId parameter.")
            return 201, self.add_post(str(args.get("channel_id")), user, str(args.get("message")), root)
        if verb == "POST" and path == "/reactions":
            if args.get("user_id") != user:
                return 403, mattermost_error(403, "api.context.permissions.app_error", "You do not have the appropriate permissions.")
            return 200, {"user_id": user, "post_id": args.get("post_id"), "emoji_name": args.get("emoji_name"),
                         "create_at": int(time.time() * 1000)}
        if verb == "GET" and path.startswith("/posts/") and path.endswith("/thread"):
            post = self.posts.get(path.split("/")[2])
            if post is None:
                return 404, mattermost_error(404, "app.post.get.app_error", "Unable to get the post.")
            root = post["root_id"] or post["id"]
            thread = {i: p for i, p in self.posts.items() if i == root or p["root_id"] == root}
            order = sorted(thread, key=lambda i: -thread[i]["create_at"])
            return 200, {"order": order, "posts": thread, "next_post_id": "", "prev_post_id": "", "has_next": False}
        return 404, mattermost_error(404, "api.context.404.app_error", "Sorry, we could not find the page.")


@contextlib.contextmanager
def mattermost_api(log: CallLog, tokens: dict[str, str], prefix: str = "") -> Iterator[MattermostApi]:
    """A :class:`MattermostApi` on loopback, under ``prefix`` (a server behind a sub-path) when given."""
    api = MattermostApi(log, tokens, prefix)
    base = f"{prefix}/api/v4"

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            path = urlsplit(self.path).path
            if not path.startswith(base):
                send_json(self, 404, mattermost_error(404, "api.context.404.app_error", "Sorry, we could not find the page."))
                return
            _wait(api.gate)
            send_json(self, *api.answer(self.command, path[len(base):], _bearer(self), _arguments(self)))

        do_GET = do_POST = do_DELETE = _serve  # noqa: N815 - http.server's naming

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        api.url = f"http://127.0.0.1:{port}{prefix}"
        yield api


def first(calls: list[Call], **args: Any) -> Optional[Call]:
    """The first of ``calls`` whose arguments include ``args``."""
    return next((c for c in calls if all(c.args.get(k) == v for k, v in args.items())), None)


S = TypeVar("S")


class ScriptedModel(Generic[S]):
    """An OpenAI-compatible model for a real ``up``: a trigger carrying a phrase of ``script`` gets one tool call.

    After a tool's result, or for a trigger the script does not name, it
    answers "done". Every call is logged as ("model", "chat/completions")
    with the messages, as JSON (``said``) and as sent (``messages``).
    """

    def __init__(self, log: CallLog) -> None:
        self.log = log
        #: A phrase of the trigger -> what :meth:`tool_call` answers it with.
        self.script: dict[str, S] = {}
        #: Phrases a request is refused for (HTTP 400, so the turn fails) unless a scripted phrase is in it too.
        self.failing: set[str] = set()
        self._lock = threading.Lock()

    def tool_call(self, scripted: S, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        """The call that answers a scripted trigger: (exposed tool name, arguments)."""
        raise NotImplementedError

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = body.get("messages", [])
        said = json.dumps(messages)
        self.log.add("model", "POST", "chat/completions", "", {"said": said, "messages": messages})
        with self._lock:
            scripted = next((s for phrase, s in self.script.items() if phrase in said), None)
            if scripted is None and any(phrase in said for phrase in self.failing):
                return 400, {"error": {"message": "scripted failure", "type": "invalid_request_error", "code": None}}
        message: dict[str, Any]
        if any(m.get("role") == "tool" for m in messages) or scripted is None:
            message, finish = {"role": "assistant", "content": "done"}, "stop"
        else:
            name, args = self.tool_call(scripted, messages)
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}
            finish = "tool_calls"
        return 200, openai_completion(message, finish)

    def asked(self, phrase: str) -> list[Call]:
        return [c for c in self.log.of("model", "chat/completions") if phrase in c.args["said"]]

