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
  Daphne leaves at 12 hours);
* the body's whole duration — Twisted's idle timer starts again at every
  byte, so a body trickled a byte at a time would be held for good: the same
  channel gives a body ``HTTP_BODY_TIMEOUT_S`` from the end of its head, then
  answers ``408`` with a JSON reason and closes (lingering like the 413);
* the connections themselves — each open one costs a file descriptor (two
  while a large body spools to a file), and once ``RLIMIT_NOFILE`` is spent
  the process can accept nothing, not ``/healthz``, and can open nothing, not
  the broker or the database. :func:`capped_factory` counts the open
  connections (a WebSocket's too, after its upgrade) in total and per client
  address, against ``HTTP_MAX_CONNECTIONS`` and
  ``HTTP_MAX_CONNECTIONS_PER_CLIENT`` (by default derived from
  ``RLIMIT_NOFILE`` by :func:`derived_connection_caps`, leaving the
  descriptors the engine needs). A connection past a cap is shed at once: a
  ``503`` with a JSON reason and ``Retry-After``, then closed (closed with no
  answer while :data:`SHED_LINGER_MAX` shed ones still linger). Each shed is
  logged as ``http_connection_shed`` by a :class:`ShedLog`: the first of a
  burst at once, the rest counted into one record per
  :data:`SHED_LOG_INTERVAL_S`. Behind a proxy every connection comes from the
  proxy, so the per-address cap is not applied there (the proxy limits its
  clients) and the total still is.

WebSocket close frames carry the application's ``reason`` (Daphne drops it):
:func:`reasoned_websocket_protocol`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from io import BytesIO
from typing import IO, TYPE_CHECKING, Any, Awaitable, Callable, Optional
from urllib.parse import urlsplit

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.http.web")

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
#: Where the URLconf mounts the webhook routes, whose bodies this server gives the webhook limit.
WEBHOOKS_PREFIX = "webhooks/"
DEFAULT_WEBHOOK_MAX_BODY_BYTES = 1024 * 1024
REASON_TOO_LARGE = "the body is over the {limit}-byte limit"
DEFAULT_BODY_TIMEOUT_S = 60.0
#: A 408's ``error`` code and reason: the body did not finish in time.
ERROR_BODY_TIMEOUT = "request_timeout"
REASON_BODY_TOO_SLOW = "the body did not arrive within {timeout_s:g} s of its request head"
#: A body of unknown length, or declared this long or longer, is kept in memory up to this many bytes and
#: only then spooled to a file (Twisted's own threshold), so a declared length alone costs no descriptor.
SPOOL_MAX_BYTES = 100000

#: What one open connection may cost in file descriptors: its socket, and the file a large body spools to.
FDS_PER_CONNECTION = 2
#: Descriptors the derived caps leave to the engine (broker, databases, logs, /healthz's own work):
#: a quarter of ``RLIMIT_NOFILE``, and never fewer than this.
RESERVED_FDS_MIN = 128
#: A derived total never goes below this, however small ``RLIMIT_NOFILE`` is.
CONNECTIONS_MIN = 8
#: A client address's derived share of the total (an eighth of it), within [PER_CLIENT_MIN, PER_CLIENT_MAX].
PER_CLIENT_SHARE = 8
PER_CLIENT_MIN = 4
PER_CLIENT_MAX = 256
#: How many shed connections may linger at once (answered 503, reading what the client still sends);
#: past it a shed connection is closed with no answer, so shedding itself holds a bounded number of descriptors.
SHED_LINGER_MAX = 16
#: The ``Retry-After`` (whole seconds) of a 503 for a shed connection.
SHED_RETRY_AFTER_S = 1
#: A burst of sheds is logged at its first, then at most once per this interval, with the count.
SHED_LOG_INTERVAL_S = 10.0
#: ``RLIMIT_NOFILE`` when it is unlimited, for deriving the caps.
NOFILE_UNLIMITED = 1 << 20
#: The shed record's event, and its ``reason``: which cap refused the connection.
SHED_EVENT = "http_connection_shed"
SHED_TOTAL = "total"
SHED_PER_CLIENT = "per_client"
#: A shed connection's 503 reason, per cap.
SHED_REASONS = {
    SHED_TOTAL: "the server holds its maximum of {limit} open connections; try again later",
    SHED_PER_CLIENT: "this address holds its maximum of {limit} open connections; try again later",
}
#: The longest reason a WebSocket close frame carries (RFC 6455: 125 payload bytes, 2 of them the code).
CLOSE_REASON_MAX_BYTES = 123
#: An async view's attribute naming a predicate over its route's kwargs: True when a request to that
#: route needs no middleware state and no database on a request thread, so ``crewlet.asgi`` answers it
#: on the loop without Django's (sync) middleware chain.
LOOP_SAFE_ATTR = "crewlet_loop_safe"


def loop_safe(view: Any, predicate: Callable[[dict[str, Any]], bool]) -> None:
    """Mark ``view`` as answerable on the loop for the routes ``predicate`` accepts (see ``LOOP_SAFE_ATTR``)."""
    setattr(view, LOOP_SAFE_ATTR, predicate)


@dataclass(frozen=True)
class Setting:
    """A number the web server reads: its Django setting, the environment variable it comes from, default and range."""

    name: str
    env: str
    default: float
    low: float
    high: float
    #: A count: a fraction is refused, never cut.
    integer: bool = False


#: A body's whole time, from the end of its head.
BODY_TIMEOUT = Setting("HTTP_BODY_TIMEOUT_S", "CREWLET_HTTP_BODY_TIMEOUT_S", DEFAULT_BODY_TIMEOUT_S, 0.1, 3600.0)
#: Open connections in total, and per client address; 0: derived from ``RLIMIT_NOFILE``.
MAX_CONNECTIONS = Setting("HTTP_MAX_CONNECTIONS", "CREWLET_HTTP_MAX_CONNECTIONS", 0, 0, 1_000_000, integer=True)
MAX_CONNECTIONS_PER_CLIENT = Setting(
    "HTTP_MAX_CONNECTIONS_PER_CLIENT", "CREWLET_HTTP_MAX_CONNECTIONS_PER_CLIENT", 0, 0, 1_000_000, integer=True
)
#: Live ``/ws/stream`` sockets one node serves (each holds a broker consumer; eventstore.stream sheds past it).
MAX_STREAMS = Setting("WS_MAX_STREAMS", "CREWLET_WS_MAX_STREAMS", 200, 1, 100_000, integer=True)


def configured(setting: Setting) -> float:
    """``setting``'s value: the Django setting, else its environment variable, else its default.

    The environment is read here too so a setting works before
    ``crewlet/settings.py`` names it; a value that is not a number in the
    setting's range is logged and the default used, so a typo cannot take the
    web server down.
    """
    value: Any = None
    try:
        from django.conf import settings

        value = getattr(settings, setting.name, None)
    except Exception:  # pragma: no cover - settings not configured (a bare script)
        value = None
    if value is None:
        value = os.environ.get(setting.env, "").strip() or None
    if value is None:
        return setting.default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    whole = not setting.integer or number.is_integer()
    if not (setting.low <= number <= setting.high and whole):  # NaN and infinities fail this too
        log.warning(
            "web_setting_invalid",
            extra={"setting": setting.env, "value": str(value), "low": setting.low, "high": setting.high,
                   "default": setting.default},
        )
        return setting.default
    return number


def nofile_limit() -> int:
    """This process's soft ``RLIMIT_NOFILE`` (:data:`NOFILE_UNLIMITED` when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NOFILE_UNLIMITED if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def derived_connection_caps(nofile: int) -> tuple[int, int]:
    """(total, per client address) for a process allowed ``nofile`` descriptors.

    A quarter of them (at least :data:`RESERVED_FDS_MIN`) and the lingering
    sheds' are left to the engine — the broker connection, the databases, the
    logs — so the server's clients cannot starve it; the rest is divided by
    what a connection may cost (:data:`FDS_PER_CONNECTION`). One address gets
    an eighth of the total (within [:data:`PER_CLIENT_MIN`,
    :data:`PER_CLIENT_MAX`]), so one client cannot take every connection a
    webhook or ``/healthz`` needs.
    """
    reserve = max(RESERVED_FDS_MIN, nofile // 4)
    total = max(CONNECTIONS_MIN, (nofile - reserve - SHED_LINGER_MAX) // FDS_PER_CONNECTION)
    per_client = min(total, PER_CLIENT_MAX, max(PER_CLIENT_MIN, total // PER_CLIENT_SHARE))
    return total, per_client


@dataclass(frozen=True)
class Limits:
    """What one connection may make the server hold: time for a request head and a body, silence in a body, body bytes;
    and how many connections may be open, in total and per client address."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Path prefix -> its own body limit (the webhooks').
    body_limits: tuple[tuple[str, int], ...] = ()
    #: Behind a proxy that sets X-Forwarded-For/-Proto itself: the client is the one it names.
    behind_proxy: bool = False
    #: Open connections in total and per client address; None: derived from ``RLIMIT_NOFILE`` when the server starts.
    max_connections: Optional[int] = None
    max_connections_per_client: Optional[int] = None

    def body_limit(self, path: str) -> int:
        for prefix, limit in self.body_limits:
            if path.startswith(prefix):
                return limit
        return self.max_body_bytes

    def connection_caps(self, nofile: int) -> tuple[int, int]:
        """(total, per client address; 0 = none) for a process allowed ``nofile`` descriptors.

        Behind a proxy every connection comes from the proxy, so the derived
        per-address cap is not applied there (the proxy limits its clients);
        one set explicitly still is.
        """
        total, per_client = derived_connection_caps(nofile)
        if self.max_connections is not None:
            total = self.max_connections
        if self.max_connections_per_client is not None:
            per_client = self.max_connections_per_client
        elif self.behind_proxy:
            per_client = 0
        return total, min(per_client, total)


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

    general = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None) or DEFAULT_MAX_BODY_BYTES
    total = int(configured(MAX_CONNECTIONS))
    per_client = int(configured(MAX_CONNECTIONS_PER_CLIENT))
    return Limits(
        header_timeout_s=float(getattr(settings, "HTTP_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)),
        idle_timeout_s=float(getattr(settings, "HTTP_IDLE_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S)),
        body_timeout_s=configured(BODY_TIMEOUT),
        max_body_bytes=int(general),
        body_limits=(("/" + WEBHOOKS_PREFIX, webhook_max_body_bytes()),),
        behind_proxy=bool(getattr(settings, "SECURE_PROXY_SSL_HEADER", None)),
        max_connections=total or None,
        max_connections_per_client=per_client or None,
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


def refusal_body(path: str, error: str, reason: str) -> dict[str, str]:
    """A refusal's body: the API's one error shape under ``/api/``, the webhooks' ``{"error": reason}`` elsewhere."""
    from crewlet.http.bodies import PARAM_NONE, bad_request_body
    from crewlet.http.errors import API_PREFIX

    if path.startswith(API_PREFIX):
        return bad_request_body(error, PARAM_NONE, reason)
    return {"error": reason}


def too_large_body(path: str, limit: int) -> dict[str, str]:
    """The 413's body (:func:`refusal_body`)."""
    from crewlet.http.bodies import error_code

    return refusal_body(path, error_code(413), REASON_TOO_LARGE.format(limit=limit))


def shed_answer(reason: str, limit: int) -> bytes:
    """The whole 503 a shed connection gets: before its request is read, so in the API's one error shape."""
    from crewlet.http.bodies import PARAM_NONE, bad_request_body, error_code

    body = json.dumps(bad_request_body(error_code(503), PARAM_NONE, SHED_REASONS[reason].format(limit=limit))).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Retry-After: %d\r\nConnection: close\r\n\r\n" % (len(body), SHED_RETRY_AFTER_S)
    ) + body


def close_reason(reason: Optional[str]) -> Optional[str]:
    """``reason`` cut to what a close frame carries (whole characters), or None for none."""
    if not reason:
        return None
    return reason.encode("utf-8")[:CLOSE_REASON_MAX_BYTES].decode("utf-8", errors="ignore")


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


def _client_of(transport: Any) -> str:
    try:
        peer = transport.getPeer()
        return f"{peer.host}:{peer.port}"
    except Exception:
        return ""


def _discard(_data: bytes) -> None:
    """A refused connection's further bytes: read (so the client can finish sending) and dropped."""


def _answer_and_linger(channel: Any, status: bytes, body: dict[str, str]) -> Any:
    """Answer ``status`` with the JSON ``body`` and close, so the client reads the answer rather than a reset.

    Nothing more of the connection is parsed or kept: its further bytes are
    read only to be dropped, the answer goes out followed by a FIN, and the
    connection is cut after :data:`LINGER_S` (the returned call; cancel it
    when the connection is lost first).
    """
    transport = channel.transport
    payload = json.dumps(body).encode()
    head = (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % (status, len(payload))
    )
    channel.dataReceived = _discard
    channel.setTimeout(None)
    disarm = getattr(channel, "_disarm_deadlines", None)
    if disarm is not None:
        disarm()
    transport.write(head + payload)
    transport.loseWriteConnection()
    return channel.callLater(LINGER_S, transport.abortConnection)


def _target_path(channel: Any) -> str:
    """The path of the request line the channel is parsing (before its body is complete)."""
    target = getattr(channel, "_path", b"") or b""
    return urlsplit(target.decode("latin-1")).path


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
            path = _target_path(self.channel)  # the request line's target, parsed already
            self._limit = limits.body_limit(path)
            # In memory up to SPOOL_MAX_BYTES, then a file: a trickled body costs no descriptor until it is large.
            content: IO[bytes] = (
                BytesIO() if length is not None and length < SPOOL_MAX_BYTES
                else tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES)
            )
            self.content = content
            if length is not None and length > self._limit:
                # No "100 Continue" after the refusal: the client must not start sending.
                self.requestHeaders.removeHeader(b"Expect")
                self._refuse(path, declared=length)

        def handleContentChunk(self, data: bytes) -> None:
            if self._refused:
                return
            self._received += len(data)
            if self._received > self._limit:
                self._refuse(_target_path(self.channel))
                return
            super().handleContentChunk(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
            if not self._refused:
                super().requestReceived(command, path, version)

        def _refuse(self, path: str, declared: Optional[int] = None) -> None:
            self._refused = True
            channel = self.channel
            log.info(
                "web_body_too_large",
                extra={
                    "path": path,
                    "limit": self._limit,
                    "declared": declared,
                    "received": self._received,
                    "client": _client_of(channel.transport),
                },
            )
            self._linger = _answer_and_linger(channel, b"413 Content Too Large", too_large_body(path, self._limit))

        def connectionLost(self, reason: Any) -> None:
            if self._linger is not None and self._linger.active():
                self._linger.cancel()
            super().connectionLost(reason)

    class DeadlineChannel(http.HTTPChannel):
        """Twisted's HTTP/1.1 channel, with a deadline for each request head and each body that trickled bytes do not extend."""

        _head_deadline: Any = None
        _body_deadline: Any = None
        _linger: Any = None

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

        def _disarm_body_deadline(self) -> None:
            deadline, self._body_deadline = self._body_deadline, None
            if deadline is not None and deadline.active():
                deadline.cancel()

        def _disarm_deadlines(self) -> None:
            self._disarm_head_deadline()
            self._disarm_body_deadline()

        def _body_too_slow(self) -> None:
            self._body_deadline = None
            path = _target_path(self)
            request = self.requests[-1] if self.requests else None
            log.info(
                "web_body_timeout",
                extra={
                    "client": _client_of(self.transport),
                    "path": path,
                    "timeout_s": limits.body_timeout_s,
                    "received": getattr(request, "_received", None),
                },
            )
            reason = REASON_BODY_TOO_SLOW.format(timeout_s=limits.body_timeout_s)
            self._linger = _answer_and_linger(
                self, b"408 Request Timeout", refusal_body(path, ERROR_BODY_TIMEOUT, reason)
            )

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
            if self.length != 0:  # a body follows (declared, or chunked): it has body_timeout_s from here
                self._body_deadline = self.callLater(limits.body_timeout_s, self._body_too_slow)
            super().allHeadersReceived()  # may refuse the body at once (413), which disarms the deadline again

        def allContentReceived(self) -> None:
            self._disarm_body_deadline()
            super().allContentReceived()

        def requestDone(self, request: Any) -> None:
            # Armed before the next pipelined request is parsed (inside requestDone), so that request's head disarms it.
            self._arm_head_deadline()
            super().requestDone(request)

        def connectionLost(self, reason: Failure = connectionDone) -> None:
            self._disarm_deadlines()
            linger, self._linger = self._linger, None
            if linger is not None and linger.active():
                linger.cancel()
            super().connectionLost(reason)

    return LimitedRequest, DeadlineChannel


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
    "BODY_TIMEOUT",
    "GRACE_S",
    "Limits",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_PER_CLIENT",
    "SHED_EVENT",
    "SHED_PER_CLIENT",
    "SHED_TOTAL",
    "Setting",
    "ShedLog",
    "WebServer",
    "WebService",
    "bounded_http",
    "capped_factory",
    "close_reason",
    "configured",
    "derived_connection_caps",
    "install_reactor",
    "limits_from_settings",
    "nofile_limit",
    "parse_addr",
    "reasoned_websocket_protocol",
    "service",
]
