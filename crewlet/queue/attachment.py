"""One consume loop of the queue client: fetch while the gate is open, dispatch, settle.

:class:`~crewlet.queue.client.QueueClient` decides the contract's semantics;
each subscription it attaches runs one ``_Attachment`` here, over the
transport's puller for its durable (topic, group) (``_Pair``). The loop
delivers one message at a time, or drains a batch and hands it to the
handler partition by partition (``partition_drain``), and settles through
the client's :class:`~crewlet.queue.settler.Settler`, which owns the delivery
budget and the dead-letter decision. Of the client itself a loop needs only
what :class:`AttachmentHost` names.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Optional, Protocol, Sequence, Union

from crewlet.base.aio import close_each
from crewlet.events import Event
from crewlet.events.types import DEAD_LETTER_UNDECODABLE
from crewlet.queue.contract import (
    BatchHandler,
    BatchOptions,
    Delivery,
    Handler,
    Outcome,
    Partition,
    remaining_after,
)
from crewlet.queue.errors import Gone, Unavailable
from crewlet.queue.transport import Puller, RawMessage

if TYPE_CHECKING:
    from crewlet.queue.settler import Settler

logger = logging.getLogger(__name__)

#: Spacing between attempts to reach a broker that is away.
_UNAVAILABLE_RETRY_S = 0.2
#: Marks a message this attachment no longer holds.
_NOT_HELD = -1.0


class _Pair:
    """This client's view of one durable (topic, group): its holds and attachments."""

    __slots__ = ("topic", "group", "holds", "attachments")

    def __init__(self, topic: str, group: str) -> None:
        self.topic = topic
        self.group = group
        self.holds: set[str] = set()
        self.attachments: list[_Attachment] = []

    def detach(self, atts: list[_Attachment]) -> bool:
        """Detach each of ``atts`` not detached yet; the pair's holds go with them. Whether any was."""
        found = False
        for att in atts:
            if att.detached:
                continue
            found = True
            att.detached = True
            att.poke()
            if att in self.attachments:
                self.attachments.remove(att)
        if found:
            self.holds.clear()
        return found


class AttachmentHost(Protocol):
    """What a consume loop needs of the client that attached it (:class:`~crewlet.queue.client.QueueClient`).

    The gate's client-wide half, where background work and handlers run, and
    the ack clock: the rest of the client's semantics stay the client's.
    """

    @property
    def closed(self) -> bool: ...

    @property
    def delivery_paused(self) -> bool: ...

    @property
    def poll_s(self) -> float: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def keep_alive(self) -> None: ...

    async def call_handler(self, fn: Callable[[Any], Awaitable[Any]], arg: Any) -> Outcome: ...

    def loop_started(self, attachment: _Attachment) -> None: ...

    def loop_ended(self, attachment: _Attachment) -> None: ...


