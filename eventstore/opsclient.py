"""The operator's command line on a running node's own API: ``manage.py events`` and ``manage.py dlq``.

The commands talk to a node over HTTP with an operator token — the one beside
them (``up``'s default address) or a remote one (``--url``) — exactly as any
other client of ``/api/`` does, so what they show is what the API answers and
they need no database or broker of their own. ``events --follow`` reads the
latest page from ``GET /api/events`` and then the live feed over
``/ws/stream``: the socket is opened first, so an event published while the
page is read is on the socket too, and one on both is printed once (by id).

Every failure is an :class:`OpsError` whose message says what the node
answered (its ``error`` and ``reason``) or why it could not be reached — never
the token.
"""
from __future__ import annotations

import json
import os
import uuid
from argparse import ArgumentParser
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional
from urllib.parse import urlencode, urlsplit, urlunsplit

import requests
from websockets.exceptions import ConnectionClosedError, InvalidStatus, WebSocketException
from websockets.sync.client import connect

from crewlet.http.auth import OPERATOR_TOKEN_ENV
from crewlet.http.bodies import K_ERROR, K_PARAM, K_REASON
from eventstore import actions as ops
from eventstore.console import operator_views as opv
from eventstore import stream

class OpsError(Exception):
    """Why a command could not do what it was asked, in an operator's words (never the token)."""


#: Where a node beside the command listens (``up``'s default ``--addr``).
DEFAULT_URL = "http://127.0.0.1:8000"
#: How long one HTTP request or the socket's handshake may take.
REQUEST_TIMEOUT_S = 30.0
#: Rows of the latest page ``events`` prints (the API's own bounds apply).
DEFAULT_LIMIT = 20
#: The API's routes the commands call.
EVENTS_PATH = "/api/events"
DEAD_LETTERS_PATH = "/api/dead-letters"
ACT_PATH = "/operator/act"
BACKUP_PATH = "/backup"
#: How long a backup request may take: the node copies every stream and store before it answers.
BACKUP_TIMEOUT_S = 600.0
K_EVENTS = "events"
K_ID = "id"
K_SUMMARY = "summary"


@dataclass(frozen=True)
class Node:
    """A running node's base URL and the operator token its ``/api/`` takes."""

    url: str
    token: str

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise OpsError(f"--url must be an http:// or https:// URL of a node, not {self.url!r}")
        if not self.token:
            raise OpsError(f"no operator token: pass --token or set {OPERATOR_TOKEN_ENV}")

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}

    def socket_url(self) -> str:
        """``/ws/stream`` on the node: ``ws://`` for ``http://``, ``wss://`` for ``https://``."""
        parts = urlsplit(self.base)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return urlunsplit((scheme, parts.netloc, parts.path + stream.STREAM_PATH, "", ""))


def add_node_arguments(parser: ArgumentParser) -> None:
    """``--url`` and ``--token``: which node, and the operator token its ``/api/`` takes."""
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the node's base URL (default {DEFAULT_URL}: up beside this command)")
    parser.add_argument(
        "--token", default=None,
        help=f"an operator token (default: ${OPERATOR_TOKEN_ENV}); `manage.py operator_token NAME` mints one",
    )


def node_from(options: dict[str, Any], env: Mapping[str, str] = os.environ) -> Node:
    """The node the command's options name; the token from ``--token``, else the environment."""
    return Node(url=options["url"], token=options["token"] or env.get(OPERATOR_TOKEN_ENV, ""))


def _refusal(status: int, body: Any) -> str:
    """The node's error answer in one line: its status, ``error``, ``param`` and ``reason``."""
    if isinstance(body, dict) and K_REASON in body:
        param = f" ({body.get(K_PARAM)})" if body.get(K_PARAM) else ""
        return f"the node answered {status} {body.get(K_ERROR, '')}{param}: {body[K_REASON]}"
    return f"the node answered {status}"


