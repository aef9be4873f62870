"""The caps on the open connections of ``manage.py up``'s web server: past one a connection is shed, and each shed logged.

Each open connection costs a file descriptor (two while a large body spools
to a file), and once ``RLIMIT_NOFILE`` is spent the process can accept
nothing, not ``/healthz``, and can open nothing, not the broker or the
database. :func:`capped_factory` counts the open connections (a WebSocket's
too, after its upgrade) in total and per client address, against
``HTTP_MAX_CONNECTIONS`` and ``HTTP_MAX_CONNECTIONS_PER_CLIENT`` (by default
derived from ``RLIMIT_NOFILE`` by
:func:`crewlet.http.limits.derived_connection_caps`, leaving the descriptors
the engine needs). A connection past a cap is shed at once: a ``503`` with a
JSON reason and ``Retry-After``, then closed (closed with no answer while
:data:`~crewlet.http.limits.SHED_LINGER_MAX` shed ones still linger). Each
shed is logged as ``http_connection_shed`` by a :class:`ShedLog`: the first
of a burst at once, the rest counted into one record per
:data:`SHED_LOG_INTERVAL_S`. Behind a proxy every connection comes from the
proxy, so the per-address cap is not applied there (the proxy limits its
clients) and the total still is.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any, Callable, Optional

from crewlet.http.limits import LINGER_S, SHED_LINGER_MAX

#: The web server's records, whichever of its modules writes them, come from one logger.
log = logging.getLogger("crewlet.http.web")

#: The ``Retry-After`` (whole seconds) of a 503 for a shed connection.
SHED_RETRY_AFTER_S = 1
#: A burst of sheds is logged at its first, then at most once per this interval, with the count.
SHED_LOG_INTERVAL_S = 10.0
#: The shed record's event, and its ``reason``: which cap refused the connection.
SHED_EVENT = "http_connection_shed"
SHED_TOTAL = "total"
SHED_PER_CLIENT = "per_client"
#: A shed connection's 503 reason, per cap.
SHED_REASONS = {
    SHED_TOTAL: "the server holds its maximum of {limit} open connections; try again later",
    SHED_PER_CLIENT: "this address holds its maximum of {limit} open connections; try again later",
}


def shed_answer(reason: str, limit: int) -> bytes:
    """The whole 503 a shed connection gets: before its request is read, so in the API's one error shape."""
    from crewlet.http.bodies import PARAM_NONE, bad_request_body, error_code

    body = json.dumps(bad_request_body(error_code(503), PARAM_NONE, SHED_REASONS[reason].format(limit=limit))).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Retry-After: %d\r\nConnection: close\r\n\r\n" % (len(body), SHED_RETRY_AFTER_S)
    ) + body


