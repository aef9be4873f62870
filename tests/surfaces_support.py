"""Local servers that speak the vendors' socket protocols as documented, for the socket clients' tests.

* :class:`SlackServer`: Slack's Web API method ``apps.connections.open``
  (POST, ``Authorization: Bearer <app token>``) answering
  ``{"ok": true, "url": "ws://.../link/?ticket=..."}``, and that socket: a
  ``hello``, then envelopes (``events_api``, ``slash_commands``,
  ``interactive``) that the client acknowledges with
  ``{"envelope_id": ..., "payload"?: ...}``. An envelope not acknowledged is
  sent again on the next connection with ``retry_attempt`` + 1, as Slack retries.
* :class:`MattermostServer`: ``/api/v4/websocket``: the client's first action
  must be ``authentication_challenge`` with the bot token (answered
  ``{"status": "OK", "seq_reply": n}``); a new connection's first event is
  ``hello`` (``seq`` 0, ``data.connection_id``); every event carries the
  connection's next ``seq``; a reconnect with ``connection_id`` and
  ``sequence_number`` gets the events from that ``seq`` on (no new hello),
  as the server's dead queue replays them.

Each runs on its own thread and loop, so a test in-process and a ``manage.py
up`` child reach it alike; every method is safe to call from the test.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Awaitable, Callable, Optional, TypeVar
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.browser_support import LoopThread
from notifications_support import ADA_MM_ID
from seats_support import send_json

T = TypeVar("T")

SLACK_APP_TOKEN = "xapp-1-A111-test-app-token"
MATTERMOST_BOT_TOKEN = "mm-bot-token-for-tests"


async def send_frame(ws: Optional[ServerConnection], frame: dict[str, Any]) -> bool:
    """Send ``frame`` as JSON on ``ws``; False when there is no open socket or the send failed."""
    if ws is None or ws.state.name != "OPEN":
        return False
    try:
        await ws.send(json.dumps(frame))
    except Exception:
        return False
    return True


class VendorSocketServer:
    """What both vendors' servers share: the loop thread, the websocket server, the open socket and dropping it."""

    def __init__(self) -> None:
        self.thread = LoopThread()
        self.ws: Optional[ServerConnection] = None
        #: Sockets open now, and the most ever open at once (a fleet must open each vendor socket once).
        self.open = 0
        self.most_open = 0
        self.server: Server = self.call(lambda: serve(self._counted, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.sessions: list[dict[str, Any]] = []

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the server's loop and wait for it."""
        async def run() -> T:
            return await make()

        return self.thread.run(run(), timeout_s=10.0)

    async def _counted(self, ws: ServerConnection) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await self._handler(ws)
        finally:
            self.open -= 1

    async def _handler(self, ws: ServerConnection) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        """Cut the open socket without a close frame (a laptop's Wi-Fi going away)."""

        async def cut() -> None:
            if self.ws is not None:
                self.ws.transport.abort()

        self.call(cut)

    def connected(self) -> bool:
        ws = self.ws
        return ws is not None and ws.state.name == "OPEN"

    async def _send(self, frame: dict[str, Any]) -> bool:
        return await send_frame(self.ws, frame)

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            await self.server.wait_closed()

        self.call(shut)
        self.thread.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SlackServer(VendorSocketServer):
    """Slack's ``apps.connections.open`` and Socket Mode socket."""

    def __init__(self, app_token: str = SLACK_APP_TOKEN) -> None:
        super().__init__()
        self.app_token = app_token
        self.opens = 0
        self.tickets: set[str] = set()
        #: envelope id -> the envelope, until acknowledged; in the order sent.
        self.pending: dict[str, dict[str, Any]] = {}
        #: envelope id -> the ack's payload (None when it carried none), in the order acknowledged.
        self.acks: dict[str, Optional[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        server = self

        class Api(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if self.path.rstrip("/") != "/api/apps.connections.open":
                    return self._answer({"ok": False, "error": "unknown_method"})
                if self.headers.get("Authorization", "") != f"Bearer {server.app_token}":
                    return self._answer({"ok": False, "error": "invalid_auth"})
                server.opens += 1
                ticket = uuid.uuid4().hex
                server.tickets.add(ticket)
                self._answer({"ok": True, "url": f"ws://127.0.0.1:{server.port}/link/?ticket={ticket}&app_id=A111"})

            def _answer(self, body: dict[str, Any]) -> None:
                send_json(self, 200, body)  # the Web API answers 200 and says ok: false in the body

            def log_message(self, *args: Any) -> None:
                return

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Api)
        self.http_thread = threading.Thread(target=self.http.serve_forever, name="slack-api", daemon=True)
        self.http_thread.start()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/api/"

    async def _handler(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path if ws.request else "").query)
        ticket = (query.get("ticket") or [""])[0]
        if ticket not in self.tickets:
            await ws.close(1008, "invalid ticket")
            return
        self.tickets.discard(ticket)
        self.ws = ws
        self.sessions.append({"ticket": ticket})
        await ws.send(json.dumps({
            "type": "hello", "num_connections": 1,
            "debug_info": {"host": "applink-test", "build_number": 1, "approximate_connection_time": 18060},
            "connection_info": {"app_id": "A111"},
        }))
        for envelope in list(self.pending.values()):  # Slack retries what was not acknowledged
            if envelope.pop("_sent", False):
                envelope["retry_attempt"] += 1
                envelope["retry_reason"] = "timeout"
            if await self._send(_wire(envelope)):
                envelope["_sent"] = True
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                ack = json.loads(message)
                envelope_id = ack.get("envelope_id")
                if envelope_id in self.pending:
                    self.pending.pop(envelope_id)
                    self.acks[envelope_id] = ack.get("payload")

    def send(self, kind: str, payload: dict[str, Any], *, accepts_response_payload: bool = False) -> str:
        """Send an envelope now (or on the next connection); its id."""
        envelope_id = f"env-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        envelope = {
            "envelope_id": envelope_id, "payload": payload, "type": kind,
            "accepts_response_payload": accepts_response_payload, "retry_attempt": 0, "retry_reason": "",
        }

        async def go() -> None:
            self.pending[envelope_id] = envelope
            if await self._send(_wire(envelope)):
                envelope["_sent"] = True

        self.call(go)
        return envelope_id

    def resend(self, envelope_id: str) -> None:
        """Send an envelope again on the open socket, as Slack's retry does (acknowledged or not)."""
        async def go() -> None:
            envelope = self.pending.get(envelope_id)
            if envelope is None:
                return
            envelope["retry_attempt"] += 1
            envelope["retry_reason"] = "timeout"
            await self._send(_wire(envelope))

        self.call(go)

    def redeliver_acked(self, envelope_id: str, kind: str, payload: dict[str, Any]) -> None:
        """Slack delivering the same event once more under the same id though it was acknowledged (its at-least-once)."""
        async def go() -> None:
            self.pending[envelope_id] = {
                "envelope_id": envelope_id, "payload": payload, "type": kind,
                "accepts_response_payload": False, "retry_attempt": 1, "retry_reason": "timeout",
            }
            self.acks.pop(envelope_id, None)
            await self._send(_wire(self.pending[envelope_id]))

        self.call(go)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        super().close()


def _wire(envelope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in envelope.items() if not k.startswith("_")}


class MattermostServer(VendorSocketServer):
    """Mattermost's ``/api/v4/websocket`` for one bot user."""

    def __init__(self, token: str = MATTERMOST_BOT_TOKEN) -> None:
        super().__init__()
        self.token = token
        self.connection_id = ""
        #: The connection's events by ``seq`` (its dead queue and what waits to be sent).
        self.events: list[dict[str, Any]] = []
        self.refused = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handler(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path if ws.request else "").query)
        try:
            challenge = json.loads(await ws.recv())
        except ConnectionClosed:
            return
        data = challenge.get("data") or {}
        if challenge.get("action") != "authentication_challenge" or data.get("token") != self.token:
            self.refused += 1
            await ws.send(json.dumps({
                "status": "FAIL", "seq_reply": challenge.get("seq"),
                "error": {"id": "api.web_socket_router.not_authenticated.app_error", "message": "not authenticated"},
            }))
            await ws.close()
            return
        await ws.send(json.dumps({"status": "OK", "seq_reply": challenge.get("seq")}))
        asked_id = (query.get("connection_id") or [""])[0]
        asked_seq = int((query.get("sequence_number") or ["-1"])[0])
        resumed = bool(asked_id) and asked_id == self.connection_id and 0 <= asked_seq <= len(self.events)
        if resumed:
            start = asked_seq
        else:
            self.connection_id, start = uuid.uuid4().hex[:26], 0
            self.events = [{
                "event": "hello", "data": {"connection_id": self.connection_id, "server_version": "9.11.0"},
                "broadcast": {"omit_users": None, "user_id": "bot", "channel_id": "", "team_id": ""}, "seq": 0,
            }]
        self.ws = ws
        self.sessions.append({"resumed": resumed, "from_seq": start, "query": {k: v[0] for k, v in query.items()}})
        for event in self.events[start:]:
            await ws.send(json.dumps(event))
        await ws.wait_closed()

    def post(self, frame: dict[str, Any]) -> int:
        """Queue an event for the connection (sent now when the socket is open); its ``seq``."""
        async def go() -> int:
            event = {**frame, "seq": len(self.events)}
            self.events.append(event)
            await self._send(event)
            return int(event["seq"])

        return self.call(go)

    def resend(self, seq: int) -> None:
        """Send an event already sent again under its own ``seq``."""
        self.call(lambda: self._send(self.events[seq]))

    def forget(self) -> None:
        """The server lost the connection's queue (a restart): the next connect is a new connection."""
        async def go() -> None:
            self.connection_id = ""

        self.call(go)


def mm_posted(post_id: str, message: str, *, channel: str = "chan1", user: str = "user-w222", mentions: tuple[str, ...] = (ADA_MM_ID,)) -> dict[str, Any]:
    """A ``posted`` event as Mattermost's websocket sends it (``data.post`` a JSON string)."""
    post = {
        "id": post_id, "create_at": 1718000000000, "update_at": 1718000000000, "edit_at": 0, "delete_at": 0,
        "user_id": user, "channel_id": channel, "root_id": "", "message": message, "type": "", "props": {},
    }
    return {
        "event": "posted",
        "data": {"channel_display_name": "Town", "channel_name": "town", "channel_type": "O", "post": json.dumps(post),
                 "sender_name": "@someone", "team_id": "team1", "mentions": json.dumps(list(mentions))},
        "broadcast": {"omit_users": None, "user_id": "", "channel_id": channel, "team_id": ""},
    }


__all__ = ["mm_posted", "MATTERMOST_BOT_TOKEN", "MattermostServer", "SLACK_APP_TOKEN", "SlackServer"]