def call(
    node: Node, method: str, path: str, *, query: Optional[dict[str, Any]] = None, body: Any = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> Any:
    """One request to the node's API; its JSON answer, or :class:`OpsError` saying what went wrong."""
    url = node.base + path + (f"?{urlencode(query, doseq=True)}" if query else "")
    try:
        response = requests.request(method, url, json=body, headers=node.headers(), timeout=timeout_s)
    except requests.RequestException as exc:
        raise OpsError(f"cannot reach the node at {node.base}: {type(exc).__name__}") from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code >= 400:
        raise OpsError(_refusal(response.status_code, answer))
    if answer is None:
        raise OpsError(f"the node answered {response.status_code} without JSON at {path}")
    return answer


# -- events ------------------------------------------------------------------------------------------


def event_line(row: dict[str, Any]) -> str:
    """One event as one line: when, what, which seat, its summary, and its trace (for ``/api/traces/<id>``)."""
    seat = row.get("seat") or "-"
    summary = " ".join(str(row.get(K_SUMMARY) or "").split())
    return f"{row.get('timestamp', '')} {row.get('type', '')} {seat} {summary} trace={row.get('trace_id') or '-'}"


def latest_events(node: Node, limit: int = DEFAULT_LIMIT, filters: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """The latest page of ``GET /api/events``, oldest first (as a terminal reads a log)."""
    answer = call(node, "GET", EVENTS_PATH, query={**(filters or {}), "limit": limit})
    return list(reversed(answer.get(K_EVENTS) or []))


def follow(node: Node, limit: int = DEFAULT_LIMIT, *, emit: Callable[[str], None], ready: Callable[[], None] = lambda: None) -> None:
    """Print the latest page, then every event the live feed carries, until the socket closes or the caller stops."""
    try:
        socket = connect(
            node.socket_url(), additional_headers={"Authorization": f"Bearer {node.token}"},
            open_timeout=REQUEST_TIMEOUT_S, max_size=None,
        )
    except InvalidStatus as exc:
        raise OpsError(f"the node refused the live feed ({exc.response.status_code}): check the operator token") from None
    except (OSError, WebSocketException, TimeoutError) as exc:
        raise OpsError(f"cannot open the live feed at {node.base}: {type(exc).__name__}") from None
    with socket:
        # Only the page's rows can come again (the feed may start before the page's newest);
        # the feed's own rows are each sent once, so the set stays the page's size.
        on_page: set[str] = set()
        for row in latest_events(node, limit):
            on_page.add(str(row.get(K_ID)))
            emit(event_line(row))
        ready()
        for row in _feed_rows(socket):
            if str(row.get(K_ID)) not in on_page:
                emit(event_line(row))


def _feed_rows(socket: Any) -> Iterator[dict[str, Any]]:
    """The feed rows of the socket's event frames (the snapshot is the page already printed)."""
    closed: Optional[ConnectionClosedError] = None
    try:
        for text in socket:
            frame = json.loads(text)
            if frame.get(stream.K_KIND) == stream.KIND_EVENT and isinstance(frame.get(stream.K_EVENT), dict):
                yield frame[stream.K_EVENT]
    except ConnectionClosedError as exc:  # closed with a code other than 1000/1001: the code says why, below
        closed = exc
    except WebSocketException as exc:
        raise OpsError(f"the live feed closed: {exc}") from None
    code = socket.close_code
    if code == stream.CLOSE_UNAUTHORIZED:
        raise OpsError("the node closed the live feed: the operator token was revoked")
    if code == stream.CLOSE_TRY_AGAIN_LATER:
        why = socket.close_reason or "no engine runs there"
        raise OpsError(f"the node has no live feed to give ({why}); try again later")
    if closed is not None:
        raise OpsError(f"the live feed closed: {closed}") from None


# -- dead letters --------------------------------------------------------------------------------------


def dead_letter_line(row: dict[str, Any]) -> str:
    """One dead letter as one line: its ref (what ``dlq replay`` takes), where it came from, and what it is."""
    summary = " ".join(str(row.get(opv.K_SUMMARY) or "").split())
    return (
        f"{row.get(opv.K_REF)} {row.get(opv.K_TOPIC)} deliveries={row.get(opv.K_DELIVERIES)} "
        f"{row.get(opv.K_TYPE)} {row.get(opv.K_EVENT_ID) or '-'} {summary}"
    ).rstrip()


def dead_letters(node: Node, limit: int = opv.DEFAULT_LIMIT) -> list[dict[str, Any]]:
    """What sits on CREWLET_DLQ, oldest first, as ``GET /api/dead-letters`` lists it."""
    return list(call(node, "GET", DEAD_LETTERS_PATH, query={opv.P_LIMIT: limit}).get(opv.K_DEAD_LETTERS) or [])


def replay(node: Node, ref: str) -> dict[str, Any]:
    """Replay one dead letter through ``/operator/act`` (audited there as one ``operator_acted``); its answer."""
    body = {opv.K_TOOL: ops.TOOL_DEAD_LETTER_REPLAY, opv.K_ARGS: {opv.K_REF: ref}, opv.K_REQUEST_ID: f"cli-{uuid.uuid4()}"}
    answer: dict[str, Any] = call(node, "POST", ACT_PATH, body=body)
    return answer


def replayed_line(ref: str, answer: dict[str, Any]) -> str:
    return f"replayed {ref} onto {answer.get(opv.K_TOPIC)} ({answer.get(opv.K_OUTCOME)}, event {answer.get(opv.K_EVENT_ID) or '-'})"


def backup(node: Node, directory: str) -> dict[str, Any]:
    """``POST /backup {dir}``: the node copies its streams and stores into ``directory`` on its disk; its answer."""
    answer: dict[str, Any] = call(node, "POST", BACKUP_PATH, body={"dir": directory}, timeout_s=BACKUP_TIMEOUT_S)
    return answer


def backed_up_line(answer: dict[str, Any]) -> str:
    streams, stores = answer.get("streams") or [], answer.get("stores") or []
    return f"backed up {len(streams)} stream{'s' if len(streams) != 1 else ''} and {len(stores)} store{'s' if len(stores) != 1 else ''} to {answer.get('dir')}"


__all__ = [
    "backup", "backed_up_line", "DEFAULT_URL", "Node", "OpsError", "add_node_arguments", "node_from", "dead_letter_line", "dead_letters", "event_line", "follow", "latest_events",
    "replay", "replayed_line",
]
