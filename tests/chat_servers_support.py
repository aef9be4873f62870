"""Local vendor servers with several apps or bots at once: a company whose seats are each their own Slack app and Mattermost bot.

* :class:`SlackApps`: Slack's ``apps.connections.open`` answering each
  app-level token (``Authorization: Bearer xapp-…``) with a socket URL of that
  app, and each app's Socket Mode socket: ``hello`` naming the app
  (``connection_info.app_id``), then the envelopes sent to that app, each
  acknowledged by the client with its ``envelope_id``.
* :class:`MattermostBots`: ``/api/v4/websocket`` where each bot's token
  (``authentication_challenge``) opens that bot's own connection: ``hello``
  naming the bot's user id (``broadcast.user_id``, as Mattermost does), then
  the events sent to that bot, each with the connection's next ``seq``.

Both speak the protocols :mod:`surfaces_support` documents, one connection
per app or bot; they keep no replay queue (a test here waits for the socket
before it sends).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from seats_support import send_json
from surfaces_support import VendorSocketServer, send_frame


class SlackApps(VendorSocketServer):
    """Slack's Web API and Socket Mode for several apps: ``tokens`` maps each app-level token to its app id."""

    def __init__(self, tokens: dict[str, str]) -> None:
        super().__init__()
        self.tokens = dict(tokens)
        self.tickets: dict[str, str] = {}
        self.sockets: dict[str, ServerConnection] = {}
        #: The apps each connection opened for, in order, and the apps whose token was refused.
        self.opened: list[str] = []
        self.refused: list[str] = []
        #: envelope id -> the app whose socket acknowledged it.
        self.acks: dict[str, str] = {}
        self._ids = itertools.count(1)
        server = self

        class Api(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                app = server.tokens.get(token)
                if self.path.rstrip("/") != "/api/apps.connections.open" or app is None:
                    server.refused.append(token[:8])
                    send_json(self, 200, {"ok": False, "error": "invalid_auth"})
                    return
                ticket = uuid.uuid4().hex
                server.tickets[ticket] = app
                send_json(self, 200, {"ok": True, "url": f"ws://127.0.0.1:{server.port}/link/?ticket={ticket}&app_id={app}"})

            def log_message(self, *args: Any) -> None:
                return

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Api)
        threading.Thread(target=self.http.serve_forever, name="slack-apps-api", daemon=True).start()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/api/"

    async def _handler(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path if ws.request else "").query)
        app = self.tickets.pop((query.get("ticket") or [""])[0], None)
        if app is None:
            await ws.close(1008, "invalid ticket")
            return
        self.sockets[app] = ws
        self.opened.append(app)
        await ws.send(json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": app}}))
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                envelope_id = json.loads(message).get("envelope_id")
                if envelope_id:
                    self.acks[envelope_id] = app

    def app_connected(self, app: str) -> bool:
        ws = self.sockets.get(app)
        return ws is not None and ws.state.name == "OPEN"

    def send(self, app: str, kind: str, payload: dict[str, Any]) -> str:
        """Send an envelope on ``app``'s socket; its id."""
        envelope_id = f"env-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        envelope = {"envelope_id": envelope_id, "payload": payload, "type": kind, "accepts_response_payload": False, "retry_attempt": 0}
        assert self.call(lambda: send_frame(self.sockets.get(app), envelope)), f"{app}'s socket is not open"
        return envelope_id

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        super().close()


class MattermostBots(VendorSocketServer):
    """Mattermost's websocket for several bots: ``tokens`` maps each bot's token to its user id."""

    def __init__(self, tokens: dict[str, str]) -> None:
        super().__init__()
        self.tokens = dict(tokens)
        self.sockets: dict[str, ServerConnection] = {}
        self.seq: dict[str, int] = {}
        self.refused = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handler(self, ws: ServerConnection) -> None:
        try:
            challenge = json.loads(await ws.recv())
        except ConnectionClosed:
            return
        user = self.tokens.get((challenge.get("data") or {}).get("token", ""))
        if challenge.get("action") != "authentication_challenge" or user is None:
            self.refused += 1
            await ws.send(json.dumps({"status": "FAIL", "seq_reply": challenge.get("seq"), "error": {"id": "not_authenticated"}}))
            await ws.close()
            return
        await ws.send(json.dumps({"status": "OK", "seq_reply": challenge.get("seq")}))
        self.sockets[user], self.seq[user] = ws, 1
        await ws.send(json.dumps({
            "event": "hello", "data": {"connection_id": uuid.uuid4().hex[:26], "server_version": "9.11.0"},
            "broadcast": {"omit_users": None, "user_id": user, "channel_id": "", "team_id": ""}, "seq": 0,
        }))
        await ws.wait_closed()

    def bot_connected(self, user: str) -> bool:
        ws = self.sockets.get(user)
        return ws is not None and ws.state.name == "OPEN"

    def post(self, user: str, frame: dict[str, Any]) -> None:
        """Send an event to bot ``user``'s connection under its next ``seq``."""
        async def go() -> bool:
            event = {**frame, "seq": self.seq[user]}
            self.seq[user] += 1
            return await send_frame(self.sockets.get(user), event)

        assert self.call(go), f"{user}'s socket is not open"


__all__ = ["MattermostBots", "SlackApps"]
