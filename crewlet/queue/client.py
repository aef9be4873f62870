"""The one implementation of the queue contract's semantics, over any Transport.

Both certified backends are this client over their own broker primitives, so
the gates (quiesce, holds, pause, detach), the batch drain, the delivery budget,
the dead-letter decision, node stamping and publish listeners are decided in
exactly one place. A backend cannot model them differently because it does not
model them at all.

Each subscription's consume loop (fetch, dispatch, the batch drain) is
``crewlet.queue.attachment``; it settles through this client's
:class:`~crewlet.queue.settler.Settler`, and asks the client itself only what
:class:`~crewlet.queue.attachment.AttachmentHost` names.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Awaitable, Callable, Coroutine, Final, Optional

from crewlet.base.aio import close_each, keeping_cancel, spawn_kept
from crewlet.events import Event
from crewlet.base.logfmt import short_reason
from crewlet.queue import topics
from crewlet.queue.attachment import _Attachment, _Pair
from crewlet.queue.contract import (
    MAX_PAYLOAD_BYTES,
    BatchHandler,
    BatchOptions,
    Closable,
    DeadLetter,
    Delivery,
    Handler,
    MAX_DELIVERIES,
    Outcome,
    Partition,
    PUBLISHED_FAILED,
    PUBLISHED_OK,
    PublishListener,
    QueueObserver,
    StreamHandler,
    SubscriptionRef,
    Timings,
)
from crewlet.queue.errors import Gone, InvalidArgument, NotLive, QueueError, TooLarge, Unavailable, Unconfirmed
from crewlet.queue.settler import Settler
from crewlet.queue.transport import DUPLICATE_WINDOW_S, H_MSG_ID, Transport, replay_msg_id

logger = logging.getLogger(__name__)

#: How long close() waits for a running handler before cancelling its loop.
_CLOSE_GRACE_S = 10.0


def _validate_group(group: str) -> str:
    if not isinstance(group, str) or not group or not group.strip() or any(ord(c) < 32 for c in group):
        raise InvalidArgument(f"group={group!r}: must be a non-empty printable string")
    return group


def _outcome(result: Any) -> Outcome:
    if result is None:
        return Outcome.ACK
    if isinstance(result, Outcome):
        return result
    logger.warning("queue_handler_bad_outcome", extra={"returned": repr(result)[:200]})
    return Outcome.NAK


def _first_delivery(arg: Any) -> bool:
    """Whether every message a handler was called with is on its first delivery (a batch: all of them)."""
    deliveries = arg.deliveries if isinstance(arg, Partition) else [arg] if isinstance(arg, Delivery) else []
    return all(d.remaining == MAX_DELIVERIES - 1 for d in deliveries)




class _SubscriptionHandle:
    """The :class:`~crewlet.queue.contract.Subscription` a subscribe call returns."""

    def __init__(self, client: "QueueClient", attachment: _Attachment) -> None:
        self._client = client
        self._att = attachment
        self.ref = SubscriptionRef(attachment.pair.topic, attachment.pair.group)

    @property
    def options(self) -> Optional[BatchOptions]:
        return self._att.options

    async def quiesce(self) -> bool:
        return self._set_quiesced(True)

    async def unquiesce(self) -> bool:
        return self._set_quiesced(False)

    def _set_quiesced(self, quiesced: bool) -> bool:
        """Quiescing an attached consumer always takes (it is idempotent); unquiescing says whether one was lifted."""
        self._client._live()
        if self._att.detached or not (quiesced or self._att.quiesced):
            return False
        self._att.quiesced = quiesced
        self._att.poke()
        return True

    async def detach(self) -> bool:
        self._client._live()
        return self._att.pair.detach([self._att])

    async def hold(self, key: str) -> None:
        await self._client.hold(self.ref.topic, self.ref.group, key)

    async def release(self, key: str) -> None:
        await self._client.release(self.ref.topic, self.ref.group, key)

    def __repr__(self) -> str:
        return f"<Subscription {self.ref.topic} {self.ref.group}>"


class _Broadcast:
    def __init__(self, client: "QueueClient", inner: Closable) -> None:
        self._client = client
        self._inner = inner
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client._closables.discard(self)
        await self._inner.close()


class QueueClient:
    """An :class:`~crewlet.queue.contract.EventQueue` over one Transport."""

    def __init__(self, transport: Transport, *, node: str = "", timings: Timings = Timings()) -> None:
        self.transport: Final[Transport] = transport
        #: The node id stamped on each event this client publishes that names none ("" stamps nothing).
        self.node: Final[str] = node or ""
        self._timings = timings
        self._listeners: list[PublishListener] = []
        self._observers: list[QueueObserver] = []
        self._settler = Settler(self.transport, self._timings, self._observers, self.publish)
        self._pairs: dict[tuple[str, str], _Pair] = {}
        self._paused = False
        self._closed = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closables: set[Any] = set()
        #: Every consume loop still running, attached or already detached (its handler may run on).
        self._attachments: set[_Attachment] = set()
        #: Hand-backs a stop started outside a consume loop.
        self._background: set[asyncio.Task[None]] = set()
        self._keepalive: Optional[asyncio.Task[None]] = None

    # -- identity -------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.transport.name

    @property
    def connected(self) -> bool:
        """Open, and the transport's broker connection is up (``/healthz``)."""
        return not self._closed and self.transport.is_connected

    @property
    def closed(self) -> bool:
        """Closed: every consume loop ends, and every verb but ``close`` raises NotLive."""
        return self._closed

    @property
    def poll_s(self) -> float:
        """How long one fetch of a consume loop waits before it looks at its gate again (the transport's)."""
        return self.transport.poll_s

    async def round_trip(self, timeout_s: float) -> None:
        """The broker answers within ``timeout_s`` (a frozen broker keeps its socket, so ``connected`` cannot tell)."""
        self._live()
        await self.transport.round_trip(timeout_s)

    def _live(self) -> None:
        if self._closed:
            raise NotLive()

    # -- publishing -----------------------------------------------------------

    def encode(self, topic: str, event: Event) -> tuple[Event, bytes]:
        """Validate and stamp: the copy the broker gets, never the caller's object."""
        if not isinstance(event, Event):
            raise InvalidArgument(f"publish to {topic!r}: an Event is required, got {type(event).__name__}")
        topics.validate_subject(topic)
        stamped = event if (event.node or not self.node) else dataclasses.replace(event, node=self.node)
        data = stamped.to_json()
        if len(data) > MAX_PAYLOAD_BYTES:
            raise TooLarge(f"event {event.id} is {len(data)} bytes; the limit is {MAX_PAYLOAD_BYTES}")
        return stamped, data

    async def publish(self, topic: str, event: Event) -> None:
        self._live()
        _, data = self.encode(topic, event)
        try:
            await self.transport.publish(topic, data)
        except Exception as exc:
            self._observe_publish(topic, event, PUBLISHED_FAILED)
            if isinstance(exc, Unconfirmed):
                # The event may be on the stream with no publish listener run for it: named, so it can be found.
                logger.warning("queue_publish_unconfirmed", extra={"topic": topic, "event_id": event.id, "type": event.type})
            raise
        self._observe_publish(topic, event, PUBLISHED_OK)
        if self._listeners:
            stamped = Event.from_json(data)
            for fn in list(self._listeners):
                try:
                    await fn(topic, stamped)
                except Exception:  # telemetry must not be able to fail a publish
                    logger.exception("queue_publish_listener_failed", extra={"topic": topic, "event_id": event.id})

    def add_publish_listener(self, fn: PublishListener) -> None:
        self._live()
        self._listeners.append(fn)

    def add_observer(self, observer: QueueObserver) -> None:
        self._live()
        self._observers.append(observer)

    def _observe_publish(self, topic: str, event: Event, outcome: str) -> None:
        for observer in self._observers:
            try:
                observer.published(topic, event, outcome)
            except Exception:  # counting must not be able to fail a publish
                logger.exception("queue_observer_failed", extra={"topic": topic})

    def held_count(self, topic: str, group: str) -> int:
        pair = self._pairs.get((topic, group))
        if pair is None:
            return 0
        return sum(len(att.held) for att in self._attachments if att.pair is pair)

    # -- durable subscriptions -----------------------------------------------

    async def ensure_subscription(self, topic: str, group: str) -> bool:
        self._live()
        topics.validate_subject(topic)
        _validate_group(group)
        return await self.transport.ensure_consumer(topic, group)

    async def delete_subscription(self, topic: str, group: str) -> bool:
        self._live()
        topics.validate_subject(topic)
        _validate_group(group)
        pair = self._pairs.get((topic, group))
        if pair is not None:
            pair.detach(list(pair.attachments))
        return await self.transport.delete_consumer(topic, group)

    async def list_subscriptions(self, pattern: str) -> list[SubscriptionRef]:
        self._live()
        topics.validate_pattern(pattern)
        refs = await self.transport.list_consumers(pattern)
        return sorted(set(refs), key=lambda r: (r.topic, r.group))

    async def backlog(self, topic: str, group: str) -> int:
        self._live()
        return await self.transport.backlog(topic, group)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        self._live()
        return await self.transport.dead_letters(limit)

    @staticmethod
    def _kept_stream(pattern: str) -> topics.StreamSpec:
        """The one stream keeping one message per subject that ``pattern`` names; InvalidArgument otherwise."""
        found = topics.streams_for_pattern(pattern)
        if len(found) != 1 or not found[0].per_subject_last:
            raise InvalidArgument(f"pattern={pattern!r}: must name subjects of one stream that keeps one message per subject")
        return found[0]

    async def read_last(self, pattern: str) -> list[tuple[str, Event]]:
        self._live()
        out: list[tuple[str, Event]] = []
        for subject, data in await self.transport.read_subjects(self._kept_stream(pattern), pattern):
            try:
                out.append((subject, Event.from_json(data)))
            except Exception as exc:  # one undecodable message costs itself, never the replay
                logger.warning("queue_replay_undecodable", extra={"topic": subject, "error": short_reason(exc)})
        return out

    async def purge(self, pattern: str) -> int:
        self._live()
        return await self.transport.purge_subjects(self._kept_stream(pattern), pattern)

    async def replay_dead_letter(self, ref: str) -> DeadLetter:
        """Publish the entry's bytes onto its topic, then take it off CREWLET_DLQ (see the contract).

        Publish first, so a failure anywhere leaves the entry where it was and
        nothing is lost. Every replay of one entry publishes under the same
        ``Nats-Msg-Id``, so of two racing replays the broker's duplicate window
        stores one; the take (delete by sequence) succeeds once and says which.
        """
        self._live()
        if not isinstance(ref, str) or not ref.strip():
            raise Gone(f"dead letter ref={ref!r}: no such entry")
        letter = await self.transport.dead_letter(ref)
        topics.validate_subject(letter.topic)
        await self._refuse_dropping(letter)
        try:
            await self.transport.publish(letter.topic, letter.data, {H_MSG_ID: replay_msg_id(ref)})
        except QueueError as e:
            raise Unavailable(f"replaying dead letter {ref} onto {letter.topic!r} failed (it stays): {e}") from e
        try:
            taken = await self.transport.delete_dead_letter(ref)
        except QueueError as e:
            logger.warning("dead_letter_replayed_not_taken", extra={"ref": ref, "topic": letter.topic})
            raise Unavailable(
                f"dead letter {ref} was replayed onto {letter.topic!r} but is still listed: {e}; "
                f"a replay again within {DUPLICATE_WINDOW_S:g} s publishes nothing twice"
            ) from e
        if not taken:
            raise Gone(f"dead letter {ref} was replayed or removed meanwhile")
        logger.info(
            "dead_letter_replayed",
            extra={"ref": ref, "topic": letter.topic, "group": letter.group, "deliveries": letter.deliveries},
        )
        return letter

    async def _refuse_dropping(self, letter: DeadLetter) -> None:
        """A mailbox topic nobody's subscription covers drops a publish: refuse rather than lose the event."""
        if topics.stream_for(letter.topic).retention != "interest":
            return
        if not await self.transport.list_consumers(letter.topic):
            raise InvalidArgument(
                f"no durable subscription reads {letter.topic!r} any more: replaying dead letter {letter.ref} would drop it"
            )

    async def subscribe(self, topic: str, group: str, handler: Handler) -> _SubscriptionHandle:
        return await self._attach(topic, group, handler, None)

    async def subscribe_batch(
        self, topic: str, group: str, options: BatchOptions, handler: BatchHandler
    ) -> _SubscriptionHandle:
        if not isinstance(options, BatchOptions):
            raise InvalidArgument("subscribe_batch needs BatchOptions")
        return await self._attach(topic, group, handler, options)

    async def _attach(
        self, topic: str, group: str, handler: Any, options: Optional[BatchOptions]
    ) -> _SubscriptionHandle:
        self._live()
        topics.validate_subject(topic)
        _validate_group(group)
        if not callable(handler):
            raise InvalidArgument("handler must be an async callable")
        await self.transport.ensure_consumer(topic, group)
        puller = await self.transport.open_puller(topic, group)
        if self._closed:
            await puller.close()
            raise NotLive()
        pair = self._pair(topic, group)
        att = _Attachment(self, self._settler, pair, puller, handler, options)
        pair.attachments.append(att)
        att.start()
        return _SubscriptionHandle(self, att)

    def _pair(self, topic: str, group: str) -> _Pair:
        pair = self._pairs.get((topic, group))
        if pair is None:
            pair = self._pairs[(topic, group)] = _Pair(topic, group)
        return pair

    # -- letting go -------------------------------------------------------------

    async def detach(self, topic: str, group: str) -> bool:
        self._live()
        pair = self._pairs.get((topic, group))
        if pair is None:
            return False
        return pair.detach(list(pair.attachments))

    async def quiesce(self, topic: str, group: str) -> bool:
        self._live()
        pair = self._pairs.get((topic, group))
        if pair is None or not pair.attachments:
            return False
        for att in pair.attachments:
            att.quiesced = True
            att.poke()
        return True

    async def unquiesce(self, topic: str, group: str) -> bool:
        self._live()
        pair = self._pairs.get((topic, group))
        changed = False
        for att in pair.attachments if pair else []:
            if att.quiesced:
                att.quiesced = False
                att.poke()
                changed = True
        return changed

    async def hold(self, topic: str, group: str, key: str) -> None:
        self._live()
        pair = self._pair(topic, group)
        pair.holds.add(key)
        for att in pair.attachments:
            att.poke()

    async def release(self, topic: str, group: str, key: str) -> None:
        self._live()
        pair = self._pairs.get((topic, group))
        if pair is None or key not in pair.holds:
            return
        pair.holds.discard(key)
        for att in pair.attachments:
            att.poke()

    def held(self, topic: str, group: str) -> frozenset[str]:
        """The hold keys this client has on the pair (for the dashboard's seat state)."""
        pair = self._pairs.get((topic, group))
        return frozenset(pair.holds) if pair else frozenset()

    async def pause_delivery(self) -> None:
        self._live()
        self._paused = True
        self._poke_all()

    async def resume_delivery(self) -> None:
        self._live()
        self._paused = False
        self._poke_all()

    @property
    def delivery_paused(self) -> bool:
        """All delivery paused (``pause_delivery``): no consume loop of this client starts a handler."""
        return self._paused

    def _poke_all(self) -> None:
        for pair in self._pairs.values():
            for att in pair.attachments:
                att.poke()

    # -- the ack clock, kept running while mail is held -------------------------

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` (a stop's hand-back) as a task this client keeps, and awaits as it closes."""
        spawn_kept(self._background, coro)

    def loop_started(self, attachment: _Attachment) -> None:
        """``attachment``'s loop runs: its held mail is kept alive, and close waits for it."""
        self._attachments.add(attachment)

    def loop_ended(self, attachment: _Attachment) -> None:
        """``attachment``'s loop is over: it holds nothing any more."""
        self._attachments.discard(attachment)

    def keep_alive(self) -> None:
        """Start the in-progress signaller, once, when this client first holds mail."""
        if self._closed or (self._keepalive is not None and not self._keepalive.done()):
            return
        self._keepalive = asyncio.get_running_loop().create_task(self._signal_progress(), name="queue-keepalive")

    async def _signal_progress(self) -> None:
        """Every ``progress_every_s``: tell the broker each held message is still being worked on.

        One loop for the whole client, covering every held message of every
        consume loop (running, collected, waiting behind another partition),
        so the ack clock only runs out on mail whose process died, or whose
        handler has held it past ``progress_limit_s``.
        """
        every = self._timings.progress_every_s
        limit = self._timings.progress_limit_s
        while not self._closed:
            await asyncio.sleep(every)
            now = time.monotonic()
            for att in list(self._attachments):
                for msg, since in list(att.held.items()):
                    if now - since >= limit or msg not in att.held:
                        continue
                    try:
                        await msg.in_progress()
                    except QueueError:
                        logger.debug("queue_progress_failed", exc_info=True)

    # -- handlers in flight -----------------------------------------------------

    def in_flight(self) -> int:
        return self._in_flight

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            await keeping_cancel(asyncio.wait_for(self._idle.wait(), timeout=max(timeout_s, 0)))
        except asyncio.TimeoutError:
            return self._in_flight == 0
        return True

    async def call_handler(self, fn: Callable[[Any], Awaitable[Any]], arg: Any) -> Outcome:
        """Run a subscription's handler on ``arg``, counted in flight; what it returned or raised as an Outcome."""
        self._in_flight += 1
        self._idle.clear()
        try:
            return _outcome(await fn(arg))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # One short line per failed delivery; the traceback only while it is a first delivery,
            # so a poison message retried 25 times does not log 25 tracebacks.
            first = _first_delivery(arg)
            logger.warning("queue_handler_failed", extra={"error": short_reason(exc)}, exc_info=first)
            return Outcome.NAK
        finally:
            self._in_flight = max(self._in_flight - 1, 0)
            if self._in_flight == 0:
                self._idle.set()

    # -- broadcast and scatter ---------------------------------------------------

    async def subscribe_stream(self, pattern: str, handler: StreamHandler) -> _Broadcast:
        self._live()
        topics.streams_for_pattern(pattern)  # refuses a pattern spanning every namespace

        async def on_message(subject: str, data: bytes) -> None:
            try:
                event = Event.from_json(data)
            except Exception:
                logger.warning("queue_stream_undecodable", extra={"subject": subject})
                return
            try:
                await handler(subject, event)
            except Exception:
                logger.exception("queue_stream_handler_failed", extra={"subject": subject})

        inner = await self.transport.open_broadcast(pattern, on_message)
        sub = _Broadcast(self, inner)
        self._closables.add(sub)
        return sub

    async def ask(self, subject: str, request: bytes, want: int, timeout_s: float) -> list[bytes]:
        self._live()
        topics.validate_subject(subject)
        if len(request) > MAX_PAYLOAD_BYTES:
            raise TooLarge(f"request of {len(request)} bytes is over {MAX_PAYLOAD_BYTES}")
        if want <= 0:
            return []
        return await self.transport.ask(subject, bytes(request), int(want), max(float(timeout_s), 0.0))

    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> _Broadcast:
        self._live()
        topics.validate_subject(subject)
        inner = await self.transport.serve(subject, answer)
        sub = _Broadcast(self, inner)
        self._closables.add(sub)
        return sub

    # -- closing -------------------------------------------------------------------

    async def close(self, grace_s: Optional[float] = None) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = []
        for att in list(self._attachments):
            att.poke()  # hands back at once what no handler is working on
            if att.task is not None and att.task is not asyncio.current_task():
                tasks.append(att.task)
        grace = _CLOSE_GRACE_S if grace_s is None else max(float(grace_s), 0.0)
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=grace) if grace > 0 else (set(), set(tasks))
            pending = {task for task in pending if not task.done()}
            for task in pending:
                task.cancel()  # each loop hands back what its handler held as it ends
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.gather(self._keepalive, return_exceptions=True)
        await close_each(self._closables, logger, "queue_close_closable_failed")
        self._pairs.clear()
        self._listeners.clear()
        self._observers.clear()
        await self.transport.close()
