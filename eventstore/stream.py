"""``/ws/stream``: the dashboard's live socket — one ephemeral broadcast consumer per connected tab.

Design (Broadcast Streams): each tab is ONE ``subscribe_stream`` of
``crewlet.events.>`` opened here, in the process that serves the socket —
no channel layer in between. It delivers from now and acknowledges nothing,
so a slow tab misses events and holds nothing from anyone; it is closed when
the tab goes (and when the server closes the socket). Daphne serves this app
on the engine's own loop, so the consumer uses the engine's queue client
(``crewlet.engine.runtime``) directly.

The tab's stream also feeds the live projection (:mod:`eventstore.projection`):
every event is applied there first — idempotent by id, since the engine's own
stream and every other tab apply the same event — and then forwarded.

Who may connect: the same credentials as ``/api/`` — a signed-in, active
staff session, or ``Authorization: Bearer <operator token>`` in the handshake.
Anything else is refused before the accept (an HTTP 403). A session is an
ambient credential a browser sends cross-site too, so a session handshake
whose ``Origin`` is not the origin the socket was reached on — scheme, host
AND port, as the ``Host`` header and the connection's scheme give them — nor
one of ``CSRF_TRUSTED_ORIGINS``, is refused as well.

A credential is checked for as long as the socket is open, not only at the
handshake: every ``WS_CREDENTIAL_RECHECK_S`` (10 s; ``CREWLET_WS_RECHECK_S``)
the token is looked up again in the coordination store (not the verified-token
cache) and a session is loaded again with its user; a revoked token, a signed
out or deleted session, a user no longer active staff, closes the socket with
4401 (Unauthorized) and its broadcast consumer with it.

The protocol, JSON text frames (the dashboard's script depends on it exactly):

* first, ``{"kind": "snapshot", "seats": [...], "feed": [...], "counters": {...}, ...}``
  (:meth:`~eventstore.projection.LiveProjection.snapshot`);
* then per event, ``{"kind": "event", "event": <feed row or null>, "fed": bool,
  "seat": <seat row or null>, "counters": {...}}`` — ``event`` null for a type
  the feed never holds, which then carries only its seat's change, if any;
* no queue or no live projection in this process (no engine runs here), the
  broker refuses the stream, or this node already serves its maximum of live
  sockets: the socket is accepted and closed at once with
  :data:`CLOSE_TRY_AGAIN_LATER` (4013, "try again later") and a reason
  saying which.

Why 4013 and not RFC 6455's 1013: a server may send only 1000 and
3000-4999 itself (autobahn, under Daphne, refuses the rest — a 1013 ended as
1011 and an error), so "try again later" is 1013's private-range twin,
4000 + 13, beside 4401 (HTTP's 401).

How many sockets a node serves at once: each live one holds an ephemeral
JetStream consumer on ``CREWLET_EVENTS``, and the broker allows an account
1000 consumers by default (the engines' own among them), past which a tab
would get no stream at all. So a node serves at most ``WS_MAX_STREAMS``
(200; ``CREWLET_WS_MAX_STREAMS``) live sockets; one more is told to try
again later (:data:`UNAVAILABLE_FULL`), logged as ``ws_stream_shed`` once
per burst (:class:`crewlet.http.shedding.ShedLog`). In a fleet the nodes share the
account: nodes x ``WS_MAX_STREAMS`` must stay under its consumer limit.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Optional

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path

from crewlet.engine import runtime
from crewlet.events import Event
from crewlet.queue import topics
from crewlet.queue.errors import QueueError
from crewlet.http.limits import MAX_STREAMS, configured
from crewlet.http.shedding import ShedLog
from eventstore import projection

log = logging.getLogger("crewlet.eventstore.stream")

#: Where the socket is served.
STREAM_PATH = "/ws/stream"
#: The close code of a socket this node cannot serve now: RFC 6455's 1013 "Try Again Later" in the range a
#: server may send (4000 + 13; see the module's docstring).
CLOSE_TRY_AGAIN_LATER = 4013
#: Live sockets per node (each holds a broker consumer): the setting, its variable, default and range.
#: The close code of a socket whose credential was revoked while it was open (HTTP's 401, in the 4xxx range).
CLOSE_UNAUTHORIZED = 4401
#: How often an open socket's credential is checked again when the settings name no interval.
DEFAULT_RECHECK_S = 10.0

# Frame kinds and keys.
K_KIND = "kind"
KIND_SNAPSHOT = "snapshot"
KIND_EVENT = "event"
K_EVENT = "event"
K_FED = "fed"
K_SEAT = "seat"
K_COUNTERS = projection.K_COUNTERS

# Why a handshake was refused (the log's ``reason``).
REFUSED_NO_CREDENTIAL = "no credential"
REFUSED_NOT_STAFF = "session user is not active staff"
REFUSED_BAD_TOKEN = "unknown operator token"
REFUSED_BAD_AUTHORIZATION = "malformed Authorization header"
REFUSED_ORIGIN = "cross-origin session"
# Why a socket was told to try again later (its close reason, and the log's ``reason``).
UNAVAILABLE_NO_QUEUE = "no queue"
UNAVAILABLE_DISCONNECTED = "broker disconnected"
UNAVAILABLE_REFUSED = "the broker refused the stream"
UNAVAILABLE_FULL = "this node serves its maximum of live streams"
#: The record of sockets shed past ``WS_MAX_STREAMS``.
SHED_EVENT = "ws_stream_shed"
# Why an open socket was closed (the log's ``reason``).
REVOKED_TOKEN = "operator token revoked"
REVOKED_SESSION = "session signed out, or its user is no longer active staff"

BEARER = "bearer"


def snapshot_frame(live: projection.LiveProjection) -> dict[str, Any]:
    return {K_KIND: KIND_SNAPSHOT, **live.snapshot()}


def event_frame(live: projection.LiveProjection, topic: str, event: Event) -> dict[str, Any]:
    """Apply ``event`` to the projection (idempotent) and describe it for a tab."""
    applied = live.applied(topic, event)
    return {
        K_KIND: KIND_EVENT,
        K_EVENT: applied.row,
        K_FED: applied.fed,
        K_SEAT: applied.seat,
        K_COUNTERS: live.counters(),
    }


def _header(scope: dict[str, Any], name: bytes) -> Optional[str]:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin1")
    return None


def _token_name(token: str) -> Optional[str]:
    """The operator token's name when ``token`` is a live one, verified exactly as ``/api/`` verifies it."""
    from crewlet.http.auth import operator_for

    row = operator_for(token)
    return row.name if row is not None else None


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def _reached_on(scope: dict[str, Any]) -> Optional[tuple[str, str, int]]:
    """(scheme, host, port) the socket was reached on: its ``Host`` header and the connection's scheme.

    Behind a TLS-terminating proxy the connection is plain; Django's
    ``SECURE_PROXY_SSL_HEADER``, when set and sent, says it was https.
    """
    from django.conf import settings
    from django.http.request import split_domain_port

    host_header = _header(scope, b"host")
    if not host_header:
        return None
    secure = scope.get("scheme") in ("wss", "https")
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy and not secure:
        name, wanted = proxy
        meta = name[5:] if name.startswith("HTTP_") else name
        sent = _header(scope, meta.lower().replace("_", "-").encode("latin1"))
        secure = sent is not None and sent.split(",")[0].strip() == wanted
    scheme = "https" if secure else "http"
    host, port_text = split_domain_port(host_header.lower())
    if not host:
        return None
    return scheme, host, int(port_text) if port_text else _default_port(scheme)