class ShedLog:
    """The records of one cap's sheds: the first of a burst at once, the rest counted into at most one per interval.

    A flood of refused connections (or sockets) must show in the log without
    becoming the log. While sheds keep coming, at most one record per
    ``interval_s`` says how many there were since the previous one
    (``count``), with the latest's fields; the count of a burst that stopped
    is logged when its interval ends (on the running loop), so none is lost.
    """

    def __init__(
        self, logger: logging.Logger, event: str, interval_s: float = SHED_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._event = event
        self._interval_s = interval_s
        self._clock = clock
        self._quiet_until = -math.inf
        self._pending = 0
        self._latest: dict[str, Any] = {}
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_loop: Optional[asyncio.AbstractEventLoop] = None

    def shed(self, **fields: Any) -> None:
        """One shed, with the record's fields (``reason``, ``client``, ...)."""
        now = self._clock()
        if now >= self._quiet_until:
            count, self._pending = self._pending + 1, 0
            self._cancel_timer()
            self._emit(count, fields)
            return
        self._pending += 1
        self._latest = fields
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the next shed after the interval carries the count
            return
        if self._timer is None or self._timer_loop is not loop:  # none yet, or one on a loop that is gone
            self._cancel_timer()
            self._timer = loop.call_later(self._quiet_until - now, self.flush)
            self._timer_loop = loop

    def flush(self) -> None:
        """Log the sheds counted since the last record, if any."""
        self._timer = None
        if self._pending:
            count, self._pending = self._pending, 0
            self._emit(count, self._latest)

    def close(self) -> None:
        """The pending count logged, no timer left behind."""
        self._cancel_timer()
        self.flush()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _emit(self, count: int, fields: dict[str, Any]) -> None:
        self._quiet_until = self._clock() + self._interval_s
        self._log.warning(self._event, extra={**fields, "count": count})


def capped_factory(wrapped: Any, max_connections: int, max_per_client: int, shed_logs: dict[str, ShedLog]) -> Any:
    """``wrapped`` (the HTTP factory) behind a count of open connections: past a cap, a new one is shed.

    The count is kept by a wrapper around each connection's protocol, which
    the transport keeps for the connection's whole life — Daphne hands a
    WebSocket's upgraded connection to the wrapper's ``wrappedProtocol``, so
    a socket is counted until it closes too. A shed connection is answered a
    503 with a JSON reason and closed lingering (:data:`LINGER_S`), or, while
    :data:`SHED_LINGER_MAX` shed ones linger already, closed at once; either
    way ``shed_logs[reason]`` hears of it. ``max_per_client`` 0: no
    per-address cap.
    """
    from twisted.internet import reactor
    from twisted.internet.protocol import Protocol
    from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

    clock: Any = reactor

    answers = {SHED_TOTAL: shed_answer(SHED_TOTAL, max_connections)}
    if max_per_client:
        answers[SHED_PER_CLIENT] = shed_answer(SHED_PER_CLIENT, max_per_client)

    class Counted(ProtocolWrapper):
        """One open connection, counted under its client's address while its transport lives."""

        address = ""

    class Shed(Protocol):
        """A shed connection: its 503, a FIN, its bytes dropped, and cut after LINGER_S."""

        _abort: Any = None

        def __init__(self, owner: "CappedFactory", answer: bytes) -> None:
            self.owner = owner
            self.answer = answer

        def connectionMade(self) -> None:
            self.owner.lingering += 1
            transport: Any = self.transport
            transport.write(self.answer)
            transport.loseWriteConnection()
            self._abort = clock.callLater(LINGER_S, transport.abortConnection)

        def dataReceived(self, data: bytes) -> None:
            """Read (so the client can finish sending and then read the answer) and dropped."""

        def connectionLost(self, reason: Any = None) -> None:
            self.owner.lingering -= 1
            abort, self._abort = self._abort, None
            if abort is not None and abort.active():
                abort.cancel()

    class CappedFactory(WrappingFactory[Counted]):
        protocol = Counted

        def __init__(self) -> None:
            super().__init__(wrapped)
            self.by_address: dict[str, int] = {}
            self.lingering = 0

        def buildProtocol(self, addr: Any) -> Any:
            host = str(getattr(addr, "host", ""))
            if len(self.protocols) >= max_connections:
                return self._shed(SHED_TOTAL, max_connections, addr)
            if max_per_client and self.by_address.get(host, 0) >= max_per_client:
                return self._shed(SHED_PER_CLIENT, max_per_client, addr)
            inner = self.wrappedFactory.buildProtocol(addr)
            if inner is None:
                return None
            counted = self.protocol(self, inner)
            counted.address = host
            return counted

        def _shed(self, reason: str, limit: int, addr: Any) -> Optional[Protocol]:
            answered = self.lingering < SHED_LINGER_MAX
            shed_logs[reason].shed(
                reason=reason,
                client=f"{getattr(addr, 'host', '')}:{getattr(addr, 'port', '')}",
                limit=limit,
                open=len(self.protocols),
                answered=answered,
            )
            return Shed(self, answers[reason]) if answered else None  # None: Twisted closes the socket at once

        def registerProtocol(self, p: Any) -> None:
            super().registerProtocol(p)
            self.by_address[p.address] = self.by_address.get(p.address, 0) + 1

        def unregisterProtocol(self, p: Any) -> None:
            super().unregisterProtocol(p)
            left = self.by_address.get(p.address, 0) - 1
            if left > 0:
                self.by_address[p.address] = left
            else:
                self.by_address.pop(p.address, None)

    return CappedFactory()


__all__ = [
    "SHED_EVENT",
    "SHED_LOG_INTERVAL_S",
    "SHED_PER_CLIENT",
    "SHED_REASONS",
    "SHED_RETRY_AFTER_S",
    "SHED_TOTAL",
    "ShedLog",
    "capped_factory",
    "shed_answer",
]
