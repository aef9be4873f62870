"""The ASGI server of ``manage.py up``: Daphne, on the engine's own asyncio loop.

One process, one loop: Twisted's asyncio reactor is installed on the loop the
engine already runs (before anything imports ``twisted.internet.reactor``),
then Daphne's listeners are opened on it. The reactor is never ``run()`` nor
``stop()``-ped — asyncio already runs, and stopping the reactor would stop
the engine's loop with it. So this module does by hand the part of
``daphne.server.Server.run`` that opens the listeners, and on the way out
closes them, lets the requests in flight finish for a moment and cancels what
is left.

Because the web server shares the engine's loop, a view publishes through the
engine's queue client (``crewlet.runtime.get_queue()``), with no second
connection to the broker.

What a client can make the server hold is bounded here, before any Django
code runs:

* the body — Twisted reads a whole body before the application sees a byte
  (and Daphne then queues all of it), so a body limit checked in a view comes
  too late. :class:`LimitedRequest` counts the bytes as they arrive and, the
  moment they pass the route's limit (a declared ``Content-Length`` over it
  at once), answers ``413`` with a JSON reason, half-closes, and reads what
  is still in flight only to drop it for :data:`LINGER_S` so the client sees
  the answer rather than a reset. Webhooks get the edge's limit
  (``CREWLET_WEBHOOK_MAX_BODY_BYTES``), everything else Django's
  ``DATA_UPLOAD_MAX_MEMORY_SIZE``;
* the request head — :class:`DeadlineChannel` gives a connection
  ``HTTP_HEADER_TIMEOUT_S`` to send a complete request head, counted from its
  opening or from the end of its previous response, however slowly the bytes
  trickle in; then it is closed. A body whose bytes stop for
  ``HTTP_IDLE_TIMEOUT_S`` is closed too (Twisted's idle timeout, which
  Daphne leaves at 12 hours).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional
from urllib.parse import urlsplit

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine import Engine

log = logging.getLogger("crewlet.web")

#: How long requests in flight may take to finish once the server stops listening.
GRACE_S = 5.0
#: After a 413, how long the rest of an oversized body is read (and dropped) before the connection is cut.
LINGER_S = 2.0
#: Defaults when the Django settings name none.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 30.0
DEFAULT_MAX_BODY_BYTES = 2621440
#: The webhook routes' own body limit (``/webhooks/``): the setting, and its default.
WEBHOOK_MAX_BODY_SETTING = "CREWLET_WEBHOOK_MAX_BODY_BYTES"
DEFAULT_WEBHOOK_MAX_BODY_BYTES = 1024 * 1024
REASON_TOO_LARGE = "the body is over the {limit}-byte limit"
#: An async view's attribute naming a predicate over its route's kwargs: True when a request to that
#: route needs no middleware state and no database on a request thread, so ``crewlet.asgi`` answers it
#: on the loop without Django's (sync) middleware chain.
LOOP_SAFE_ATTR = "crewlet_loop_safe"


def loop_safe(view: Any, predicate: Callable[[dict[str, Any]], bool]) -> None:
    """Mark ``view`` as answerable on the loop for the routes ``predicate`` accepts (see ``LOOP_SAFE_ATTR``)."""
    setattr(view, LOOP_SAFE_ATTR, predicate)


@dataclass(frozen=True)
class Limits:
    """What one connection may make the server hold: time for a request head, silence in a body, body bytes."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Path prefix -> its own body limit (the webhooks').
    body_limits: tuple[tuple[str, int], ...] = ()
    #: Behind a proxy that sets X-Forwarded-For/-Proto itself: the client is the one it names.
    behind_proxy: bool = False

    def body_limit(self, path: str) -> int:
        for prefix, limit in self.body_limits:
            if path.startswith(prefix):
                return limit
        return self.max_body_bytes


def webhook_max_body_bytes() -> int:
    """The webhook routes' body limit: Django setting, else the environment variable, else 1 MiB.

    The web server enforces it as the bytes arrive and the webhook edge checks
    it again on the body, so both read it here, in the core.
    """
    value: Any = None
    try:
        from django.conf import settings

        value = getattr(settings, WEBHOOK_MAX_BODY_SETTING, None)
    except Exception:  # pragma: no cover - settings not configured (a bare script)
        value = None
    if value is None:
        value = os.environ.get(WEBHOOK_MAX_BODY_SETTING) or DEFAULT_WEBHOOK_MAX_BODY_BYTES
    try:
        limit = int(value)
    except (TypeError, ValueError):
        return DEFAULT_WEBHOOK_MAX_BODY_BYTES
    return limit if limit > 0 else DEFAULT_WEBHOOK_MAX_BODY_BYTES