def _origin_tuple(origin: str) -> Optional[tuple[str, str, int]]:
    from urllib.parse import urlparse

    try:
        parsed = urlparse(origin.strip().lower())
        port = parsed.port
    except ValueError:  # a port that is not a number, out of range
        return None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    hostname = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return parsed.scheme, hostname, port if port is not None else _default_port(parsed.scheme)


def _origin_allowed(scope: dict[str, Any]) -> bool:
    """No ``Origin`` (not a browser); the very origin the socket was reached on; or a trusted one.

    Same origin means scheme, host and port all equal, and the host one this
    site serves (``ALLOWED_HOSTS``); ``CSRF_TRUSTED_ORIGINS`` (exact origins)
    admits a page served from elsewhere on purpose.
    """
    from django.conf import settings
    from django.http.request import validate_host

    origin = _header(scope, b"origin")
    if origin is None:
        return True
    claimed = _origin_tuple(origin)
    if claimed is None:
        return False
    trusted = {_origin_tuple(o) for o in getattr(settings, "CSRF_TRUSTED_ORIGINS", ()) or ()}
    if claimed in trusted:
        return True
    reached = _reached_on(scope)
    if reached is None or claimed != reached:
        return False
    allowed = settings.ALLOWED_HOSTS or ([".localhost", "127.0.0.1", "[::1]"] if settings.DEBUG else [])
    return validate_host(claimed[1], allowed)


def _bearer(scope: dict[str, Any]) -> Optional[str]:
    """The ``Authorization: Bearer`` token of the handshake, or None when it carries no such header."""
    header = _header(scope, b"authorization")
    if header is None:
        return None
    parts = header.split()
    if parts and parts[0].lower() == BEARER and len(parts) == 2:
        return parts[1]
    return None