class _Attachment:
    """One consume loop: fetch when the gate is open, dispatch, settle.

    ``held`` is every message this loop fetched and has not settled, in fetch
    order (with when it was fetched), whether its handler runs (``running``),
    a batch is still collecting it, or its partition waits behind another.
    The client keeps each one's ack clock running while it is held, and
    nothing leaves the loop still held: a stop (pause of all delivery, a
    detach, close) hands back at once what no handler is working on, and the
    loop's end hands back whatever a cancelled handler was working on.
    """

    def __init__(
        self,
        client: AttachmentHost,
        settler: Settler,
        pair: _Pair,
        puller: Puller,
        handler: Union[Handler, BatchHandler],
        options: Optional[BatchOptions],
    ) -> None:
        self.client = client
        self.settler = settler
        self.pair = pair
        self.puller = puller
        self.handler = handler
        self.options = options
        self.quiesced = False
        self.detached = False
        self.wake = asyncio.Event()
        self.task: Optional[asyncio.Task[None]] = None
        self.held: dict[RawMessage, float] = {}
        self.running: frozenset[RawMessage] = frozenset()

    # -- the gate -----------------------------------------------------------

    def ready(self) -> bool:
        c = self.client
        return not (self.detached or self.quiesced or self.pair.holds or c.delivery_paused or c.closed)

    def stopping(self) -> bool:
        """Closed for this process rather than for this seat: all delivery paused, detached, or closed."""
        c = self.client
        return self.detached or c.delivery_paused or c.closed

    def poke(self) -> None:
        """The gate may have changed: wake the loop, and end a waiting fetch if it closed.

        On a stop, what was fetched and is not being handled goes back now,
        not after the running handler: the next process (or another member)
        gets it in milliseconds. A quiesce or a hold leaves it to the loop,
        which hands it back once the running handler returns, as before.
        """
        self.wake.set()
        if not self.ready():
            self.puller.interrupt(leaving=self.stopping())
            if self.stopping():
                waiting = [msg for msg in self.held if msg not in self.running]
                if waiting:
                    self.client.spawn(self._give_back(waiting))

    # -- what this loop holds -------------------------------------------------

    def _take(self, msgs: Sequence[RawMessage]) -> None:
        now = time.monotonic()
        for msg in msgs:
            self.held[msg] = now
        self.client.keep_alive()

    def _forget(self, msg: RawMessage) -> bool:
        """Stop holding ``msg``; False when it was settled or handed back already."""
        return self.held.pop(msg, _NOT_HELD) != _NOT_HELD

    async def _give_back(self, msgs: Sequence[RawMessage]) -> None:
        """Hand back at the head each of ``msgs`` this loop still holds (durably when it is :meth:`stopping`)."""
        for msg in msgs:
            if self._forget(msg):
                await self.settler.hand_back(self.pair, msg, leaving=self.stopping())

    def start(self) -> None:
        self.client.loop_started(self)
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"queue-consume:{self.pair.topic}:{self.pair.group}"
        )

    # -- the loop -------------------------------------------------------------

    async def _run(self) -> None:
        topic, group = self.pair.topic, self.pair.group
        try:
            while not self.detached and not self.client.closed:
                if not self.ready():
                    self.wake.clear()
                    if not self.ready():
                        await self.wake.wait()
                    continue
                max_n = 1 if self.options is None else self.options.effective_max_batch()
                try:
                    msgs = await self.puller.fetch(max_n, self.client.poll_s, self.ready)
                except Unavailable:
                    await asyncio.sleep(_UNAVAILABLE_RETRY_S)
                    continue
                except Gone:
                    logger.warning("queue_subscription_gone", extra={"topic": topic, "group": group})
                    self.pair.detach([self])
                    break
                if not msgs:
                    continue
                self._take(msgs)
                if self.options is None:
                    await self._deliver_one(msgs)
                else:
                    await self._drain(msgs)
        except asyncio.CancelledError:
            raise
        except Exception:  # the loop must never die silently
            logger.exception("queue_consume_loop_failed", extra={"topic": topic, "group": group})
        finally:
            self.running = frozenset()
            if self.held:
                # A handler cancelled at the end of a stop's grace, or a loop that
                # failed: its mail goes back now instead of waiting out the ack clock.
                left = list(self.held)
                logger.info("queue_handed_back_on_stop", extra={"topic": topic, "group": group, "messages": len(left)})
                try:
                    await self._give_back(left)
                except Exception:
                    logger.warning("queue_hand_back_on_stop_failed", extra={"topic": topic, "group": group}, exc_info=True)
            self.client.loop_ended(self)
            await close_each([self.puller], logger, "queue_puller_close_failed")

    async def _handle(self, msgs: list[RawMessage], fn: Any, arg: Any) -> Outcome:
        """Run the handler with ``msgs`` marked as being worked on (a stop leaves them to it)."""
        self.running = frozenset(msgs)
        try:
            return await self.client.call_handler(fn, arg)
        finally:
            self.running = frozenset()

    async def _decoded(self, msg: RawMessage) -> Optional[Event]:
        """The event ``msg`` carries; None when it carries none, and then buried if this loop still held it."""
        event = self.settler.decode_or_bury(self.pair, msg)
        if event is None and self._forget(msg):
            await self.settler.bury(self.pair, msg, reason=DEAD_LETTER_UNDECODABLE)
        return event

    async def _deliver_one(self, msgs: Sequence[RawMessage]) -> None:
        for i, msg in enumerate(msgs):
            if not self.ready():
                await self._give_back(msgs[i:])
                return
            if msg not in self.held:
                continue  # handed back by a stop meanwhile
            event = await self._decoded(msg)
            if event is None:
                continue
            delivery = Delivery(event=event, topic=self.pair.topic, remaining=remaining_after(msg.delivered))
            outcome = await self._handle([msg], self.handler, delivery)
            await self._settle([msg], outcome)

    async def _drain(self, first: Sequence[RawMessage]) -> None:
        """Steps 1-4 of the batch drain (design: Inbox Batching & Coalescing)."""
        assert self.options is not None
        opts = self.options
        cap = opts.effective_max_batch()
        linger = opts.effective_linger_s()
        msgs = list(first[:cap])
        await self._give_back(list(first[cap:]))  # a backend that overdelivered: give the surplus back untouched
        loop = asyncio.get_running_loop()
        deadline = loop.time() + linger
        while len(msgs) < cap and self.ready():
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                more = await self.puller.fetch(cap - len(msgs), min(left, self.client.poll_s), self.ready)
            except (Unavailable, Gone):
                break
            self._take(more)
            msgs.extend(more)
        if not self.ready():
            # A pause, hold, quiesce or detach taken during collection: nothing
            # collected may start a turn. Being drained was the delivery.
            await self._give_back(msgs)
            return

        decoded: list[tuple[int, RawMessage, Event]] = []
        for idx, msg in enumerate(msgs):
            event = await self._decoded(msg)
            if event is None:
                continue
            decoded.append((idx, msg, event))
        partitions = partition_drain(opts, decoded)

        for pi, (key, items) in enumerate(partitions):
            if not self.ready():
                await self._give_back([msg for _, rest in partitions[pi:] for _, msg, _ in rest])
                return
            items = [item for item in items if item[1] in self.held]  # a stop may have handed some back
            if not items:
                continue
            partition = Partition(
                key=key,
                deliveries=tuple(
                    Delivery(event=ev, topic=self.pair.topic, remaining=remaining_after(msg.delivered))
                    for _, msg, ev in items
                ),
            )
            outcome = await self._handle([msg for _, msg, _ in items], self.handler, partition)
            await self._settle([msg for _, msg, _ in items], outcome)

    async def _settle(self, msgs: list[RawMessage], outcome: Outcome) -> None:
        settler = self.settler
        mine = [msg for msg in msgs if self._forget(msg)]
        if outcome is Outcome.ACK:
            for msg in mine:
                await settler.ack(self.pair, msg)
        elif outcome is Outcome.NAK:
            for msg in mine:
                await settler.nak(self.pair, msg)
        else:  # DEFER: back at the head, and this attachment stops taking work
            leaving = self.stopping()  # a turn turned away by a stop (the gate closed): durably
            self.quiesced = True
            for msg in mine:
                await settler.hand_back(self.pair, msg, leaving=leaving)


def partition_drain(
    options: BatchOptions, items: list[tuple[int, RawMessage, Event]]
) -> list[tuple[str, list[tuple[int, RawMessage, Event]]]]:
    """Group a drain by key; oldest conversation first; events in timestamp order.

    Ties keep arrival order (the index). Ordering uses the events' own
    timestamps, never how the drain was assembled, so a redelivered event
    rejoins its conversation where it belongs.
    """
    drained_at = datetime.now(timezone.utc)

    def age(item: tuple[int, RawMessage, Event]) -> tuple[datetime, int]:
        # An unusable stamp (Go's zero time from another build) counts as drained
        # now: it must neither jump every queue nor switch aging off.
        ts = item[2].timestamp
        return (ts if ts.year > 1 else drained_at, item[0])

    by_key: dict[str, list[tuple[int, RawMessage, Event]]] = {}
    for item in items:
        by_key.setdefault(options.key_of(item[2]), []).append(item)
    parts = []
    for key, members in by_key.items():
        members.sort(key=age)
        parts.append(((age(members[0])[0], min(it[0] for it in members)), key, members))
    parts.sort(key=lambda p: p[0])
    return [(key, members) for _, key, members in parts]
