"""The in-memory twin: a broker object plus N clients, certified like the real one.

It models the semantics, not just the plumbing: streams with interest or
limits retention, durable consumers positioned at DeliverAll, encoded bytes
(never objects), per-consumer delivery counts, the ack clock, Nak to the back
of the mailbox (the backoff modelled virtually, with no timer), hand-backs at
the head, in-progress signals that restart the ack clock, dead letters on
CREWLET_DLQ and NATS wildcards (``topics.matches``).
Everything the contract decides is the shared :class:`QueueClient`'s.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Optional

from crewlet.base.aio import keeping_cancel, spawn_kept
from crewlet.queue import memory_subjects, topics
from crewlet.queue.client import QueueClient
from crewlet.queue.contract import MAX_PAYLOAD_BYTES, Closable, DeadLetter, SubscriptionRef, Timings, dead_letter_seq
from crewlet.queue.errors import Gone, NoAnswer, TooLarge, Unavailable
from crewlet.queue.transport import DUPLICATE_WINDOW_S, H_MSG_ID, Transport, dead_letter_from

logger = logging.getLogger(__name__)


@dataclass
class _Stored:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    stored_at: float
    #: Consumers that have not yet acked or terminated this message.
    pending: set[tuple[str, str]] = field(default_factory=set)


class _Stream:
    def __init__(self, spec: topics.StreamSpec) -> None:
        self.spec = spec
        self.messages: dict[int, _Stored] = {}
        #: Nats-Msg-Id -> when it was stored: a second publish under it inside the window is dropped.
        self.msg_ids: dict[str, float] = {}

    def duplicate(self, msg_id: str, now: float) -> bool:
        """JetStream's duplicate window: True (drop it) when ``msg_id`` was stored within it."""
        for seen in [k for k, at in self.msg_ids.items() if now - at >= DUPLICATE_WINDOW_S]:
            del self.msg_ids[seen]
        if msg_id in self.msg_ids:
            return True
        self.msg_ids[msg_id] = now
        return False


