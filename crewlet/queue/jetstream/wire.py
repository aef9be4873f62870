"""What every part of the JetStream backend shares on the wire.

The API's subject prefix and the error codes the backend decides on, the
nats-py exceptions it translates at this boundary, and the parsing of what
the broker sends back (reply subjects, statuses, publish acknowledgements).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from crewlet.base.aio import keeping_cancel
from crewlet.queue.errors import Unavailable

API_PREFIX = "$JS.API"

_NS = 1_000_000_000

# JetStream API error codes this backend decides on.
ERR_CONSUMER_NOT_FOUND = 10014
ERR_STREAM_NOT_FOUND = 10059
ERR_STREAM_NAME_IN_USE = 10058
ERR_CONSUMER_EXISTS = 10148
#: The stream's (or the account's) limit on consumers is reached.
ERR_MAX_CONSUMERS = 10026
ERR_MESSAGE_TOO_LARGE = 10054
ERR_NO_MESSAGE_FOUND = 10037
ERR_SEQUENCE_NOT_FOUND = 10043
#: A message delete the broker refused; "no message found" when another delete took it first.
ERR_MESSAGE_DELETE_FAILED = 10057
#: A stream's replicas cannot be placed: too few cluster members up (or none: a lone server).
ERR_NO_SUITABLE_PEERS = 10005
#: "JetStream system temporarily unavailable" (code 503): a clustered JetStream busy or between meta leaders.
ERR_JETSTREAM_UNAVAILABLE = 10008
ERR_REPLICAS_NOT_SUPPORTED = 10074


def redact_url(url: str) -> str:
    """``url`` with any credential replaced, fit for logs and error messages."""
    out = []
    for part in str(url).split(","):
        try:
            parts = urlsplit(part.strip())
        except ValueError:
            out.append("<unparseable url>")
            continue
        if parts.username is not None or parts.password is not None:
            host = parts.hostname or ""
            if parts.port is not None:
                host = f"{host}:{parts.port}"
            parts = parts._replace(netloc=f"***@{host}")
        out.append(urlunsplit(parts))
    return ",".join(out)


async def ordered_flush(nc: NatsClient, timeout_s: float = 5.0) -> None:
    """Push the write buffer out, then PING/PONG: everything written before is at the server.

    nats-py's ``flush()`` writes its PING straight to the socket, so on its own
    it can overtake a SUB or a NAK still sitting in the client's buffer. The
    buffer push is bounded too: nats-py waits for its flusher without a
    deadline, and a connection dropping under it ends the flusher first.
    """
    await keeping_cancel(asyncio.wait_for(nc._flush_pending(force_flush=True), timeout=timeout_s))
    await keeping_cancel(nc.flush(timeout=timeout_s))  # type: ignore[arg-type]  # nats-py annotates its seconds as int and uses them as float (asyncio.wait_for, sleep)


def _ack_token(reply: str, index: int, default: int) -> int:
    """The number at ``index`` of a ``$JS.ACK.…`` reply subject in its 9-token layout, or ``default``.

    The longer layout puts the domain and the account hash before the same
    tokens, two places further on.
    """
    toks = reply.split(".")
    try:
        return int(toks[index if len(toks) == 9 else index + 2])
    except (IndexError, ValueError):
        return default


def _num_delivered(reply: str) -> int:
    """Deliveries including this one, from a ``$JS.ACK.…`` reply subject (both token layouts)."""
    return _ack_token(reply, 4, 1)


def _stream_seq(reply: str) -> int:
    return _ack_token(reply, 5, 0)


def _status_of(msg: Msg) -> tuple[str, str]:
    hdrs = msg.headers or {}
    return str(hdrs.get("Status", "") or ""), str(hdrs.get("Description", "") or "")


def next_subject(stream: str, consumer: str) -> str:
    """The subject a pull request for ``consumer`` on ``stream`` is published on."""
    return f"{API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{consumer}"


def direct_get_subject(stream: str) -> str:
    """The subject a direct get on ``stream`` is asked on (answered by the stream, not the API queue)."""
    return f"{API_PREFIX}.DIRECT.GET.{stream}"


def count_request(subject: str, from_seq: int) -> bytes:
    """A direct get asking for the first message on ``subject`` at or after ``from_seq``, as a batch of one.

    As a batch, the answer carries ``Nats-Num-Pending``: how many more
    messages on ``subject`` the stream holds after that one, counted in the
    store when the request is served.
    """
    return json.dumps({"seq": max(int(from_seq), 1), "next_by_subj": subject, "batch": 1}).encode()


#: The header of a batched direct get's answer that counts the messages after it.
NUM_PENDING_HEADER = "Nats-Num-Pending"


def pull_request(batch: int, expires_s: float = 0.0, *, no_wait: bool = False) -> bytes:
    """A pull request's body: up to ``batch`` messages, held ``expires_s`` at most (0: no expiry).

    ``no_wait`` has the broker end the request once it has delivered what is
    available (with a ``404``) instead of waiting for a full batch.
    """
    body = b'{"batch":%d' % batch
    if expires_s > 0:
        body += b',"expires":%d' % int(expires_s * _NS)
    if no_wait:
        body += b',"no_wait":true'
    return body + b"}"


def consumer_deleted(status: str, description: str) -> bool:
    """A pull request's status saying its consumer was deleted under it."""
    return status == "409" and "deleted" in description.lower()


