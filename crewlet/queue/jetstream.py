"""The JetStream backend: broker primitives over nats-py (design: Delivery Semantics).

``JetStreamQueue.connect(url, ...)`` returns the shared
:class:`~crewlet.queue.client.QueueClient` over a :class:`JetStreamTransport`;
every semantic the contract promises is decided there. This module only
speaks to the broker: it provisions the stream topology of
``crewlet.queue.topics``, creates and lists durable pull consumers, pulls,
settles, runs broadcast consumers and core-NATS scatter/gather.

``nats`` is imported here and in ``crewlet.queue.broker`` only. Every nats
exception is translated at this boundary (``Unavailable``, ``TooLarge``,
``InvalidArgument``, ``Gone``); none escapes.

Pull requests are made by hand on ``$JS.API.CONSUMER.MSG.NEXT`` with
``{"batch": n, "expires": t, "no_wait": true}``: the broker (2.15) holds such a
request until at least one message is available, delivers what is available
up to ``n``, then ends it at once with a ``404 No Messages`` status, or ends it
with ``408`` at ``expires`` when nothing came. One request, no waiting for a
full batch, and each request has its own reply subject so a late status of an
earlier request is never mistaken for the end of the current one.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from typing import Any, Awaitable, Callable, Coroutine, Mapping, Optional
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from crewlet.aio import keeping_cancel
from crewlet.queue import topics
from crewlet.queue.contract import (
    MAX_DELIVERIES,
    MAX_PAYLOAD_BYTES,
    STREAM_INACTIVE_THRESHOLD_S,
    Closable,
    DeadLetter,
    EventQueue,
    SubscriptionRef,
    Timings,
    dead_letter_seq,
)
from crewlet.queue.errors import Gone, InvalidArgument, QueueError, TooLarge, Unavailable
from crewlet.queue.transport import DUPLICATE_WINDOW_S, Transport, dead_letter_from

logger = logging.getLogger(__name__)

#: Room on the wire for headers (dead-letter headers, Nats-Msg-Id) beside an 8 MiB event.
WIRE_HEADROOM_BYTES = 64 * 1024
#: The largest message a Crewlet stream accepts: an event at the limit plus its headers.
MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES + WIRE_HEADROOM_BYTES

#: Consumer metadata keys that carry the exact (topic, group) pair.
META_TOPIC = "crewlet_topic"
META_GROUP = "crewlet_group"

API_PREFIX = "$JS.API"
#: A broadcast consumer's name starts with this (ephemeral; never listed).
BROADCAST_PREFIX = "crewlet_bcast_"

_NS = 1_000_000_000
#: Generous: the client, not the broker, bounds how much it takes in flight.
_MAX_ACK_PENDING = 10_000
#: How long a client waits past a pull request's expiry for the broker's status.
_FETCH_GRACE_S = 0.5
#: Below this a fetch is a pure no-wait poll (no expiry on the request).
_MIN_EXPIRES_S = 0.01
#: A broadcast consumer's pull request: batch and expiry.
_BROADCAST_BATCH = 256
_BROADCAST_EXPIRES_S = 5.0
#: How long closing a server waits for answers in flight before cancelling them.
_SERVE_CLOSE_WAIT_S = 60.0

# JetStream API error codes this module decides on.
ERR_CONSUMER_NOT_FOUND = 10014
ERR_STREAM_NOT_FOUND = 10059
ERR_STREAM_NAME_IN_USE = 10058
ERR_CONSUMER_EXISTS = 10148
ERR_MESSAGE_TOO_LARGE = 10054
ERR_NO_MESSAGE_FOUND = 10037
ERR_SEQUENCE_NOT_FOUND = 10043
#: A message delete the broker refused; "no message found" when another delete took it first.
ERR_MESSAGE_DELETE_FAILED = 10057

#: Stream settings provisioning keeps aligned with the topology (others are the broker's defaults).
_ALIGNED_KEYS = frozenset(
    {"subjects", "retention", "storage", "max_age", "max_msgs_per_subject", "max_msg_size", "num_replicas", "discard"}
)

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_\-]")
_READABLE_MAX = 64


# ---------------------------------------------------------------------------
# Names and configurations (pure; the tests read them too)


def durable_name(topic: str, group: str) -> str:
    """The durable consumer of (topic, group): a lossy readable rewrite plus the identity digest.

    ``crewlet.agent.ada.inbox`` / ``agent-ada`` -> ``crewlet_agent_ada_inbox_agent-ada_<16 hex>``.
    Only the digest is identity; the readable head is for operators.
    """
    readable = _UNSAFE_NAME.sub("_", f"{topic}_{group}")[:_READABLE_MAX]
    return f"{readable}_{topics.digest(topic, group)}"


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


def stream_config(
    spec: topics.StreamSpec,
    *,
    event_retention_hours: float,
    memory_storage: bool,
    replicas: int = 1,
) -> dict[str, Any]:
    """The JetStream configuration of one stream of the topology (JSON, durations in ns)."""
    max_age_s = 0.0
    if spec.max_age == "events":
        max_age_s = float(event_retention_hours) * 3600.0
    elif spec.max_age == "config":
        max_age_s = topics.CONFIG_MAX_AGE_S
    cfg: dict[str, Any] = {
        "name": spec.name,
        "subjects": [spec.subjects],
        "retention": "interest" if spec.retention == "interest" else "limits",
        "storage": "memory" if memory_storage else "file",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": int(max_age_s * _NS),
        "max_msgs_per_subject": 1 if spec.per_subject_last else -1,
        "max_msg_size": MAX_MESSAGE_BYTES,
        "discard": "old",
        "num_replicas": max(int(replicas), 1),
    }
    if max_age_s > 0:
        # The broker refuses a duplicate window longer than the age bound.
        cfg["duplicate_window"] = int(min(DUPLICATE_WINDOW_S, max_age_s) * _NS)
    return cfg


def consumer_config(topic: str, group: str, timings: Timings) -> dict[str, Any]:
    """A seat's mailbox: durable, pull, explicit ack, DeliverAll, the pair in its metadata.

    No server backoff: the client computes each Nak's delay (nats-server issue
    4726: a consumer's backoff does not apply to naks). MaxDeliver is the
    backstop of the client's own dead-letter decision.
    """
    name = durable_name(topic, group)
    return {
        "name": name,
        "durable_name": name,
        "filter_subject": topic,
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": int(float(timings.ack_wait_s) * _NS),
        "max_deliver": MAX_DELIVERIES,
        "max_ack_pending": _MAX_ACK_PENDING,
        "replay_policy": "instant",
        "metadata": {META_TOPIC: topic, META_GROUP: group},
    }


def broadcast_config(name: str, filter_subject: str) -> dict[str, Any]:
    """A live feed: ephemeral, from now, acknowledging nothing, reaped a minute after it goes quiet."""
    return {
        "name": name,
        "deliver_policy": "new",
        "ack_policy": "none",
        "inactive_threshold": int(STREAM_INACTIVE_THRESHOLD_S * _NS),
        "filter_subject": filter_subject,
        "replay_policy": "instant",
        "mem_storage": True,
    }


def is_subset(pattern: str, of: str) -> bool:
    """Whether every subject ``pattern`` matches is also matched by ``of`` (NATS wildcards)."""
    p, s = topics.split(pattern), topics.split(of)
    for i, tok in enumerate(s):
        if tok == ">":
            return len(p) > i
        if i >= len(p):
            return False
        if p[i] == ">":
            return False
        if tok == "*":
            continue
        if p[i] == "*" or p[i] != tok:
            return False
    return len(p) == len(s)


async def ordered_flush(nc: NatsClient, timeout_s: float = 5.0) -> None:
    """Push the write buffer out, then PING/PONG: everything written before is at the server.

    nats-py's ``flush()`` writes its PING straight to the socket, so on its own
    it can overtake a SUB or a NAK still sitting in the client's buffer. The
    buffer push is bounded too: nats-py waits for its flusher without a
    deadline, and a connection dropping under it ends the flusher first.
    """
    await keeping_cancel(asyncio.wait_for(nc._flush_pending(force_flush=True), timeout=timeout_s))
    await keeping_cancel(nc.flush(timeout=timeout_s))  # type: ignore[arg-type]  # nats-py annotates its seconds as int and uses them as float (asyncio.wait_for, sleep)


def _num_delivered(reply: str) -> int:
    """Deliveries including this one, from a ``$JS.ACK.…`` reply subject (both token layouts)."""
    toks = reply.split(".")
    try:
        if len(toks) == 9:
            return int(toks[4])
        return int(toks[6])
    except (IndexError, ValueError):
        return 1


def _stream_seq(reply: str) -> int:
    toks = reply.split(".")
    try:
        if len(toks) == 9:
            return int(toks[5])
        return int(toks[7])
    except (IndexError, ValueError):
        return 0


def _status_of(msg: Msg) -> tuple[str, str]:
    hdrs = msg.headers or {}
    return str(hdrs.get("Status", "") or ""), str(hdrs.get("Description", "") or "")


class _ApiError(Unavailable):
    """An error answer of the JetStream API (internal: callers decide on ``err_code``)."""

    def __init__(self, what: str, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{what}: {description} (code {code}, err_code {err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description


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


# ---------------------------------------------------------------------------
# Fetched messages


class JetStreamMessage:
    """One fetched, unsettled JetStream message (a :class:`~crewlet.queue.transport.RawMessage`)."""

    __slots__ = ("_msg", "_nc", "data", "delivered")

    def __init__(self, msg: Msg, nc: NatsClient) -> None:
        self._msg = msg
        self._nc = nc
        self.data: bytes = msg.data
        self.delivered: int = _num_delivered(msg.reply)

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def headers(self) -> dict[str, str]:
        return dict(self._msg.headers or {})

    async def ack(self) -> None:
        try:
            await self._msg.ack()
        except nats.errors.MsgAlreadyAckdError:
            return
        except _NATS_ERRORS as e:
            raise Unavailable(f"ack failed: {e!r}") from e

    async def nak(self, delay_s: float) -> None:
        try:
            await self._msg.nak(delay=delay_s if delay_s and delay_s > 0 else None)
        except nats.errors.MsgAlreadyAckdError:
            return
        except _NATS_ERRORS as e:
            raise Unavailable(f"nak failed: {e!r}") from e

    async def nak_head(self) -> None:
        """An immediate Nak, flushed: the next fetch cannot race it (ARCHITECTURE: broker facts)."""
        try:
            await self._msg.nak()
        except nats.errors.MsgAlreadyAckdError:
            return
        except _NATS_ERRORS as e:
            raise Unavailable(f"nak failed: {e!r}") from e
        if not self._nc.is_connected:
            return  # buffered; it goes out on reconnect
        try:
            await ordered_flush(self._nc, 5)
        except _NATS_ERRORS as e:
            raise Unavailable(f"flushing a hand-back failed: {e!r}") from e

    async def term(self) -> None:
        try:
            await self._msg.term()
        except nats.errors.MsgAlreadyAckdError:
            return
        except _NATS_ERRORS as e:
            raise Unavailable(f"term failed: {e!r}") from e

    async def in_progress(self) -> None:
        """``+WPI``: the broker restarts this delivery's ack clock (allowed any number of times)."""
        if self._msg._ackd:
            return
        try:
            await self._msg.in_progress()
        except _NATS_ERRORS as e:
            raise Unavailable(f"in-progress signal failed: {e!r}") from e

    def __repr__(self) -> str:
        return f"<JetStreamMessage {self._msg.subject} delivered={self.delivered} bytes={len(self.data)}>"