class _Signal:
    """Wake every waiter at once; a fresh event per generation."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    def fire(self) -> None:
        old, self._event = self._event, asyncio.Event()
        old.set()


class _Consumer:
    def __init__(self, topic: str, group: str, stream: _Stream) -> None:
        self.topic = topic
        self.group = group
        self.stream = stream
        self.available: deque[int] = deque()
        #: How many entries at the front of ``available`` are redeliveries (hand-backs
        #: and expired acks): JetStream's redelivery queue, served first and in FIFO order.
        self.head = 0
        self.delivered: dict[int, int] = {}
        #: seq -> (delivery token, ack deadline on the monotonic clock)
        self.inflight: dict[int, tuple[int, float]] = {}
        self.signal = _Signal()
        self.deleted = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.topic, self.group)


class MemoryBroker:
    """The broker half of the twin; ``client(node=...)`` makes its clients."""

    def __init__(self, timings: Timings = Timings(), *, event_retention_hours: float = topics.DEFAULT_EVENT_RETENTION_HOURS) -> None:
        self.timings = timings
        self.event_retention_hours = event_retention_hours
        self.available = True
        self._streams: dict[str, _Stream] = {}
        self._consumers: dict[tuple[str, str], _Consumer] = {}
        self._seq = itertools.count(1)
        self._tokens = itertools.count(1)
        self._broadcasts: list[_MemoryBroadcast] = []
        self._servers: dict[str, list[_MemoryServer]] = {}

    def client(self, node: str = "") -> QueueClient:
        return QueueClient(MemoryTransport(self), node=node, timings=self.timings)

    # -- outage simulation --------------------------------------------------------

    def go_away(self) -> None:
        """Make the broker unreachable: every broker verb raises Unavailable."""
        self.available = False

    def come_back(self) -> None:
        self.available = True
        for consumer in self._consumers.values():
            consumer.signal.fire()

    def _reach(self) -> None:
        if not self.available:
            raise Unavailable("memory broker is unreachable")

    # -- streams ----------------------------------------------------------------

    def _stream(self, spec: topics.StreamSpec) -> _Stream:
        stream = self._streams.get(spec.name)
        if stream is None:
            stream = self._streams[spec.name] = _Stream(spec)
        return stream

    def _max_age_s(self, spec: topics.StreamSpec) -> Optional[float]:
        if spec.max_age == "events":
            return self.event_retention_hours * 3600.0
        if spec.max_age == "config":
            return topics.CONFIG_MAX_AGE_S
        return None

    def _expire(self, stream: _Stream) -> None:
        max_age = self._max_age_s(stream.spec)
        if max_age is None:
            return
        floor = time.monotonic() - max_age
        for seq in [s for s, m in stream.messages.items() if m.stored_at < floor]:
            self._drop(stream, seq)

    def _drop(self, stream: _Stream, seq: int) -> None:
        stream.messages.pop(seq, None)
        for consumer in self._consumers.values():
            if consumer.stream is stream:
                consumer.inflight.pop(seq, None)
                consumer.delivered.pop(seq, None)
                try:
                    index = consumer.available.index(seq)
                except ValueError:
                    continue
                del consumer.available[index]
                if index < consumer.head:
                    consumer.head -= 1

    def publish(self, subject: str, data: bytes, headers: Optional[Mapping[str, str]] = None) -> int:
        """Store ``data``; the sequence it was stored at, 0 when nothing was (a duplicate, an unread mailbox)."""
        self._reach()
        if len(data) > MAX_PAYLOAD_BYTES:
            raise TooLarge(f"{len(data)} bytes is over {MAX_PAYLOAD_BYTES}")
        spec = topics.stream_for(subject)
        stream = self._stream(spec)
        msg_id = (headers or {}).get(H_MSG_ID)
        if msg_id and stream.duplicate(msg_id, time.monotonic()):
            return 0  # acknowledged as a duplicate and stored nowhere, as JetStream does
        interested = [c for c in self._consumers.values() if c.stream is stream and topics.matches(c.topic, subject)]
        payload = bytes(data)
        if spec.retention == "interest" and not interested:
            stored = None  # the mailbox semantic: nobody's subscription covers it
        else:
            if spec.per_subject_last:
                for seq in [s for s, m in stream.messages.items() if m.subject == subject]:
                    self._drop(stream, seq)
            seq = next(self._seq)
            stored = _Stored(seq, subject, payload, dict(headers or {}), time.monotonic())
            stored.pending = {c.key for c in interested}
            stream.messages[seq] = stored
            for consumer in interested:
                consumer.available.append(seq)
                consumer.signal.fire()
        for broadcast in list(self._broadcasts):
            broadcast.offer(subject, payload)
        return stored.seq if stored is not None else 0

    # -- consumers -----------------------------------------------------------------

    def ensure_consumer(self, topic: str, group: str) -> bool:
        self._reach()
        if (topic, group) in self._consumers:
            return False
        stream = self._stream(topics.stream_for(topic))
        self._expire(stream)
        consumer = _Consumer(topic, group, stream)
        for seq in sorted(stream.messages):  # DeliverAll
            stored = stream.messages[seq]
            if topics.matches(topic, stored.subject):
                consumer.available.append(seq)
                stored.pending.add(consumer.key)
        self._consumers[consumer.key] = consumer
        return True

    def delete_consumer(self, topic: str, group: str) -> bool:
        self._reach()
        consumer = self._consumers.pop((topic, group), None)
        if consumer is None:
            return False
        consumer.deleted = True
        consumer.signal.fire()
        for seq in list(consumer.stream.messages):
            self._settled(consumer, seq)
        return True

    def list_consumers(self, pattern: str) -> list[SubscriptionRef]:
        self._reach()
        return [SubscriptionRef(t, g) for (t, g) in self._consumers if topics.matches(pattern, t)]

    def consumer(self, topic: str, group: str) -> _Consumer:
        self._reach()
        consumer = self._consumers.get((topic, group))
        if consumer is None:
            raise Gone(f"no durable subscription {topic!r} / {group!r}")
        return consumer

    def _settled(self, consumer: _Consumer, seq: int) -> None:
        """This consumer is done with ``seq``; an interest stream forgets it once all are."""
        consumer.inflight.pop(seq, None)
        consumer.delivered.pop(seq, None)
        stored = consumer.stream.messages.get(seq)
        if stored is None:
            return
        stored.pending.discard(consumer.key)
        if consumer.stream.spec.retention == "interest" and not stored.pending:
            consumer.stream.messages.pop(seq, None)

    def _reclaim_expired(self, consumer: _Consumer) -> Optional[float]:
        """The ack clock: an unacked delivery past ack_wait returns at the head.

        Returns the next deadline still running, so a waiting fetch wakes for it.
        """
        now = time.monotonic()
        expired = sorted(seq for seq, (_, deadline) in consumer.inflight.items() if deadline <= now)
        for seq in expired:
            consumer.inflight.pop(seq)
            self._to_head(consumer, seq)
        if expired:
            consumer.signal.fire()
        return min((d for _, d in consumer.inflight.values()), default=None)

    def take(self, consumer: _Consumer, max_n: int) -> list["_MemoryMessage"]:
        out: list[_MemoryMessage] = []
        while consumer.available and len(out) < max_n:
            seq = consumer.available.popleft()
            if consumer.head:
                consumer.head -= 1
            stored = consumer.stream.messages.get(seq)
            if stored is None:
                continue
            count = consumer.delivered.get(seq, 0) + 1
            consumer.delivered[seq] = count
            token = next(self._tokens)
            consumer.inflight[seq] = (token, time.monotonic() + self.timings.ack_wait_s)
            out.append(_MemoryMessage(self, consumer, seq, token, stored.data, count))
        return out

    def progress(self, msg: "_MemoryMessage") -> None:
        """JetStream's ``+WPI``: the delivery is still being worked on; its ack clock starts again."""
        self._reach()
        consumer = msg.consumer
        current = consumer.inflight.get(msg.seq)
        if consumer.deleted or current is None or current[0] != msg.token:
            return  # settled, or the clock already took it back: a late signal changes nothing
        consumer.inflight[msg.seq] = (msg.token, time.monotonic() + self.timings.ack_wait_s)

    def settle(self, msg: "_MemoryMessage", how: str) -> None:
        self._reach()
        consumer = msg.consumer
        current = consumer.inflight.get(msg.seq)
        if consumer.deleted or current is None or current[0] != msg.token:
            return  # the ack clock already took it back; this settlement is stale
        if how in ("ack", "term"):
            self._settled(consumer, msg.seq)
            return
        consumer.inflight.pop(msg.seq)
        if how == "nak":
            consumer.available.append(msg.seq)  # the backoff, modelled: behind the waiting mail
        else:
            self._to_head(consumer, msg.seq)  # a hand-back keeps its place
        consumer.signal.fire()

    @staticmethod
    def _to_head(consumer: _Consumer, seq: int) -> None:
        """Ahead of never-delivered mail, behind earlier redeliveries (FIFO, as JetStream does)."""
        consumer.available.insert(consumer.head, seq)
        consumer.head += 1

    def backlog(self, topic: str, group: str) -> int:
        self._reach()
        consumer = self._consumers.get((topic, group))
        if consumer is None:
            return 0
        return len(consumer.available) + len(consumer.inflight)

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        self._reach()
        stream = self._streams.get(topics.DLQ_STREAM.name)
        if stream is None:
            return []
        self._expire(stream)
        out = []
        for seq in sorted(stream.messages)[: max(limit, 0)]:
            m = stream.messages[seq]
            out.append(dead_letter_from(m.headers, m.data, str(seq)))
        return out

    def _dead_letter_seq(self, ref: str) -> tuple[Optional[_Stream], int]:
        """The DLQ stream (after expiry) and ``ref`` as a sequence; 0 when it names none."""
        self._reach()
        stream = self._streams.get(topics.DLQ_STREAM.name)
        if stream is not None:
            self._expire(stream)
        return stream, dead_letter_seq(ref)

    def dead_letter(self, ref: str) -> DeadLetter:
        stream, seq = self._dead_letter_seq(ref)
        stored = stream.messages.get(seq) if stream is not None else None
        if stored is None:
            raise Gone(f"dead letter {ref!r} is not on {topics.DLQ_STREAM.name}")
        return dead_letter_from(stored.headers, stored.data, str(seq))

    def delete_dead_letter(self, ref: str) -> bool:
        """Like JetStream's message delete: applied once, by sequence; a second delete finds nothing."""
        stream, seq = self._dead_letter_seq(ref)
        if stream is None or seq not in stream.messages:
            return False
        self._drop(stream, seq)
        return True