def limits_from_settings() -> Limits:
    """The limits the Django settings (and the webhook routes' own setting) give."""
    from django.conf import settings

    from crewlet.urls import WEBHOOKS_PREFIX

    general = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None) or DEFAULT_MAX_BODY_BYTES
    return Limits(
        header_timeout_s=float(getattr(settings, "HTTP_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)),
        idle_timeout_s=float(getattr(settings, "HTTP_IDLE_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S)),
        max_body_bytes=int(general),
        body_limits=(("/" + WEBHOOKS_PREFIX, webhook_max_body_bytes()),),
        behind_proxy=bool(getattr(settings, "SECURE_PROXY_SSL_HEADER", None)),
    )


class AddressError(ValueError):
    """A bad ``--addr``."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8000`` for IPv6) -> (host, port)."""
    host, sep, port_text = addr.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise AddressError(f"--addr={addr!r}: must be host:port, e.g. 127.0.0.1:8000")
    return host.strip("[]"), int(port_text)


def _endpoint(host: str, port: int) -> str:
    """A Twisted endpoint description (a ``:`` in an IPv6 host is escaped)."""
    kind = "tcp6" if ":" in host else "tcp"
    return f"{kind}:port={port}:interface={host.replace(':', chr(92) + ':')}"


def install_reactor(loop: asyncio.AbstractEventLoop) -> Any:
    """Twisted's asyncio reactor on ``loop`` (idempotent); refuses another reactor or another loop."""
    from twisted.internet import asyncioreactor

    existing = sys.modules.get("twisted.internet.reactor")
    if existing is None:
        asyncioreactor.install(loop)
    from twisted.internet import reactor

    if not isinstance(reactor, asyncioreactor.AsyncioSelectorReactor) or reactor._asyncioEventloop is not loop:
        raise RuntimeError("a Twisted reactor is already installed on another event loop; the web server cannot share it")
    return reactor


def too_large_body(path: str, limit: int) -> dict[str, str]:
    """The 413's body: the API's one error shape under ``/api/``, the webhooks' ``{"error": reason}`` elsewhere."""
    from crewlet.bodies import PARAM_NONE, bad_request_body, error_code
    from crewlet.errors import API_PREFIX

    reason = REASON_TOO_LARGE.format(limit=limit)
    if path.startswith(API_PREFIX):
        return bad_request_body(error_code(413), PARAM_NONE, reason)
    return {"error": reason}


def _client_of(transport: Any) -> str:
    try:
        peer = transport.getPeer()
        return f"{peer.host}:{peer.port}"
    except Exception:
        return ""


def _discard(_data: bytes) -> None:
    """A refused connection's further bytes: read (so the client can finish sending) and dropped."""


def bounded_http(limits: Limits) -> tuple[type, type]:
    """(request class, channel class): Daphne's request and Twisted's channel with ``limits`` enforced.

    Built once the reactor is installed (Daphne's modules import it).
    """
    from daphne.http_protocol import WebRequest
    from twisted.internet.protocol import connectionDone
    from twisted.python.failure import Failure
    from twisted.web import http

    class LimitedRequest(WebRequest):
        """Daphne's request, refusing a body with 413 as soon as it passes its route's limit."""

        _limit = 0
        _received = 0
        _refused = False
        _linger: Any = None

        def gotLength(self, length: Optional[int]) -> None:
            target = getattr(self.channel, "_path", b"") or b""  # the request line's target, parsed already
            path = urlsplit(target.decode("latin-1")).path
            self._limit = limits.body_limit(path)
            super().gotLength(length)
            if length is not None and length > self._limit:
                # No "100 Continue" after the refusal: the client must not start sending.
                self.requestHeaders.removeHeader(b"Expect")
                self._refuse(path, declared=length)

        def handleContentChunk(self, data: bytes) -> None:
            if self._refused:
                return
            self._received += len(data)
            if self._received > self._limit:
                target = getattr(self.channel, "_path", b"") or b""
                self._refuse(urlsplit(target.decode("latin-1")).path)
                return
            super().handleContentChunk(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
            if not self._refused:
                super().requestReceived(command, path, version)

        def _refuse(self, path: str, declared: Optional[int] = None) -> None:
            self._refused = True
            channel = self.channel
            transport = channel.transport
            body = json.dumps(too_large_body(path, self._limit)).encode()
            head = (
                b"HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            )
            log.info(
                "web_body_too_large",
                extra={
                    "path": path,
                    "limit": self._limit,
                    "declared": declared,
                    "received": self._received,
                    "client": _client_of(transport),
                },
            )
            channel.dataReceived = _discard  # nothing more of this connection is parsed or kept
            channel.setTimeout(None)
            transport.write(head + body)
            transport.loseWriteConnection()  # the answer, then FIN; reading goes on (dropping) for LINGER_S
            self._linger = channel.callLater(LINGER_S, transport.abortConnection)

        def connectionLost(self, reason: Any) -> None:
            if self._linger is not None and self._linger.active():
                self._linger.cancel()
            super().connectionLost(reason)

    class DeadlineChannel(http.HTTPChannel):
        """Twisted's HTTP/1.1 channel, with a deadline for each request head that trickled bytes do not extend."""

        _head_deadline: Any = None

        def connectionMade(self) -> None:
            super().connectionMade()
            self._arm_head_deadline()

        def _arm_head_deadline(self) -> None:
            self._disarm_head_deadline()
            self._head_deadline = self.callLater(limits.header_timeout_s, self._head_too_slow)

        def _disarm_head_deadline(self) -> None:
            deadline, self._head_deadline = self._head_deadline, None
            if deadline is not None and deadline.active():
                deadline.cancel()

        def _head_too_slow(self) -> None:
            self._head_deadline = None
            log.info(
                "web_header_timeout",
                extra={"client": _client_of(self.transport), "timeout_s": limits.header_timeout_s},
            )
            assert self.transport is not None  # the deadline is disarmed when the connection is lost
            self.transport.abortConnection()

        def allHeadersReceived(self) -> None:
            self._disarm_head_deadline()
            super().allHeadersReceived()

        def requestDone(self, request: Any) -> None:
            # Armed before the next pipelined request is parsed (inside requestDone), so that request's head disarms it.
            self._arm_head_deadline()
            super().requestDone(request)

        def connectionLost(self, reason: Failure = connectionDone) -> None:
            self._disarm_head_deadline()
            super().connectionLost(reason)

    return LimitedRequest, DeadlineChannel


class WebServer:
    """Daphne serving ``application`` on ``host:port`` of the running loop, until :meth:`close`."""

    def __init__(
        self, application: Any, host: str, port: int, *, grace_s: float = GRACE_S, limits: Optional[Limits] = None
    ) -> None:
        self.application = application
        self.host = host
        self.port = port
        self.grace_s = grace_s
        self.limits = limits if limits is not None else Limits()
        self.server: Any = None
        self.ports: list[Any] = []
        self.bound: Optional[tuple[str, int]] = None

    async def start(self) -> tuple[str, int]:
        """Open the listener; returns the address it bound (the real port when asked for 0)."""
        loop = asyncio.get_running_loop()
        reactor = install_reactor(loop)
        import daphne.server as dserver  # after the reactor: daphne then uses ours
        from twisted.internet.endpoints import serverFromString
        from twisted.logger import ILogObserver, globalLogBeginner
        from zope.interface import provider

        @provider(ILogObserver)
        def _discard_twisted_log(event: Any) -> None:
            """Twisted's own log is not ours: the server's events are logged by this module."""

        stray = getattr(dserver, "twisted_loop", None)  # the loop daphne makes at import, unused here
        if stray is not None and stray is not loop and not stray.is_closed():
            stray.close()

        owner = self

        class Server(dserver.Server):
            # Daphne's periodic checkers reschedule themselves forever; stop them with the server.
            def application_checker(self) -> None:
                if not owner.closing:
                    super().application_checker()

            def timeout_checker(self) -> None:
                if not owner.closing:
                    super().timeout_checker()

            def listen_error(self, failure: Any) -> None:  # no reactor.stop(): that would stop the engine's loop
                log.critical("web_listen_failed", extra={"error": failure.getErrorMessage()})

        self.closing = False
        proxied = (
            {"proxy_forwarded_address_header": "X-Forwarded-For", "proxy_forwarded_proto_header": "X-Forwarded-Proto"}
            if self.limits.behind_proxy
            else {}
        )
        server = Server(
            self.application, endpoints=[_endpoint(self.host, self.port)], signal_handlers=False, **proxied
        )
        server.connections = {}
        request_class, channel_class = bounded_http(self.limits)

        class HTTPFactory(dserver.HTTPFactory):
            protocol = channel_class  # plain HTTP/1.1 (no TLS here, so no ALPN to negotiate h2)

            def buildProtocol(self, addr: Any) -> Any:
                channel = super().buildProtocol(addr)
                channel.requestFactory = request_class
                return channel

        server.http_factory = HTTPFactory(server)
        server.http_factory.timeOut = self.limits.idle_timeout_s
        server.ws_factory = dserver.WebSocketFactory(server, server=server.server_name)
        server.ws_factory.setProtocolOptions(
            autoPingTimeout=server.ping_timeout,
            allowNullOrigin=True,
            openHandshakeTimeout=server.websocket_handshake_timeout,
            maxMessagePayloadSize=server.websocket_max_message_size,
            maxFramePayloadSize=server.websocket_max_frame_size,
        )
        globalLogBeginner.beginLoggingTo([_discard_twisted_log], redirectStandardIO=False, discardBuffer=True)
        self.server = server
        reactor.callLater(1, server.application_checker)
        reactor.callLater(2, server.timeout_checker)

        endpoint = serverFromString(reactor, server.endpoints[0])
        port = await _deferred(endpoint.listen(server.http_factory))
        self.ports.append(port)
        address = port.getHost()
        self.bound = (address.host, address.port)
        log.info("web_listening", extra={"host": address.host, "port": address.port})
        return self.bound

    async def close(self) -> None:
        """Stop accepting, give requests in flight ``grace_s`` to finish, cancel the rest, drop connections."""
        self.closing = True
        for port in self.ports:
            try:
                await _deferred(port.stopListening())
            except Exception:
                log.warning("web_stop_listening_failed", exc_info=True)
        self.ports.clear()
        server = self.server
        if server is None:
            return
        deadline = time.monotonic() + self.grace_s
        while _busy(server) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # polls the in-flight condition, bounded by the grace period
        pending = [
            d["application_instance"]
            for d in list(server.connections.values())
            if "application_instance" in d and not d["application_instance"].done()
        ]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for protocol in list(server.connections):
            transport = getattr(protocol, "transport", None)
            if transport is not None:
                try:
                    transport.loseConnection()
                except Exception:
                    log.debug("web_connection_close_failed", exc_info=True)
        log.info("web_stopped", extra={"cancelled": len(pending)})


def _busy(server: Any) -> bool:
    return any(
        "application_instance" in d and not d["application_instance"].done() for d in list(server.connections.values())
    )


async def _deferred(d: Any) -> Any:
    from twisted.internet import defer

    return await defer.Deferred.asFuture(d, asyncio.get_running_loop())


class WebService:
    """The web server as an engine service: listening once started, closed (in-flight requests given their grace) at stop.

    ``application`` is a callable returning the ASGI app, so Django's handler
    is built on the loop that serves it; ``on_listening`` hears the bound
    address once the listener is up.
    """

    def __init__(
        self,
        application: Callable[[], Any],
        host: str,
        port: int,
        on_listening: Optional[Callable[[tuple[str, int]], Awaitable[None] | None]] = None,
    ) -> None:
        self.application = application
        self.host = host
        self.port = port
        self.on_listening = on_listening
        self.server: Optional[WebServer] = None

    async def start(self) -> None:
        self.server = WebServer(self.application(), self.host, self.port, limits=limits_from_settings())
        bound = await self.server.start()
        if self.on_listening is not None:
            result = self.on_listening(bound)
            if asyncio.iscoroutine(result):
                await result

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            await server.close()


def service(
    application: Callable[[], Any],
    host: str,
    port: int,
    on_listening: Optional[Callable[[tuple[str, int]], Awaitable[None] | None]] = None,
) -> Callable[["Engine"], WebService]:
    """The factory of the engine's web service (register it ``stop_first``, after every other service)."""
    return lambda _engine: WebService(application, host, port, on_listening)


__all__ = [
    "AddressError",
    "GRACE_S",
    "Limits",
    "WebServer",
    "WebService",
    "bounded_http",
    "install_reactor",
    "limits_from_settings",
    "parse_addr",
    "service",
]