def _token_still_live(token: str) -> bool:
    """The coordination store itself, not the verified-token cache: a revocation anywhere counts at once."""
    from crewlet.base.tokens import OperatorToken

    return OperatorToken.lookup(token) is not None


async def _session_user_still_staff(session_key: Optional[str], user_pk: Any) -> bool:
    """The session, loaded afresh from its store, still signs in ``user_pk``, who is still active staff."""
    from importlib import import_module

    from channels.auth import get_user
    from django.conf import settings

    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    user = await get_user({"session": store})  # loads the session and the user in the database thread
    return bool(
        getattr(user, "is_authenticated", False)
        and user.pk == user_pk
        and getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
    )


def recheck_interval_s() -> float:
    """``settings.WS_CREDENTIAL_RECHECK_S``, else :data:`DEFAULT_RECHECK_S`."""
    from django.conf import settings

    return float(getattr(settings, "WS_CREDENTIAL_RECHECK_S", DEFAULT_RECHECK_S) or DEFAULT_RECHECK_S)


async def authenticate(scope: dict[str, Any]) -> tuple[Optional[str], str]:
    """(who, "") for an accepted credential, else (None, why refused) — ``/api/``'s rules."""
    header = _header(scope, b"authorization")
    if header is not None:
        parts = header.split()
        if parts and parts[0].lower() == BEARER:
            if len(parts) != 2 or not parts[1].isascii():
                return None, REFUSED_BAD_AUTHORIZATION
            name = await database_sync_to_async(_token_name)(parts[1])
            if name is None:
                return None, REFUSED_BAD_TOKEN
            return f"operator:{name}", ""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None, REFUSED_NO_CREDENTIAL
    if not (getattr(user, "is_active", False) and getattr(user, "is_staff", False)):
        return None, REFUSED_NOT_STAFF
    if not _origin_allowed(scope):
        return None, REFUSED_ORIGIN
    return f"staff:{user.get_username()}", ""


def max_streams() -> int:
    """``settings.WS_MAX_STREAMS`` (else ``CREWLET_WS_MAX_STREAMS``, else 200): live sockets this node serves at once."""
    return int(configured(MAX_STREAMS))


class StreamSlots:
    """The live sockets of this process, against :func:`max_streams`: a slot is taken before a socket's consumer opens.

    The count is the process's (one node), on its one loop; a slot is held
    from before the broker consumer is asked for until the socket is gone.
    """

    def __init__(self) -> None:
        self.live = 0
        self.shed_log = ShedLog(log, SHED_EVENT)

    def take(self, limit: int) -> bool:
        if self.live >= limit:
            return False
        self.live += 1
        return True

    def give(self) -> None:
        self.live = max(0, self.live - 1)


#: This process's live sockets.
SLOTS = StreamSlots()


