"""Mattermost's websocket: ``surfaces.mattermost: {mode: socket, server: https://chat.example.com, bot_token_env: MATTERMOST_BOT_TOKEN}``.

The client opens ``wss://<server>/api/v4/websocket`` (``ws://`` for an
``http://`` server), sends ``authentication_challenge`` with the bot's token
as its first action, and reads events. The server answers the challenge with
``{"status": "OK", "seq_reply": <our seq>}`` (``FAIL`` for a bad token), then
sends ``hello`` naming the connection (``data.connection_id``), then the
events, each with the connection's next ``seq``.

* ``posted`` (:data:`SOCKET_EVENTS`, the events the parser routes) is
  handed to the webhook route's edge with the frame's exact bytes; every
  other event is read and dropped here (typing, status changes, ...).
* ``seq`` continuity: every event of a connection, ``hello`` first (0),
  carries the next ``seq``. The client remembers the connection and the next
  ``seq`` it expects, and reconnects with
  ``?connection_id=<id>&sequence_number=<next>``, so the server replays from
  its queue what the socket lost and sends what came meanwhile (no new
  ``hello``). A frame with a ``seq`` already read is skipped; a ``hello``
  naming a NEW connection after a resume means the server no longer had the
  missed frames (``mattermost_socket_resume_lost``).
* A frame is counted read only once the edge put it on the broker; when the
  broker is away the session ends without it, and the resume replays it.
  Routing's dedupe on the post id keeps a frame the server sends twice from
  waking a seat twice.
* Reconnects back off exponentially (:class:`~notifications.sockets.Backoff`).
* A seat's own bot (``seats[].mattermost``) has a socket of its own. Its
  ``hello`` names the bot's user id (``broadcast.user_id``); routing knows the
  bot only by ``identities.mattermost``, so a seat that names none is told
  once which id to name (``mattermost_bot_identity_unset``).
"""
from __future__ import annotations

import json
import logging
from typing import Any, Optional
from urllib.parse import urlencode, urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidURI, WebSocketException

from crewlet.events.labels import SOCKET_EVENT_POSTED
from notifications.sockets import FrameNotTaken, SocketClient, SocketError, SocketRefused

log = logging.getLogger("crewlet.notifications.sockets.mattermost")

WEBSOCKET_PATH = "/api/v4/websocket"
AUTHENTICATION_CHALLENGE = "authentication_challenge"
HELLO = "hello"
STATUS_OK = "OK"
#: The events handed to the edge: what the Mattermost parser routes.
SOCKET_EVENTS = frozenset({SOCKET_EVENT_POSTED})


def websocket_url(server: str, connection_id: str = "", sequence_number: Optional[int] = None) -> str:
    """``wss://<host>[/<subpath>]/api/v4/websocket`` for ``server`` (``ws://`` for ``http://``), resuming when asked."""
    parts = urlsplit(server)
    scheme = "ws" if parts.scheme in ("http", "ws") else "wss"
    url = f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}{WEBSOCKET_PATH}"
    if connection_id and sequence_number is not None:
        url += "?" + urlencode({"connection_id": connection_id, "sequence_number": sequence_number})
    return url


