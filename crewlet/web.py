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
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine import Engine

log = logging.getLogger("crewlet.web")

#: How long requests in flight may take to finish once the server stops listening.
GRACE_S = 5.0


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


class WebServer:
    """Daphne serving ``application`` on ``host:port`` of the running loop, until :meth:`close`."""

    def __init__(self, application: Any, host: str, port: int, *, grace_s: float = GRACE_S) -> None:
        self.application = application
        self.host = host
        self.port = port
        self.grace_s = grace_s
        self.server: Any = None
        self.ports: list[Any] = []
        self.bound: Optional[tuple[str, int]] = None

    async def start(self) -> tuple[str, int]:
        """Open the listener; returns the address it bound (the real port when asked for 0)."""
        loop = asyncio.get_running_loop()
        reactor = install_reactor(loop)
        import daphne.server as dserver  # after the reactor: daphne then uses ours
        from twisted.internet.endpoints import serverFromString
        from twisted.logger import globalLogBeginner

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
        server = Server(self.application, endpoints=[_endpoint(self.host, self.port)], signal_handlers=False)
        server.connections = {}
        server.http_factory = dserver.HTTPFactory(server)
        server.ws_factory = dserver.WebSocketFactory(server, server=server.server_name)
        server.ws_factory.setProtocolOptions(
            autoPingTimeout=server.ping_timeout,
            allowNullOrigin=True,
            openHandshakeTimeout=server.websocket_handshake_timeout,
            maxMessagePayloadSize=server.websocket_max_message_size,
            maxFramePayloadSize=server.websocket_max_frame_size,
        )
        globalLogBeginner.beginLoggingTo([lambda _event: None], redirectStandardIO=False, discardBuffer=True)
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


def service(
    application: Callable[[], Any],
    host: str,
    port: int,
    on_listening: Optional[Callable[[tuple[str, int]], Awaitable[None] | None]] = None,
) -> Callable[["Engine"], Awaitable[None]]:
    """An engine service (register with ``stop_first=True``) that serves the ASGI app until cancelled.

    ``application`` is a callable returning the ASGI app, so Django's handler is
    built on the loop that serves it.
    """

    async def web_server(engine: "Engine") -> None:
        web = WebServer(application(), host, port)
        try:
            bound = await web.start()
            if on_listening is not None:
                result = on_listening(bound)
                if asyncio.iscoroutine(result):
                    await result
            await asyncio.Event().wait()
        finally:
            await web.close()

    return web_server


__all__ = ["AddressError", "GRACE_S", "WebServer", "install_reactor", "parse_addr", "service"]