class StreamConsumer(AsyncWebsocketConsumer):
    """One tab: its own broadcast stream, forwarded frame by frame after the snapshot."""

    who: str = ""
    _slot: bool = False
    _stream: Any = None
    _ready: bool = False
    _send_lock: Optional[asyncio.Lock] = None
    _live: Optional[projection.LiveProjection] = None
    _recheck: Optional[asyncio.Task[None]] = None
    #: The engine whose ``crewlet_ws_stream_clients`` counts this socket while it is open.
    _counted: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close_stream("server")  # the server cancelled the tab: its consumer goes too

    def _client(self) -> str:
        client = self.scope.get("client") or ("", 0)
        return f"{client[0]}:{client[1]}" if client and client[0] else ""

    async def connect(self) -> None:
        who, why = await authenticate(self.scope)
        if who is None:
            log.info("ws_stream_refused", extra={"reason": why, "client": self._client()})
            await self.close()  # before the accept: the handshake is answered 403
            return
        self.who = who
        queue = runtime.current_queue()
        if queue is None or not queue.connected:
            await self._unavailable(UNAVAILABLE_NO_QUEUE if queue is None else UNAVAILABLE_DISCONNECTED)
            return
        live = self._live = projection.current()
        if live is None:  # no engine's projection here: no company to show, rather than some other one
            await self._unavailable(runtime.NO_ENGINE)
            return
        limit = max_streams()
        if not SLOTS.take(limit):  # before the broker is asked for a consumer it may no longer have
            SLOTS.shed_log.shed(reason=UNAVAILABLE_FULL, who=who, client=self._client(), live=SLOTS.live, limit=limit)
            await self._try_again_later(UNAVAILABLE_FULL)
            return
        self._slot = True
        self._send_lock = asyncio.Lock()
        await self.accept()
        try:
            # The stream before the snapshot, so nothing falls between them; what arrives
            # before the snapshot is in it (applied first), and is not sent again.
            self._stream = await queue.subscribe_stream(topics.EVENTS_ALL, self._on_event)
        except QueueError as exc:
            await self._unavailable(UNAVAILABLE_REFUSED, accepted=True, detail=str(exc))
            return
        async with self._send_lock:
            frame = snapshot_frame(live)
            self._ready = True
            await self._send_frame(frame)
        log.info("ws_stream_connected", extra={"who": who, "client": self._client()})
        self._counted = runtime.current_engine()
        if self._counted is not None:
            self._counted.metrics.ws_clients.inc()
        self._recheck = asyncio.create_task(self._recheck_credential(recheck_interval_s()))

    async def _still_authorised(self) -> tuple[bool, str]:
        token = _bearer(self.scope)
        if token is not None:
            return await database_sync_to_async(_token_still_live)(token), REVOKED_TOKEN
        session = self.scope.get("session")
        user = self.scope.get("user")
        key = getattr(session, "session_key", None)
        return await _session_user_still_staff(key, getattr(user, "pk", None)), REVOKED_SESSION

    async def _recheck_credential(self, every_s: float) -> None:
        """Every ``every_s``, the handshake's credential again; a revoked one closes the socket with 4401."""
        while True:
            await asyncio.sleep(every_s)
            try:
                ok, why = await self._still_authorised()
            except Exception:  # the store is away for a moment: the next check decides
                log.warning("ws_stream_recheck_failed", extra={"who": self.who}, exc_info=True)
                continue
            if not ok:
                log.info("ws_stream_revoked", extra={"who": self.who, "reason": why, "client": self._client()})
                self._recheck = None  # this task ends here; closing must not cancel it under itself
                await self._close_stream("revoked", CLOSE_UNAUTHORIZED)
                await self.close(code=CLOSE_UNAUTHORIZED)
                return

    async def _unavailable(self, why: str, *, accepted: bool = False, detail: str = "") -> None:
        log.warning(
            "ws_stream_unavailable", extra={"who": self.who, "reason": why, "detail": detail, "client": self._client()}
        )
        await self._try_again_later(why, accepted=accepted)

    async def _try_again_later(self, why: str, *, accepted: bool = False) -> None:
        """Accepted (so the code reaches the client, not a 403) and closed "try again later", saying ``why``."""
        if not accepted:
            await self.accept()
        await self._close_stream("unavailable", CLOSE_TRY_AGAIN_LATER)
        await self.close(code=CLOSE_TRY_AGAIN_LATER, reason=why)

    async def _on_event(self, topic: str, event: Event) -> None:
        live = self._live
        if live is None:
            return
        frame = event_frame(live, topic, event)
        if not self._ready or self._send_lock is None:
            return  # before the snapshot: the snapshot already holds it
        async with self._send_lock:
            await self._send_frame(frame)

    async def _send_frame(self, frame: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(frame, separators=(",", ":")))

    async def disconnect(self, code: int) -> None:
        await self._close_stream("disconnect", code)

    async def _close_stream(self, why: str, code: Optional[int] = None) -> None:
        recheck, self._recheck = self._recheck, None
        if recheck is not None and recheck is not asyncio.current_task():
            recheck.cancel()
        stream, self._stream = self._stream, None
        self._ready = False
        slot, self._slot = self._slot, False
        if slot:
            SLOTS.give()
        counted, self._counted = self._counted, None
        if counted is not None:
            counted.metrics.ws_clients.dec()
        if stream is None:
            return
        try:
            await stream.close()
        except Exception:  # the queue may be closing under it; the broker reaps it within a minute anyway
            log.warning("ws_stream_close_failed", extra={"who": self.who}, exc_info=True)
        log.info("ws_stream_closed", extra={"who": self.who, "why": why, "code": code, "client": self._client()})


websocket_urlpatterns = [path(STREAM_PATH.lstrip("/"), StreamConsumer.as_asgi(), name="ws-stream")]

__all__ = [
    "CLOSE_TRY_AGAIN_LATER",
    "CLOSE_UNAUTHORIZED",
    "KIND_EVENT",
    "KIND_SNAPSHOT",
    "MAX_STREAMS",
    "SHED_EVENT",
    "SLOTS",
    "STREAM_PATH",
    "StreamConsumer",
    "StreamSlots",
    "UNAVAILABLE_DISCONNECTED",
    "UNAVAILABLE_FULL",
    "UNAVAILABLE_NO_QUEUE",
    "UNAVAILABLE_REFUSED",
    "authenticate",
    "event_frame",
    "max_streams",
    "snapshot_frame",
    "websocket_urlpatterns",
]