# ---------------------------------------------------------------------------
# Pulling


class _Fetch:
    __slots__ = ("reply", "max_n", "msgs", "fut", "done", "terminated", "error")

    def __init__(self, reply: str, max_n: int, fut: asyncio.Future[None]) -> None:
        self.reply = reply
        self.max_n = max_n
        self.msgs: list[JetStreamMessage] = []
        self.fut = fut
        self.done = False
        #: The broker ended the request (status, or batch complete): nothing more can arrive for it.
        self.terminated = False
        self.error: Optional[str] = None

    def finish(self) -> None:
        self.done = True
        if not self.fut.done():
            self.fut.set_result(None)


class JetStreamPuller:
    """A pull consumer bound to one durable (a :class:`~crewlet.queue.transport.Puller`).

    A message that arrives for a request this puller gave up on (interrupted,
    cancelled, or whose end the broker never sent) is handed straight back
    with an immediate Nak rather than held; and the reply subscription of
    such a request is retired, so the broker drops the request instead of
    delivering into it.
    """

    def __init__(self, transport: "JetStreamTransport", stream: str, consumer: str, topic: str, group: str) -> None:
        self._t = transport
        self._nc = transport._nc
        self.stream = stream
        self.consumer = consumer
        self.topic = topic
        self.group = group
        self._next_subject = f"{API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._sub: Any = None
        self._prefix = ""
        self._gen = 0
        self._seq = 0
        self._active: Optional[_Fetch] = None
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False

    async def _open_sub(self) -> None:
        self._gen += 1
        gen = self._gen
        prefix = self._nc.new_inbox()

        async def on_msg(msg: Msg) -> None:
            await self._on_msg(gen, msg)

        self._sub = await self._nc.subscribe(prefix + ".*", cb=on_msg, pending_msgs_limit=0, pending_bytes_limit=0)
        self._prefix = prefix

    async def _on_msg(self, gen: int, msg: Msg) -> None:
        f = self._active
        if not msg.reply:  # a status about one of our pull requests
            if f is None or gen != self._gen or f.done or msg.subject != f.reply:
                return  # about a request already settled
            status, desc = _status_of(msg)
            if status == "100":
                return
            if status == "409" and "deleted" in desc.lower():
                f.error = "gone"
            elif status == "503":
                f.error = "no_responders"
            elif status not in ("404", "408", "409"):
                logger.warning(
                    "jetstream_pull_status",
                    extra={"stream": self.stream, "consumer": self.consumer, "status": status, "description": desc},
                )
            f.terminated = True
            f.finish()
            return
        if f is not None and gen == self._gen and not f.done:
            f.msgs.append(JetStreamMessage(msg, self._nc))
            if len(f.msgs) >= f.max_n:
                f.terminated = True  # the batch is complete: the broker sends nothing more for it
                f.finish()
            return
        # Delivered for a request we gave up on: never hold it.
        try:
            await msg.nak()
        except Exception:
            logger.debug("jetstream_orphan_nak_failed", exc_info=True)

    async def fetch(self, max_n: int, timeout_s: float, ready: Callable[[], bool]) -> list[JetStreamMessage]:
        if self._closed or not ready():
            return []
        if not self._nc.is_connected:
            raise Unavailable("not connected to the broker")
        n = max(int(max_n), 1)
        wait = max(float(timeout_s), 0.0)
        loop = asyncio.get_running_loop()
        f: Optional[_Fetch] = None
        try:
            if self._sub is None:
                await self._open_sub()
            self._seq += 1
            reply = f"{self._prefix}.{self._seq}"
            if wait >= _MIN_EXPIRES_S:
                body = b'{"batch":%d,"expires":%d,"no_wait":true}' % (n, int(wait * _NS))
            else:
                body = b'{"batch":%d,"no_wait":true}' % n
                wait = 0.0
            f = _Fetch(reply, n, loop.create_future())
            self._active = f
            await self._nc.publish(self._next_subject, body, reply=reply)
        except BaseException as e:
            if f is not None:  # the request may be on the wire: never let it take mail for nobody
                f.done = True
                self._active = None
                self._retire_sub()
            if isinstance(e, _NATS_ERRORS):
                raise Unavailable(f"pull from {self.stream}/{self.consumer} failed: {e!r}") from e
            raise
        timer = loop.call_later(wait + _FETCH_GRACE_S, f.finish)
        try:
            await f.fut
        except asyncio.CancelledError:
            # The caller gave up: leave neither a live request nor taken mail behind.
            f.done = True
            self._retire_sub()
            if f.msgs:
                self._spawn(self._give_back(list(f.msgs)))
            raise
        finally:
            timer.cancel()
            if self._active is f:
                self._active = None
        if not f.terminated:
            self._retire_sub()  # the request may still be live on the broker
        if f.error == "gone":
            raise Gone(f"the durable {self.consumer} on {self.stream} was deleted")
        if f.error == "no_responders":
            await self._raise_gone_or_unavailable()
        return f.msgs

    async def _raise_gone_or_unavailable(self) -> None:
        try:
            await self._t._api(f"CONSUMER.INFO.{self.stream}.{self.consumer}", None, what="consumer info")
        except _ApiError as e:
            if e.err_code in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND):
                raise Gone(f"the durable {self.consumer} on {self.stream} does not exist") from e
            raise
        raise Unavailable(f"the durable {self.consumer} on {self.stream} did not answer a pull")

    def interrupt(self) -> None:
        """End a waiting fetch now, and take its request off the broker.

        The reply subscription is retired at once (its UNSUB is queued on the
        connection before anything this transport publishes next), so mail
        published after a hold, a quiesce or a detach is not delivered into a
        request nobody waits on, and keeps its delivery count.
        """
        f = self._active
        if f is not None and not f.done:
            f.finish()
            self._retire_sub()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _retire_sub(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            self._t._unsub_pending += 1
            self._spawn(self._drain_sub(sub))

    async def _drain_sub(self, sub: Any) -> None:
        """Unsubscribe so the broker drops our request; what was already on the way is handed back.

        ``sub.drain()`` is awaited directly (no wrapper task): its first step,
        queueing the UNSUB, then runs as soon as this task does, which is what
        ``JetStreamTransport.publish`` yields for.
        """
        try:
            if self._nc.is_connected:
                await sub.drain()
            elif not self._nc.is_closed:
                await sub.unsubscribe()
        except Exception:
            logger.debug("jetstream_pull_sub_retire_failed", exc_info=True)
            try:
                if not self._nc.is_closed:
                    await sub.unsubscribe()
            except Exception:
                pass
        finally:
            self._t._unsub_pending -= 1

    async def _give_back(self, msgs: list[JetStreamMessage]) -> None:
        for m in msgs:
            try:
                await m._msg.nak()
            except Exception:
                logger.debug("jetstream_give_back_failed", exc_info=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.interrupt()
        self._retire_sub()
        self._t._pullers.discard(self)
        if self._background:
            await asyncio.wait(list(self._background), timeout=6.0)

    def __repr__(self) -> str:
        return f"<JetStreamPuller {self.stream}/{self.consumer}>"


# ---------------------------------------------------------------------------
# Broadcast


class _BroadcastStream:
    """One ephemeral pull consumer on one stream, dispatching sequentially."""

    def __init__(
        self,
        transport: "JetStreamTransport",
        spec: topics.StreamSpec,
        pattern: str,
        on_message: Callable[[str, bytes], Awaitable[None]],
    ) -> None:
        self._t = transport
        self._nc = transport._nc
        self.spec = spec
        self.pattern = pattern
        self.on_message = on_message
        if is_subset(pattern, spec.subjects):
            self.filter_subject = pattern
            self._client_filter: Optional[str] = None
        else:
            self.filter_subject = spec.subjects
            self._client_filter = pattern
        self.consumer = BROADCAST_PREFIX + secrets.token_hex(8)
        self._seq = 0
        #: Set by the transport when the connection dropped or came back.
        self.kicked = False
        self._task: Optional[asyncio.Task[None]] = None
        self._sub: Any = None
        self._closed = False

    async def create_consumer(self) -> None:
        stream = self.spec.name
        await self._t._api(
            f"CONSUMER.CREATE.{stream}.{self.consumer}",
            {"stream_name": stream, "config": broadcast_config(self.consumer, self.filter_subject), "action": "create"},
            what=f"create broadcast consumer on {stream}",
        )
        logger.debug(
            "jetstream_broadcast_consumer_created",
            extra={"stream": stream, "consumer": self.consumer, "filter": self.filter_subject},
        )

    async def start(self) -> None:
        await self.create_consumer()
        self._sub = await self._nc.subscribe(
            self._nc.new_inbox() + ".*", pending_msgs_limit=0, pending_bytes_limit=0
        )
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"jetstream-broadcast:{self.spec.name}:{self.pattern}"
        )

    async def _run(self) -> None:
        while not self._closed:
            try:
                await self._pull_once()
            except asyncio.CancelledError:
                raise
            except nats.errors.ConnectionClosedError:
                return
            except Exception:  # the feed must outlive any one failure
                logger.exception("jetstream_broadcast_loop_failed", extra={"stream": self.spec.name})
                await asyncio.sleep(0.5)

    async def _pull_once(self) -> None:
        """One pull request: dispatch what it brings until the broker ends it."""
        if not self._nc.is_connected:
            await self._t._wait_connected(1.0)
            return
        self.kicked = False
        sub = self._sub
        self._seq += 1
        reply = f"{sub.subject[:-2]}.{self._seq}"
        body = b'{"batch":%d,"expires":%d}' % (_BROADCAST_BATCH, int(_BROADCAST_EXPIRES_S * _NS))
        try:
            await self._nc.publish(f"{API_PREFIX}.CONSUMER.MSG.NEXT.{self.spec.name}.{self.consumer}", body, reply=reply)
        except _NATS_ERRORS:
            await asyncio.sleep(0.2)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _BROADCAST_EXPIRES_S + _FETCH_GRACE_S
        got = 0
        while not self._closed and got < _BROADCAST_BATCH:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                msg = await keeping_cancel(sub.next_msg(timeout=min(left, 0.25)))
            except nats.errors.TimeoutError:
                if self.kicked:  # the connection dropped: this request is lost with it
                    break
                continue
            if not msg.reply:
                if msg.subject != reply:
                    continue  # a late status of an earlier request
                status, desc = _status_of(msg)
                if status == "100":
                    continue
                if status == "503" or (status == "409" and "deleted" in desc.lower()):
                    await self._recreate()  # reaped, or a broker that lost it
                return
            got += 1
            if self._client_filter is not None and not topics.matches(self._client_filter, msg.subject):
                continue
            try:
                await self.on_message(msg.subject, msg.data)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception(
                    "jetstream_broadcast_handler_failed", extra={"stream": self.spec.name, "subject": msg.subject}
                )
        if got == 0 and not self._closed and self._nc.is_connected:
            # The broker never ended the request: make sure the consumer still exists.
            await self._recreate(only_if_missing=True)

    async def _recreate(self, only_if_missing: bool = False) -> None:
        if self._closed:
            return
        try:
            if only_if_missing:
                try:
                    await self._t._api(f"CONSUMER.INFO.{self.spec.name}.{self.consumer}", None, what="consumer info")
                    return
                except _ApiError as e:
                    if e.err_code not in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND):
                        return
            await self._t._ensure_stream(self.spec, force=True)
            await self.create_consumer()
            logger.info("jetstream_broadcast_consumer_recreated", extra={"stream": self.spec.name})
        except QueueError:
            logger.debug("jetstream_broadcast_recreate_failed", exc_info=True)
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._sub is not None and not self._nc.is_closed:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass
        if self._nc.is_connected:
            try:
                await self._t._api(
                    f"CONSUMER.DELETE.{self.spec.name}.{self.consumer}", None, what="delete broadcast consumer",
                    timeout=2.0,
                )
            except QueueError:
                pass  # the inactivity threshold reaps it