class _MemoryMessage:
    __slots__ = ("broker", "transport", "consumer", "seq", "token", "data", "delivered")

    def __init__(
        self,
        broker: MemoryBroker,
        consumer: _Consumer,
        seq: int,
        token: int,
        data: bytes,
        delivered: int,
        transport: Optional["MemoryTransport"] = None,
    ):
        self.broker = broker
        self.transport = transport
        self.consumer = consumer
        self.seq = seq
        self.token = token
        self.data = data
        self.delivered = delivered

    def _say(self, how: str) -> None:
        if self.transport is not None and self.transport.severed:
            raise Unavailable("the connection to the memory broker was severed")
        if how == "progress":
            self.broker.progress(self)
        else:
            self.broker.settle(self, how)

    async def ack(self) -> None:
        self._say("ack")

    async def nak(self, delay_s: float) -> None:
        self._say("nak")

    async def nak_head(self) -> None:
        self._say("head")

    async def nak_leaving(self) -> None:
        self._say("head")  # one broker that never restarts: the head is where it stays

    async def term(self) -> None:
        self._say("term")

    async def in_progress(self) -> None:
        self._say("progress")


class _MemoryPuller:
    def __init__(self, broker: MemoryBroker, topic: str, group: str, transport: Optional["MemoryTransport"] = None) -> None:
        self._broker = broker
        self._transport = transport
        self._key = (topic, group)
        self._interrupted = asyncio.Event()

    def interrupt(self, leaving: bool = False) -> None:
        self._interrupted.set()  # the twin checks the gate as it takes mail: nothing arrives for an ended fetch

    async def fetch(self, max_n: int, timeout_s: float, ready: Callable[[], bool]) -> list[_MemoryMessage]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._interrupted.clear()
        while True:
            if self._transport is not None and self._transport.severed:
                raise Unavailable("the connection to the memory broker was severed")
            consumer = self._broker.consumer(*self._key)
            next_deadline = self._broker._reclaim_expired(consumer)
            if ready():
                got = self._broker.take(consumer, max_n)
                if got:
                    for msg in got:
                        msg.transport = self._transport
                    return got
            left = deadline - loop.time()
            if left <= 0 or self._interrupted.is_set():
                return []
            if next_deadline is not None:
                left = min(left, max(next_deadline - time.monotonic(), 0.0) + 0.001)
            signal = consumer.signal.current()
            waiter = asyncio.ensure_future(signal.wait())
            interrupted = asyncio.ensure_future(self._interrupted.wait())
            try:
                await asyncio.wait({waiter, interrupted}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                interrupted.cancel()

    async def close(self) -> None:
        self._interrupted.set()


class _MemoryBroadcast:
    """A topic-filtered publish listener at the broker: from now on, acking nothing."""

    def __init__(self, broker: MemoryBroker, pattern: str, on_message: Callable[[str, bytes], Awaitable[None]]):
        self._broker = broker
        self._pattern = pattern
        self._on_message = on_message
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._closed = False

    def offer(self, subject: str, data: bytes) -> None:
        if not self._closed and topics.matches(self._pattern, subject):
            self._queue.put_nowait((subject, data))

    async def _run(self) -> None:
        while True:
            subject, data = await self._queue.get()
            try:
                await self._on_message(subject, data)
            except Exception:
                logger.exception("memory_broadcast_handler_failed", extra={"subject": subject})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self in self._broker._broadcasts:
            self._broker._broadcasts.remove(self)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class _MemoryServer:
    def __init__(self, broker: MemoryBroker, subject: str, answer: Callable[[bytes], Awaitable[bytes]]):
        self._broker = broker
        self._subject = subject
        self._answer = answer
        self._inflight: set[asyncio.Task[None]] = set()
        self.closed = False

    def request(self, data: bytes, reply: asyncio.Queue[bytes]) -> None:
        async def run() -> None:
            try:
                answer = await self._answer(bytes(data))
            except NoAnswer as declined:
                logger.debug("memory_serve_declined", extra={"subject": self._subject, "reason": str(declined)})
                return
            except Exception:
                logger.warning("memory_serve_answer_failed", extra={"subject": self._subject}, exc_info=True)
                return
            if isinstance(answer, (bytes, bytearray, memoryview)):
                reply.put_nowait(bytes(answer))

        spawn_kept(self._inflight, run())

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        servers = self._broker._servers.get(self._subject, [])
        if self in servers:
            servers.remove(self)
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)


