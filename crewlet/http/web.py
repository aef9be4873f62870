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
engine's queue client (``crewlet.engine.runtime.get_queue()``), with no second
connection to the broker.

What a client can make the server hold is bounded before any Django code
runs, by :class:`crewlet.http.limits.Limits`: a body's bytes, a request
head's time and a body's time by the request and channel of
:func:`crewlet.http.bounded.bounded_http`, the open connections by
:func:`crewlet.http.shedding.capped_factory`.

WebSocket close frames carry the application's ``reason`` (Daphne drops it):
:func:`reasoned_websocket_protocol`.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from crewlet.http.bounded import bounded_http
from crewlet.http.limits import FDS_PER_CONNECTION, RESERVED_FDS_MIN, Limits, limits_from_settings, nofile_limit
from crewlet.http.shedding import SHED_EVENT, SHED_REASONS, ShedLog, capped_factory

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.http.web")

#: How long requests in flight may take to finish once the server stops listening.
GRACE_S = 5.0
#: The longest reason a WebSocket close frame carries (RFC 6455: 125 payload bytes, 2 of them the code).
CLOSE_REASON_MAX_BYTES = 123
#: An async view's attribute naming a predicate over its route's kwargs: True when a request to that
#: route needs no middleware state and no database on a request thread, so ``crewlet.asgi`` answers it
#: on the loop without Django's (sync) middleware chain.
LOOP_SAFE_ATTR = "crewlet_loop_safe"


def loop_safe(view: Any, predicate: Callable[[dict[str, Any]], bool]) -> None:
    """Mark ``view`` as answerable on the loop for the routes ``predicate`` accepts (see ``LOOP_SAFE_ATTR``)."""
    setattr(view, LOOP_SAFE_ATTR, predicate)


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


def close_reason(reason: Optional[str]) -> Optional[str]:
    """``reason`` cut to what a close frame carries (whole characters), or None for none."""
    if not reason:
        return None
    return reason.encode("utf-8")[:CLOSE_REASON_MAX_BYTES].decode("utf-8", errors="ignore")


def reasoned_websocket_protocol() -> type:
    """Daphne's WebSocket protocol, whose close frame carries the application's ``reason``.

    ASGI's ``websocket.close`` has a ``reason``; Daphne drops it, so a client
    would learn only the code. This one sends it (cut to
    :data:`CLOSE_REASON_MAX_BYTES`). Built once the reactor is installed.
    """
    from daphne.ws_protocol import WebSocketProtocol

    class ReasonedWebSocketProtocol(WebSocketProtocol):
        def handle_reply(self, message: dict[str, Any]) -> None:
            if message.get("type") == "websocket.close" and self.state != self.STATE_CONNECTING:
                self.serverClose(code=message.get("code"), reason=message.get("reason"))
                return
            super().handle_reply(message)

        def serverClose(self, code: Optional[int] = None, reason: Optional[str] = None) -> None:
            self.sendClose(code=1000 if code is None else code, reason=close_reason(reason))

    return ReasonedWebSocketProtocol


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
        #: The records of connections shed past each cap (see :func:`capped_factory`).
        self.shed_logs = {reason: ShedLog(log, SHED_EVENT) for reason in SHED_REASONS}

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
        server.ws_factory.protocol = reasoned_websocket_protocol()
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

        nofile = nofile_limit()
        total, per_client = self.limits.connection_caps(nofile)
        log.info(
            "web_connection_caps",
            extra={
                "max_connections": total,
                "max_connections_per_client": per_client,
                "nofile": nofile,
                "body_timeout_s": self.limits.body_timeout_s,
            },
        )
        if total * FDS_PER_CONNECTION + RESERVED_FDS_MIN > nofile:
            log.warning(
                "web_connection_cap_over_nofile",
                extra={"max_connections": total, "nofile": nofile, "fds_per_connection": FDS_PER_CONNECTION},
            )
        endpoint = serverFromString(reactor, server.endpoints[0])
        port = await _deferred(endpoint.listen(capped_factory(server.http_factory, total, per_client, self.shed_logs)))
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
        for shed_log in self.shed_logs.values():
            shed_log.close()
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
    "CLOSE_REASON_MAX_BYTES",
    "GRACE_S",
    "LOOP_SAFE_ATTR",
    "WebServer",
    "WebService",
    "close_reason",
    "install_reactor",
    "loop_safe",
    "parse_addr",
    "reasoned_websocket_protocol",
    "service",
]