class _Broadcast:
    def __init__(self, transport: "JetStreamTransport", parts: list[_BroadcastStream]) -> None:
        self._t = transport
        self._parts = parts
        self._closed = False

    def kick(self) -> None:
        for part in self._parts:
            part.kicked = True

    @property
    def consumers(self) -> list[tuple[str, str]]:
        """(stream, consumer) of each ephemeral consumer this broadcast runs."""
        return [(p.spec.name, p.consumer) for p in self._parts]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._t._closables.discard(self)
        for part in self._parts:
            await part.close()


# ---------------------------------------------------------------------------
# Serving


class _Server:
    def __init__(self, transport: "JetStreamTransport", subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None:
        self._t = transport
        self._nc = transport._nc
        self.subject = subject
        self._answer_fn = answer
        self._sub: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        """Returns once the server knows the subscription, so the next ask reaches it."""
        try:
            self._sub = await self._nc.subscribe(self.subject, cb=self._on_request)
            await ordered_flush(self._nc, 5)
        except _NATS_ERRORS as e:
            raise Unavailable(f"serving {self.subject!r} failed: {e!r}") from e

    async def _on_request(self, msg: Msg) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        try:
            reply = await self._answer_fn(msg.data)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("jetstream_serve_answer_failed", extra={"subject": self.subject})
            return
        if not msg.reply:
            return
        if not isinstance(reply, (bytes, bytearray, memoryview)):
            logger.error("jetstream_serve_answer_not_bytes", extra={"subject": self.subject, "type": type(reply).__name__})
            return
        try:
            await self._nc.publish(msg.reply, bytes(reply))
        except Exception:
            logger.warning("jetstream_serve_reply_failed", extra={"subject": self.subject}, exc_info=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._t._closables.discard(self)
        if self._sub is not None and not self._nc.is_closed:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass
        if self._tasks:
            done, pending = await asyncio.wait(list(self._tasks), timeout=_SERVE_CLOSE_WAIT_S)
            for task in pending:
                task.cancel()
            if pending:
                logger.warning("jetstream_serve_close_cancelled_answers", extra={"subject": self.subject, "count": len(pending)})
                await asyncio.gather(*pending, return_exceptions=True)


# ---------------------------------------------------------------------------
# The transport


class JetStreamTransport(Transport):
    """The JetStream broker primitives under :class:`~crewlet.queue.client.QueueClient`."""

    name = "jetstream"
    #: A fetch is one pull request on the wire, and the client interrupts it when
    #: its gate closes, so it can wait long between looks.
    poll_s = 5.0

    def __init__(
        self,
        nc: NatsClient,
        *,
        timings: Timings = Timings(),
        event_retention_hours: float = 720.0,
        memory_storage: bool = False,
        replicas: int = 1,
        api_timeout_s: float = 5.0,
        url: str = "",
    ) -> None:
        if not (event_retention_hours > 0):
            raise InvalidArgument(f"event_retention_hours={event_retention_hours!r}: must be > 0")
        self._nc = nc
        self.timings = timings
        self.event_retention_hours = float(event_retention_hours)
        self.memory_storage = bool(memory_storage)
        self.replicas = max(int(replicas), 1)
        self._api_timeout_s = float(api_timeout_s)
        self._url = redact_url(url)
        self._ready_streams: set[str] = set()
        self._subject_streams: dict[str, topics.StreamSpec] = {}
        self._provision_lock = asyncio.Lock()
        self._pullers: set[JetStreamPuller] = set()
        self._closables: set[Any] = set()
        self._connected = asyncio.Event()
        #: Reply subscriptions of abandoned pull requests whose UNSUB is not yet confirmed.
        self._unsub_pending = 0
        self._closed = False

    # -- connecting ---------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        node: str = "",
        timings: Timings = Timings(),
        event_retention_hours: float = 720.0,
        memory_storage: bool = False,
        replicas: int = 1,
        connect_timeout_s: float = 5.0,
        reconnect_wait_s: float = 0.25,
        api_timeout_s: float = 5.0,
    ) -> "JetStreamTransport":
        """Dial ``url`` (credentials may ride in it), provision the engine's streams.

        The first dial fails fast (``Unavailable``); once connected the client
        reconnects forever, ``reconnect_wait_s`` apart.
        """
        if not isinstance(url, str) or not url.strip():
            raise InvalidArgument("url: a nats:// URL is required")
        servers = [u.strip() for u in url.split(",") if u.strip()]
        nc = NatsClient()
        self = cls(
            nc,
            timings=timings,
            event_retention_hours=event_retention_hours,
            memory_storage=memory_storage,
            replicas=replicas,
            api_timeout_s=api_timeout_s,
            url=url,
        )
        try:
            await keeping_cancel(asyncio.wait_for(
                nc.connect(
                    servers=servers,
                    name=f"crewlet:{node}" if node else "crewlet",
                    allow_reconnect=False,  # the first dial fails fast; reconnection is enabled below
                    connect_timeout=max(int(connect_timeout_s), 1),
                    reconnect_time_wait=reconnect_wait_s,  # type: ignore[arg-type]  # nats-py annotates its seconds as int and uses them as float (asyncio.wait_for, sleep)
                    # nats-py's first dial retries forever unless this is > 0 (its server
                    # pool only drops a server past it); unlimited is set once connected.
                    max_reconnect_attempts=2,
                    ping_interval=10,
                    max_outstanding_pings=3,
                    pending_size=2 * MAX_MESSAGE_BYTES,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    closed_cb=self._on_closed,
                ),
                timeout=connect_timeout_s * 2,
            ))
        except (Exception, asyncio.CancelledError) as e:
            try:
                await nc.close()
            except Exception:
                pass
            if isinstance(e, asyncio.CancelledError):
                raise
            raise Unavailable(f"cannot reach the broker at {redact_url(url)}: {e!r}") from e
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = -1
        self._connected.set()
        if nc.max_payload < MAX_PAYLOAD_BYTES:
            logger.warning(
                "jetstream_max_payload_small",
                extra={"server_max_payload": nc.max_payload, "contract_max_payload": MAX_PAYLOAD_BYTES},
            )
        try:
            await self.provision()
        except BaseException:
            await self.close()
            raise
        logger.info(
            "jetstream_connected",
            extra={"url": self._url, "node": node, "memory_storage": self.memory_storage},
        )
        return self

    async def _on_error(self, e: Exception) -> None:
        if isinstance(e, nats.errors.SlowConsumerError):
            logger.warning("jetstream_slow_consumer", extra={"subject": getattr(e, "subject", "")})
        else:
            logger.debug("jetstream_connection_error", extra={"error": repr(e)})

    async def _on_disconnected(self) -> None:
        self._connected.clear()
        if not self._closed:
            logger.warning("jetstream_disconnected", extra={"url": self._url})
        self._kick_all()

    async def _on_reconnected(self) -> None:
        # The broker may be a new one (memory storage): provision again on demand.
        self._ready_streams.clear()
        self._connected.set()
        logger.info("jetstream_reconnected", extra={"url": self._url})
        # No kick here: every wait on a request of the old connection was ended at
        # the disconnect, and a fetch made since is a good request on the new one.

    def _kick_all(self) -> None:
        """A pull request on the wire did not survive the connection: end every wait on one."""
        for puller in list(self._pullers):
            puller.interrupt()
        for closable in list(self._closables):
            if isinstance(closable, _Broadcast):
                closable.kick()

    async def _on_closed(self) -> None:
        self._connected.clear()

    async def _wait_connected(self, timeout_s: float) -> bool:
        try:
            await keeping_cancel(asyncio.wait_for(self._connected.wait(), timeout=timeout_s))
        except asyncio.TimeoutError:
            return False
        return True

    @property
    def is_connected(self) -> bool:
        return self._nc.is_connected

    async def round_trip(self, timeout_s: float) -> None:
        """A PING answered by a PONG within ``timeout_s``; anything else is ``Unavailable``."""
        if not self._nc.is_connected:
            raise Unavailable("the broker is disconnected")
        try:
            await asyncio.wait_for(self._nc.flush(timeout=max(timeout_s, 0.001)), timeout_s)  # type: ignore[arg-type]  # nats-py annotates its seconds as int and uses them as float (asyncio.wait_for, sleep)
        except (asyncio.TimeoutError, nats.errors.Error) as exc:
            raise Unavailable(f"the broker did not answer a round trip within {timeout_s:g} s") from exc

    def _require_connected(self) -> None:
        if self._closed:
            raise Unavailable("the JetStream transport is closed")
        if not self._nc.is_connected:
            raise Unavailable(f"not connected to the broker at {self._url} (reconnecting)")

    # -- the JetStream API ----------------------------------------------------------

    async def _api(
        self, suffix: str, body: Optional[dict[str, Any]], *, what: str = "", timeout: Optional[float] = None
    ) -> dict[str, Any]:
        self._require_connected()
        payload = json.dumps(body).encode() if body is not None else b""
        try:
            msg = await keeping_cancel(
                self._nc.request(f"{API_PREFIX}.{suffix}", payload, timeout=timeout or self._api_timeout_s)
            )
        except nats.errors.NoRespondersError as e:
            raise Unavailable(f"{what or suffix}: JetStream did not answer (not enabled, or starting)") from e
        except _NATS_ERRORS as e:
            raise Unavailable(f"{what or suffix}: {e!r}") from e
        try:
            resp: dict[str, Any] = json.loads(msg.data)
        except ValueError as e:
            raise Unavailable(f"{what or suffix}: unparseable answer") from e
        err = resp.get("error")
        if err:
            raise _ApiError(
                what or suffix, int(err.get("code", 0) or 0), int(err.get("err_code", 0) or 0), str(err.get("description", ""))
            )
        return resp

    # -- streams ----------------------------------------------------------------------

    def stream_config(self, spec: topics.StreamSpec) -> dict[str, Any]:
        return stream_config(
            spec,
            event_retention_hours=self.event_retention_hours,
            memory_storage=self.memory_storage,
            replicas=self.replicas,
        )

    async def provision(self) -> None:
        """Create (or align) every engine stream; idempotent."""
        for spec in topics.ENGINE_STREAMS:
            await self._ensure_stream(spec)

    async def _ensure_stream(self, spec: topics.StreamSpec, *, force: bool = False) -> None:
        """Create the stream, or align an existing one with the topology; then remember it.

        Looks first: the broker's ``did_create`` is true for an idempotent create
        as well, so it cannot say whether this call created the stream.
        """
        if not force and spec.name in self._ready_streams:
            return
        async with self._provision_lock:
            if not force and spec.name in self._ready_streams:
                return
            cfg = self.stream_config(spec)
            try:
                info = await self._api(f"STREAM.INFO.{spec.name}", None, what=f"stream info {spec.name}")
            except _ApiError as e:
                if e.err_code != ERR_STREAM_NOT_FOUND:
                    raise
                await self._create_stream(spec, cfg)
            else:
                current = info.get("config") or {}
                drift = {k: (current.get(k), v) for k, v in cfg.items() if k in _ALIGNED_KEYS and current.get(k) != v}
                if drift:
                    await self._update_stream(spec, cfg, drift)
            self._ready_streams.add(spec.name)

    async def _create_stream(self, spec: topics.StreamSpec, cfg: dict[str, Any]) -> None:
        try:
            await self._api(f"STREAM.CREATE.{spec.name}", cfg, what=f"create stream {spec.name}")
        except _ApiError as e:
            if e.err_code == ERR_STREAM_NAME_IN_USE:  # another client created it meanwhile, differently
                await self._update_stream(spec, cfg, {})
                return
            logger.error(
                "jetstream_stream_provision_failed",
                extra={"stream": spec.name, "subjects": spec.subjects, "error": e.description},
            )
            raise Unavailable(f"cannot provision stream {spec.name}: {e.description}") from e
        logger.info(
            "jetstream_stream_created",
            extra={
                "stream": spec.name,
                "subjects": spec.subjects,
                "retention": cfg["retention"],
                "storage": cfg["storage"],
                "max_age_s": cfg["max_age"] / _NS,
            },
        )

    async def _update_stream(self, spec: topics.StreamSpec, cfg: dict[str, Any], drift: dict[str, Any]) -> None:
        try:
            await self._api(f"STREAM.UPDATE.{spec.name}", cfg, what=f"update stream {spec.name}")
        except _ApiError as e:
            # e.g. storage or retention cannot change in place: keep the stream as it is.
            logger.warning(
                "jetstream_stream_config_kept",
                extra={"stream": spec.name, "error": e.description, "drift": repr(drift)},
            )
            return
        logger.info("jetstream_stream_updated", extra={"stream": spec.name, "drift": repr(drift)})

    def _stream_of(self, subject: str) -> topics.StreamSpec:
        spec = self._subject_streams.get(subject)
        if spec is None:
            spec = topics.stream_for(subject)
            if len(self._subject_streams) > 50_000:
                self._subject_streams.clear()
            self._subject_streams[subject] = spec
        return spec

    # -- publishing ----------------------------------------------------------------

    async def publish(self, subject: str, data: bytes, headers: Optional[Mapping[str, str]] = None) -> int:
        if len(data) > MAX_PAYLOAD_BYTES:
            raise TooLarge(f"{len(data)} bytes is over the limit of {MAX_PAYLOAD_BYTES}")
        if self._unsub_pending:
            # A puller just gave up a pull request: let its UNSUB reach the wire
            # first, so this message cannot be delivered into that request.
            await asyncio.sleep(0)
        spec = self._stream_of(subject)
        if spec.name not in self._ready_streams:
            await self._ensure_stream(spec)
        hdrs = dict(headers) if headers else None
        for attempt in (1, 2):
            self._require_connected()
            try:
                msg = await keeping_cancel(self._nc.request(subject, data, timeout=self._api_timeout_s, headers=hdrs))
            except nats.errors.MaxPayloadError as e:
                raise TooLarge(f"{len(data)} bytes is over the broker's max_payload {self._nc.max_payload}") from e
            except nats.errors.NoRespondersError as e:
                # No stream listens there (deleted, or a new broker): provision it once and retry.
                self._ready_streams.discard(spec.name)
                if attempt == 2:
                    raise Unavailable(f"no stream stores {subject!r}") from e
                await self._ensure_stream(spec)
                continue
            except nats.errors.BadSubjectError as e:
                raise InvalidArgument(f"subject={subject!r}: {e!r}") from e
            except _NATS_ERRORS as e:
                raise Unavailable(f"publish to {subject!r} failed: {e!r}") from e
            body = msg.data
            if b'"error"' in body:
                try:
                    err = json.loads(body).get("error") or {}
                except ValueError:
                    err = {}
                desc = str(err.get("description", ""))
                if err.get("err_code") == ERR_MESSAGE_TOO_LARGE or "message size" in desc.lower():
                    raise TooLarge(f"publish to {subject!r}: {desc}")
                raise Unavailable(f"publish to {subject!r}: {desc or body[:200]!r}")
            return _acked_seq(body)
        return 0

    # -- durable consumers -----------------------------------------------------------

    async def ensure_consumer(self, topic: str, group: str) -> bool:
        spec = self._stream_of(topic)
        await self._ensure_stream(spec)
        name = durable_name(topic, group)
        try:
            info = await self._api(f"CONSUMER.INFO.{spec.name}.{name}", None, what="consumer info")
        except _ApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                await self._ensure_stream(spec, force=True)
            elif e.err_code != ERR_CONSUMER_NOT_FOUND:
                raise
        else:
            await self._align_ack_wait(spec.name, name, info.get("config") or {})
            return False
        cfg = consumer_config(topic, group, self.timings)
        # A per-call nonce: of two racing creators exactly one gets "created"
        # (the broker refuses an action=create whose config differs).
        cfg["description"] = f"crewlet mailbox #{secrets.token_hex(6)}"
        try:
            await self._api(
                f"CONSUMER.CREATE.{spec.name}.{name}",
                {"stream_name": spec.name, "config": cfg, "action": "create"},
                what=f"create consumer {name}",
            )
        except _ApiError as e:
            if e.err_code == ERR_CONSUMER_EXISTS:
                return False
            raise
        logger.info(
            "jetstream_consumer_created",
            extra={"stream": spec.name, "consumer": name, "topic": topic, "group": group},
        )
        return True

    async def _align_ack_wait(self, stream: str, name: str, current: dict[str, Any]) -> None:
        """Give an existing durable this client's ack window (one made with another keeps it otherwise).

        Only the ack window is aligned: it is what decides how long a dead
        process's mail waits, and the broker lets it change in place. The
        rest of the consumer (its position, its metadata, its nonce) is kept
        as it is, and a refusal leaves the consumer as it was.
        """
        want = int(float(self.timings.ack_wait_s) * _NS)
        have = current.get("ack_wait")
        if not current or have == want:
            return
        cfg = dict(current)
        cfg["ack_wait"] = want
        try:
            await self._api(
                f"CONSUMER.CREATE.{stream}.{name}",
                {"stream_name": stream, "config": cfg, "action": "update"},
                what=f"update consumer {name}",
            )
        except _ApiError as e:
            logger.warning(
                "jetstream_consumer_config_kept",
                extra={"stream": stream, "consumer": name, "ack_wait_s": (have or 0) / _NS, "error": e.description},
            )
            return
        logger.info(
            "jetstream_consumer_updated",
            extra={"stream": stream, "consumer": name, "ack_wait_s_was": (have or 0) / _NS, "ack_wait_s": want / _NS},
        )

    async def delete_consumer(self, topic: str, group: str) -> bool:
        spec = self._stream_of(topic)
        name = durable_name(topic, group)
        try:
            resp = await self._api(f"CONSUMER.DELETE.{spec.name}.{name}", None, what=f"delete consumer {name}")
        except _ApiError as e:
            if e.err_code in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND):
                return False
            raise
        deleted = bool(resp.get("success"))
        if deleted:
            logger.info("jetstream_consumer_deleted", extra={"stream": spec.name, "consumer": name})
        return deleted

    async def _list_streams(self, pattern: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            resp = await self._api("STREAM.LIST", {"offset": offset, "subject": pattern}, what="list streams")
            streams = resp.get("streams") or []
            out.extend(streams)
            offset += len(streams)
            if not streams or offset >= int(resp.get("total", 0) or 0):
                return out

    async def _list_consumers_of(self, stream: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            try:
                resp = await self._api(f"CONSUMER.LIST.{stream}", {"offset": offset}, what=f"list consumers of {stream}")
            except _ApiError as e:
                if e.err_code == ERR_STREAM_NOT_FOUND:
                    return out
                raise
            consumers = resp.get("consumers") or []
            out.extend(consumers)
            offset += len(consumers)
            if not consumers or offset >= int(resp.get("total", 0) or 0):
                return out

    async def list_consumers(self, pattern: str) -> list[SubscriptionRef]:
        topics.validate_pattern(pattern)
        refs: set[SubscriptionRef] = set()
        for info in await self._list_streams(pattern):
            cfg = info.get("config") or {}
            stream = str(cfg.get("name", ""))
            subjects = cfg.get("subjects") or []
            if not stream.startswith(topics.STREAM_PREFIX):
                continue  # another application's stream on a shared account
            if not any(topics.overlaps(s, pattern) for s in subjects):
                continue
            for ci in await self._list_consumers_of(stream):
                ccfg = ci.get("config") or {}
                name = str(ci.get("name", ""))
                if not ccfg.get("durable_name"):
                    continue  # ephemeral (broadcast) consumers are never subscriptions
                meta = ccfg.get("metadata") or {}
                topic, group = meta.get(META_TOPIC), meta.get(META_GROUP)
                if (
                    not isinstance(topic, str)
                    or not isinstance(group, str)
                    or ccfg.get("durable_name") != name
                    or durable_name(topic, group) != name
                ):
                    logger.warning(
                        "jetstream_subscription_unnamed",
                        extra={"stream": stream, "consumer": name, "meta_topic": topic, "meta_group": group},
                    )
                    continue
                if topics.matches(pattern, topic):
                    refs.add(SubscriptionRef(topic, group))
        return sorted(refs)

    async def consumer_info(self, topic: str, group: str) -> Optional[dict[str, Any]]:
        """The broker's view of the durable (topic, group), or None when it does not exist."""
        spec = self._stream_of(topic)
        try:
            return await self._api(f"CONSUMER.INFO.{spec.name}.{durable_name(topic, group)}", None, what="consumer info")
        except _ApiError as e:
            if e.err_code in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND):
                return None
            raise

    async def backlog(self, topic: str, group: str) -> int:
        info = await self.consumer_info(topic, group)
        if info is None:
            return 0
        return int(info.get("num_pending", 0) or 0) + int(info.get("num_ack_pending", 0) or 0)

    async def open_puller(self, topic: str, group: str) -> JetStreamPuller:
        spec = self._stream_of(topic)
        self._require_connected()
        puller = JetStreamPuller(self, spec.name, durable_name(topic, group), topic, group)
        try:
            await puller._open_sub()
        except _NATS_ERRORS as e:
            raise Unavailable(f"cannot open a puller on {topic!r}: {e!r}") from e
        self._pullers.add(puller)
        return puller

    # -- dead letters ---------------------------------------------------------------

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        limit = int(limit)
        if limit <= 0:
            return []
        spec = topics.DLQ_STREAM
        await self._ensure_stream(spec)
        name = "crewlet_dlq_read_" + secrets.token_hex(8)
        cfg = {
            "name": name,
            "deliver_policy": "all",
            "ack_policy": "none",
            "inactive_threshold": int(30 * _NS),
            "replay_policy": "instant",
            "mem_storage": True,
        }
        await self._api(
            f"CONSUMER.CREATE.{spec.name}.{name}",
            {"stream_name": spec.name, "config": cfg, "action": "create"},
            what="create dead-letter reader",
        )
        out: list[DeadLetter] = []
        sub: Any = None
        try:
            inbox = self._nc.new_inbox()
            sub = await self._nc.subscribe(inbox, pending_msgs_limit=0, pending_bytes_limit=0)
            await self._nc.publish(
                f"{API_PREFIX}.CONSUMER.MSG.NEXT.{spec.name}.{name}",
                b'{"batch":%d,"no_wait":true}' % limit,
                reply=inbox,
            )
            while len(out) < limit:
                msg = await keeping_cancel(sub.next_msg(timeout=self._api_timeout_s))
                if not msg.reply:
                    break  # 404: nothing more
                out.append(dead_letter_from(msg.headers or {}, msg.data, str(_stream_seq(msg.reply))))
        except _NATS_ERRORS as e:
            raise Unavailable(f"reading dead letters failed: {e!r}") from e
        finally:
            if sub is not None and not self._nc.is_closed:
                try:
                    await sub.unsubscribe()
                except Exception:
                    pass
            try:
                await self._api(f"CONSUMER.DELETE.{spec.name}.{name}", None, what="delete dead-letter reader", timeout=2.0)
            except QueueError:
                pass
        return out

    @staticmethod
    def _dead_letter_seq(ref: str) -> int:
        """``ref`` as a CREWLET_DLQ sequence; 0 when it cannot name one (never sent to the broker)."""
        return dead_letter_seq(ref)

    async def dead_letter(self, ref: str) -> DeadLetter:
        seq = self._dead_letter_seq(ref)
        spec = topics.DLQ_STREAM
        if seq == 0:
            raise Gone(f"dead letter {ref!r} is not on {spec.name}")
        await self._ensure_stream(spec)
        self._require_connected()
        try:
            raw = await keeping_cancel(self._nc.jsm(timeout=self._api_timeout_s).get_msg(spec.name, seq=seq))
        except nats.js.errors.APIError as e:
            if _message_not_found(e):
                raise Gone(f"dead letter {ref!r} is not on {spec.name}") from e
            raise Unavailable(f"reading dead letter {ref!r} failed: {e}") from e
        except _NATS_ERRORS as e:
            raise Unavailable(f"reading dead letter {ref!r} failed: {e!r}") from e
        return dead_letter_from(raw.headers or {}, raw.data or b"", str(seq))

    async def delete_dead_letter(self, ref: str) -> bool:
        """``STREAM.MSG.DELETE`` by sequence: the broker applies it once; a second finds no message (404)."""
        seq = self._dead_letter_seq(ref)
        spec = topics.DLQ_STREAM
        if seq == 0:
            return False
        self._require_connected()
        try:
            return bool(await keeping_cancel(self._nc.jsm(timeout=self._api_timeout_s).delete_msg(spec.name, seq)))
        except nats.js.errors.APIError as e:
            if _message_not_found(e):
                return False
            # A refusal in words this build does not know: whether the entry is
            # still there is the whole question, so ask that rather than guess.
            try:
                await self.dead_letter(ref)
            except Gone:
                return False
            except QueueError:
                pass
            raise Unavailable(f"deleting dead letter {ref!r} failed: {e}") from e
        except _NATS_ERRORS as e:
            raise Unavailable(f"deleting dead letter {ref!r} failed: {e!r}") from e

    # -- broadcast --------------------------------------------------------------------

    async def open_broadcast(self, pattern: str, on_message: Callable[[str, bytes], Awaitable[None]]) -> Closable:
        specs = topics.streams_for_pattern(pattern)
        self._require_connected()
        parts: list[_BroadcastStream] = []
        try:
            for spec in specs:
                await self._ensure_stream(spec)
                part = _BroadcastStream(self, spec, pattern, on_message)
                parts.append(part)
                await part.start()
        except BaseException as e:
            for part in parts:
                try:
                    await part.close()
                except Exception:
                    pass
            if isinstance(e, _NATS_ERRORS):
                raise Unavailable(f"cannot open a broadcast on {pattern!r}: {e!r}") from e
            raise
        broadcast = _Broadcast(self, parts)
        self._closables.add(broadcast)
        return broadcast

    # -- scatter / gather (core NATS, no stream) ------------------------------------------

    async def ask(self, subject: str, request: bytes, want: int, timeout_s: float) -> list[bytes]:
        topics.validate_subject(subject)
        if len(request) > MAX_PAYLOAD_BYTES:
            raise TooLarge(f"request of {len(request)} bytes is over {MAX_PAYLOAD_BYTES}")
        if want <= 0:
            return []
        self._require_connected()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(float(timeout_s), 0.0)
        answers: list[bytes] = []
        sub: Any = None
        try:
            inbox = self._nc.new_inbox()
            sub = await self._nc.subscribe(inbox, pending_msgs_limit=0, pending_bytes_limit=0)
            await self._nc.publish(subject, bytes(request), reply=inbox)
        except nats.errors.MaxPayloadError as e:
            await self._unsubscribe_quietly(sub)
            raise TooLarge(f"request of {len(request)} bytes is over the broker's max_payload") from e
        except nats.errors.BadSubjectError as e:
            await self._unsubscribe_quietly(sub)
            raise InvalidArgument(f"subject={subject!r}: {e!r}") from e
        except _NATS_ERRORS as e:
            await self._unsubscribe_quietly(sub)
            raise Unavailable(f"ask on {subject!r} failed: {e!r}") from e
        try:
            while len(answers) < want:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    msg = await keeping_cancel(sub.next_msg(timeout=left))
                except nats.errors.TimeoutError:
                    break
                except _NATS_ERRORS:
                    break  # the connection went away: what arrived is the answer
                if msg.headers and msg.headers.get("Status"):
                    if _status_of(msg)[0] == "503":
                        break  # nobody serves the subject
                    continue
                answers.append(msg.data)
        finally:
            await self._unsubscribe_quietly(sub)
        return answers

    async def _unsubscribe_quietly(self, sub: Any) -> None:
        if sub is None or self._nc.is_closed:
            return
        try:
            await sub.unsubscribe()
        except Exception:
            pass

    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> Closable:
        topics.validate_subject(subject)
        self._require_connected()
        server = _Server(self, subject, answer)
        try:
            await server.start()
        except nats.errors.BadSubjectError as e:
            raise InvalidArgument(f"subject={subject!r}: {e!r}") from e
        except _NATS_ERRORS as e:
            raise Unavailable(f"serve on {subject!r} failed: {e!r}") from e
        self._closables.add(server)
        return server

    # -- closing ------------------------------------------------------------------------

    def sever(self) -> None:
        """What a killed process leaves behind: the connection drops without another byte.

        Nothing buffered (an ack, a hand-back, an in-progress signal) reaches
        the broker and the client does not reconnect, so the broker gets this
        client's mail back only when each message's ack clock runs out.
        """
        self._nc.options["allow_reconnect"] = False
        self._nc._pending = []  # nats-py's write buffer: dropped, as a killed process's would be
        self._nc._pending_data_size = 0
        writer = getattr(self._nc._transport, "_io_writer", None)
        if writer is not None:
            writer.transport.abort()

    async def close(self) -> None:
        if self._closed:
            return
        for puller in list(self._pullers):
            try:
                await puller.close()
            except Exception:
                logger.debug("jetstream_puller_close_failed", exc_info=True)
        for closable in list(self._closables):
            try:
                await closable.close()
            except Exception:
                logger.debug("jetstream_close_failed", exc_info=True)
        self._closables.clear()
        self._closed = True
        if not self._nc.is_closed:
            try:
                if self._nc.is_connected:
                    await self._nc.flush(timeout=2)
            except Exception:
                pass
            try:
                await self._nc.close()
            except Exception:
                logger.debug("jetstream_nats_close_failed", exc_info=True)
        logger.info("jetstream_closed", extra={"url": self._url})


class JetStreamQueue:
    """The JetStream-backed :class:`~crewlet.queue.contract.EventQueue`."""

    name = "jetstream"

    @staticmethod
    async def connect(
        url: str,
        node: str = "n1",
        timings: Timings = Timings(),
        event_retention_hours: float = 720.0,
        memory_storage: bool = False,
        *,
        replicas: int = 1,
        connect_timeout_s: float = 5.0,
    ) -> EventQueue:
        """Dial ``url``, provision the streams, and return the shared client over JetStream."""
        from crewlet.queue.client import QueueClient

        transport = await JetStreamTransport.connect(
            url,
            node=node,
            timings=timings,
            event_retention_hours=event_retention_hours,
            memory_storage=memory_storage,
            replicas=replicas,
            connect_timeout_s=connect_timeout_s,
        )
        return QueueClient(transport, node=node, timings=timings)


__all__ = [
    "JetStreamQueue",
    "JetStreamTransport",
    "JetStreamPuller",
    "JetStreamMessage",
    "durable_name",
    "stream_config",
    "consumer_config",
    "broadcast_config",
    "is_subset",
    "redact_url",
    "MAX_MESSAGE_BYTES",
    "WIRE_HEADROOM_BYTES",
    "META_TOPIC",
    "META_GROUP",
    "BROADCAST_PREFIX",
]