class MemoryTransport(Transport):
    """One client's connection to a :class:`MemoryBroker`."""

    name = "memory"
    poll_s = 5.0  # the twin's fetch is interrupted when the gate closes; no need to poll

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self._closed = False
        self.severed = False

    @property
    def is_connected(self) -> bool:
        return self.broker.available and not self._closed and not self.severed

    def sever(self) -> None:
        """What a killed process leaves behind: from now on nothing this client fetched is settled.

        No hand-back, no in-progress signal: the broker gets this client's
        mail back only when each message's ack clock runs out.
        """
        self.severed = True

    async def publish(self, subject: str, data: bytes, headers: Optional[Mapping[str, str]] = None) -> int:
        return self.broker.publish(subject, data, headers)

    async def ensure_consumer(self, topic: str, group: str) -> bool:
        return self.broker.ensure_consumer(topic, group)

    async def delete_consumer(self, topic: str, group: str) -> bool:
        return self.broker.delete_consumer(topic, group)

    async def list_consumers(self, pattern: str) -> list[SubscriptionRef]:
        return self.broker.list_consumers(pattern)

    async def open_puller(self, topic: str, group: str) -> _MemoryPuller:
        self.broker.consumer(topic, group)
        return _MemoryPuller(self.broker, topic, group, self)

    async def open_broadcast(self, pattern: str, on_message: Callable[[str, bytes], Awaitable[None]]) -> Closable:
        self.broker._reach()
        broadcast = _MemoryBroadcast(self.broker, pattern, on_message)
        self.broker._broadcasts.append(broadcast)
        return broadcast

    async def ask(self, subject: str, request: bytes, want: int, timeout_s: float) -> list[bytes]:
        self.broker._reach()
        replies: asyncio.Queue[bytes] = asyncio.Queue()
        for server in list(self.broker._servers.get(subject, [])):
            server.request(request, replies)
        answers: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(answers) < want:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                answers.append(await keeping_cancel(asyncio.wait_for(replies.get(), timeout=left)))
            except asyncio.TimeoutError:
                break
        return answers

    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> Closable:
        self.broker._reach()
        server = _MemoryServer(self.broker, subject, answer)
        self.broker._servers.setdefault(subject, []).append(server)
        return server

    async def backlog(self, topic: str, group: str) -> int:
        return self.broker.backlog(topic, group)

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        return self.broker.dead_letters(limit)

    async def dead_letter(self, ref: str) -> DeadLetter:
        return self.broker.dead_letter(ref)

    async def delete_dead_letter(self, ref: str) -> bool:
        return self.broker.delete_dead_letter(ref)

    async def read_subjects(self, spec: topics.StreamSpec, pattern: str) -> list[tuple[str, bytes]]:
        return memory_subjects.read_subjects(self.broker, spec, pattern)

    async def purge_subjects(self, spec: topics.StreamSpec, pattern: str) -> int:
        return memory_subjects.purge_subjects(self.broker, spec, pattern)

    async def close(self) -> None:
        self._closed = True
