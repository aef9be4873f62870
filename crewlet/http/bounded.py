"""The request and the channel of ``manage.py up``'s web server: a body's bytes, a request head's time and a body's time.

What a client can make the server hold is bounded here, before any Django
code runs (each bound a field of :class:`crewlet.http.limits.Limits`):

* the body — Twisted reads a whole body before the application sees a byte
  (and Daphne then queues all of it), so a body limit checked in a view comes
  too late. The request of :func:`bounded_http` counts the bytes as they
  arrive and, the moment they pass the route's limit (a declared
  ``Content-Length`` over it at once), answers ``413`` with a JSON reason,
  half-closes, and reads what is still in flight only to drop it for
  :data:`~crewlet.http.limits.LINGER_S` so the client sees the answer rather
  than a reset. Webhooks get the edge's limit
  (``CREWLET_WEBHOOK_MAX_BODY_BYTES``), everything else Django's
  ``DATA_UPLOAD_MAX_MEMORY_SIZE``;
* the request head — its channel gives a connection
  ``HTTP_HEADER_TIMEOUT_S`` to send a complete request head, counted from its
  opening or from the end of its previous response, however slowly the bytes
  trickle in; then it is closed. A body whose bytes stop for
  ``HTTP_IDLE_TIMEOUT_S`` is closed too (Twisted's idle timeout, which
  Daphne leaves at 12 hours);
* the body's whole duration — Twisted's idle timer starts again at every
  byte, so a body trickled a byte at a time would be held for good: the same
  channel gives a body ``HTTP_BODY_TIMEOUT_S`` from the end of its head, then
  answers ``408`` with a JSON reason and closes (lingering like the 413).
"""
from __future__ import annotations

import json
import logging
import tempfile
from io import BytesIO
from typing import IO, Any, Optional
from urllib.parse import urlsplit

from crewlet.http.limits import LINGER_S, Limits

#: The web server's records, whichever of its modules writes them, come from one logger.
log = logging.getLogger("crewlet.http.web")

REASON_TOO_LARGE = "the body is over the {limit}-byte limit"
#: A 408's ``error`` code and reason: the body did not finish in time.
ERROR_BODY_TIMEOUT = "request_timeout"
REASON_BODY_TOO_SLOW = "the body did not arrive within {timeout_s:g} s of its request head"
#: A body of unknown length, or declared this long or longer, is kept in memory up to this many bytes and
#: only then spooled to a file (Twisted's own threshold), so a declared length alone costs no descriptor.
SPOOL_MAX_BYTES = 100000


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


__all__ = [
    "ERROR_BODY_TIMEOUT",
    "REASON_BODY_TOO_SLOW",
    "REASON_TOO_LARGE",
    "SPOOL_MAX_BYTES",
    "bounded_http",
    "refusal_body",
    "too_large_body",
]