class _ApiError(Unavailable):
    """An error answer of the JetStream API (internal: callers decide on ``err_code``)."""

    def __init__(self, what: str, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{what}: {description} (code {code}, err_code {err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description

    @property
    def busy(self) -> bool:
        """The broker answered that JetStream cannot answer yet: an ask, not a refusal of what was asked."""
        return self.err_code == ERR_JETSTREAM_UNAVAILABLE

    @property
    def no_consumer(self) -> bool:
        """The consumer the call named does not exist, or its stream does not."""
        return self.err_code in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND)


async def api_request(nc: NatsClient, subject: str, payload: bytes, timeout_s: float, what: str, *, empty_ok: bool = False) -> dict[str, Any]:
    """One request whose answer is the JetStream API's JSON; an error answer is :class:`_ApiError`, a failure ``Unavailable``.

    ``empty_ok``: an empty answer (a restore's acknowledgement of a chunk) is ``{}``.
    """
    try:
        msg = await keeping_cancel(nc.request(subject, payload, timeout=timeout_s))
    except nats.errors.NoRespondersError as e:
        raise Unavailable(f"{what}: JetStream did not answer (not enabled, or starting)") from e
    except _NATS_ERRORS as e:
        raise Unavailable(f"{what}: {e!r}") from e
    if empty_ok and not msg.data:
        return {}
    try:
        resp: dict[str, Any] = json.loads(msg.data)
    except ValueError as e:
        raise Unavailable(f"{what}: unparseable answer") from e
    err = resp.get("error")
    if err:
        raise _ApiError(what, int(err.get("code", 0) or 0), int(err.get("err_code", 0) or 0), str(err.get("description", "")))
    return resp


def _message_not_found(e: "nats.js.errors.APIError") -> bool:
    """A stream message get/delete that found no message at that sequence.

    A plain miss is a 404 (10037); a delete that lost a race with another delete
    of the same sequence comes back as a 500 delete failure (10057) saying so
    on a memory store, and as a 400 "sequence N not found" (10043) on a file
    store.
    """
    if isinstance(e, nats.js.errors.NotFoundError) or e.err_code in (ERR_NO_MESSAGE_FOUND, ERR_SEQUENCE_NOT_FOUND):
        return True
    return e.err_code == ERR_MESSAGE_DELETE_FAILED and "no message found" in str(e.description or "").lower()


def _acked_seq(body: bytes) -> int:
    """The stream sequence a publish acknowledgement names; 0 when it names none."""
    try:
        seq = json.loads(body).get("seq")
    except (ValueError, AttributeError):
        return 0
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else 0


_NATS_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, OSError, asyncio.TimeoutError)