class MattermostSocket(SocketClient):
    """One Mattermost server's websocket for the bot, feeding the edge."""

    transport = "mattermost websocket"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection_id = ""
        #: The ``seq`` the next event on this connection carries (None before the first hello).
        self.next_seq: Optional[int] = None
        self._action_seq = 0
        self._challenge_seq = 0
        self._ws: Optional[ClientConnection] = None
        self._told_identity = False

    async def serve(self) -> None:
        """Sessions until stopped: each ends in an error, a drop or a frame not taken, then a backoff."""
        while True:
            try:
                await self.session()
                why = "the server closed the socket"
            except (SocketError, WebSocketException, OSError, TimeoutError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            await self.pause(why)

    async def session(self) -> None:
        resuming = self.connection_id
        url = websocket_url(self.surface.server, self.connection_id, self.next_seq)
        try:
            ws = await connect(
                url,
                ping_interval=self.timings.ping_s,
                ping_timeout=self.timings.ping_s,
                open_timeout=self.timings.ping_s,
                # No frame limit here: a frame over the edge's limit is refused there (413) and counted read;
                # refused here, the socket would close and the resume would replay the same frame for ever.
                max_size=None,
            )
        except InvalidURI as exc:
            raise SocketError(f"surfaces.mattermost.server does not make a websocket URL: {exc}") from exc
        self._ws = ws
        try:
            self._action_seq += 1
            self._challenge_seq = self._action_seq
            await ws.send(
                json.dumps({"seq": self._challenge_seq, "action": AUTHENTICATION_CHALLENGE, "data": {"token": self.token}})
            )
            async for message in ws:
                raw = message.encode("utf-8") if isinstance(message, str) else message
                await self.frame(raw, resuming)
        finally:
            self._ws = None
            self.status.connected = False
            await ws.close()

    async def frame(self, raw: bytes, resuming: str = "") -> None:
        """One frame: an answer to our challenge, the hello, or an event (handed on when the parser routes it)."""
        self.status.frame()
        try:
            frame = json.loads(raw)
        except ValueError:
            log.warning("mattermost_socket_frame_unreadable", extra={"bytes": len(raw)})
            return
        if not isinstance(frame, dict):
            return
        if "seq_reply" in frame:
            self._reply(frame)
            return
        event, seq = frame.get("event"), frame.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            seq = None
        if event == HELLO:
            self._hello(frame, seq, resuming)
        if seq is not None and self.next_seq is not None:
            if seq < self.next_seq:
                log.debug("mattermost_socket_frame_repeated", extra={"seq": seq, "expected": self.next_seq})
                return
            if seq > self.next_seq:
                log.warning("mattermost_socket_seq_gap", extra={"expected": self.next_seq, "got": seq})
        if event in SOCKET_EVENTS:
            await self.take(raw)  # FrameNotTaken ends the session before the seq moves
        if seq is not None:
            self.next_seq = seq + 1

    def _reply(self, frame: dict[str, Any]) -> None:
        """The answer to our challenge: connected (a resumed connection sends no new hello), or refused."""
        if frame.get("seq_reply") != self._challenge_seq:
            return
        if frame.get("status") != STATUS_OK:
            found = frame.get("error")
            error: dict[str, Any] = found if isinstance(found, dict) else {}
            raise SocketRefused(f"the server refused the bot token: {error.get('id') or error.get('message') or frame.get('status')}")
        self.status.connected = True
        self.status.connects += 1
        self.backoff.reset()
        log.info(
            "surface_socket_connected",
            extra={"surface": self.surface.name, "seat": self.seat, "transport": self.transport, "resuming": bool(self.connection_id)},
        )

    def _hello(self, frame: dict[str, Any], seq: Optional[int], resuming: str) -> None:
        """A hello starts a connection's ``seq`` over (its own is 0); naming a new one after a resume, it says frames were lost."""
        found = frame.get("data")
        data: dict[str, Any] = found if isinstance(found, dict) else {}
        connection_id = str(data.get("connection_id") or "")
        if connection_id == self.connection_id:
            return
        self._check_identity(frame)
        if resuming:
            log.warning(
                "mattermost_socket_resume_lost",
                extra={
                    "surface": self.surface.name,
                    "expected_seq": self.next_seq,
                    "hint": "the server no longer had the events sent while the socket was down",
                },
            )
        self.connection_id = connection_id
        self.next_seq = seq

    def _check_identity(self, hello: dict[str, Any]) -> None:
        """A seat's bot whose seat names no ``identities.mattermost``: say, once, which user id to name."""
        found = hello.get("broadcast")
        user_id = str((found if isinstance(found, dict) else {}).get("user_id") or "")
        if not self.seat or self.identity or not user_id or self._told_identity:
            return
        self._told_identity = True
        log.warning(
            "mattermost_bot_identity_unset",
            extra={
                "seat": self.seat, "user_id": user_id,
                "hint": f"set seats.{self.seat}.identities.mattermost: {user_id}, so a DM or mention of the bot reaches "
                "the seat and the bot's own posts are known as the seat's",
            },
        )

    async def close(self) -> None:
        ws = self._ws
        if ws is not None:
            await ws.close()


#: The client :func:`notifications.sockets.client_for` makes for this kind.
CLIENT = MattermostSocket


__all__ = ["CLIENT", "AUTHENTICATION_CHALLENGE", "FrameNotTaken", "MattermostSocket", "SOCKET_EVENTS", "websocket_url"]
