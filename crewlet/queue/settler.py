"""Settling a delivery: ack, nak, hand-back, the delivery budget and the dead letter.

:class:`~crewlet.queue.client.QueueClient` makes one ``Settler`` and every
consume loop it attaches (``crewlet.queue.attachment``) settles through it,
so the delivery budget, the dead-letter decision and what observers are told
of each settlement are decided in one place for every subscription.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Sequence

from crewlet import events
from crewlet.events import Event, Trace
from crewlet.events.envelope import format_timestamp
from crewlet.events.types import DEAD_LETTER_MAX_DELIVERIES, MessageDeadLettered, MessageRetryScheduled
from crewlet.queue import topics
from crewlet.queue.contract import (
    MAX_DELIVERIES,
    SETTLED_ACK,
    SETTLED_DEAD_LETTER,
    SETTLED_DEFER,
    SETTLED_NAK,
    QueueObserver,
    Timings,
    remaining_after,
)
from crewlet.queue.errors import QueueError
from crewlet.queue.transport import RawMessage, Transport, dead_letter_headers

if TYPE_CHECKING:
    from crewlet.queue.attachment import _Pair

#: The client's logger: a settlement is logged as the client's, whichever loop settled it.
logger = logging.getLogger("crewlet.queue.client")

#: The envelope ``source`` of what the queue itself publishes (a burial's record, a retry's).
_QUEUE_SOURCE = "queue"
#: The types of the queue's own records: never recorded again when one of them fails.
_QUEUE_RECORDS = frozenset({MessageDeadLettered.event_type, MessageRetryScheduled.event_type})


class Settler:
    """How a delivery ends: acked, redelivered, handed back or buried, and who is told.

    ``observers`` is the client's own list (observers added later are told
    too); ``publish`` is the client's publish, so a burial's record is
    stamped, validated and heard by publish listeners like any other event.
    """

    def __init__(
        self,
        transport: Transport,
        timings: Timings,
        observers: Sequence[QueueObserver],
        publish: Callable[[str, Event], Awaitable[None]],
    ) -> None:
        self._transport = transport
        self._timings = timings
        self._observers = observers
        self._publish = publish

    def _observe_settled(self, topic: str, outcome: str, reason: str = "") -> None:
        for observer in self._observers:
            try:
                observer.settled(topic, outcome, reason)
            except Exception:  # counting must not be able to fail a settlement
                logger.exception("queue_observer_failed", extra={"topic": topic})

    def decode_or_bury(self, pair: _Pair, msg: RawMessage) -> Optional[Event]:
        """The event ``msg`` carries, or None (logged) when it is none: the caller buries it if it still holds it."""
        try:
            return Event.from_json(msg.data)
        except Exception:
            logger.error(
                "queue_message_undecodable",
                extra={"topic": pair.topic, "group": pair.group, "bytes": len(msg.data)},
            )
            return None

    async def ack(self, pair: _Pair, msg: RawMessage) -> None:
        """A success; an ack the transport refuses is logged, not raised, like every settlement."""
        try:
            await msg.ack()
        except QueueError:
            logger.warning("queue_ack_failed", exc_info=True)
            return
        self._observe_settled(pair.topic, SETTLED_ACK)

    async def nak(self, pair: _Pair, msg: RawMessage) -> None:
        """A failure: behind the waiting mail after the backoff, or the dead letter.

        A seat's inbox message that comes again is recorded as
        ``message_retry_scheduled`` (which delivery it spent, when it comes
        back), so where it waits is in the history and not the broker's alone.
        """
        delay_s = self._timings.backoff_s(msg.delivered)
        if await self.redeliver_or_bury(pair, msg, lambda: msg.nak(delay_s), "queue_nak_failed", SETTLED_NAK):
            seat = topics.inbox_seat(pair.topic)
            if seat:
                retry_at = format_timestamp(datetime.now(timezone.utc) + timedelta(seconds=delay_s))
                await self._record(
                    msg,
                    lambda original: MessageRetryScheduled(
                        topic=pair.topic,
                        group=pair.group,
                        seat=seat,
                        delivery=msg.delivered,
                        max_deliveries=MAX_DELIVERIES,
                        retry_at=retry_at,
                        **original,
                    ),
                    "queue_retry_unrecorded",
                    {"topic": pair.topic, "group": pair.group, "delivery": msg.delivered},
                )

    async def hand_back(self, pair: _Pair, msg: RawMessage, *, leaving: bool = False) -> None:
        """A hand-back: at the head at once; it spent a delivery like any other.

        ``leaving``: by a consume loop that is going away (a stop, a detach),
        so the hand-back must outlast the broker's memory (``nak_leaving``).
        """
        verb = msg.nak_leaving if leaving else msg.nak_head
        await self.redeliver_or_bury(pair, msg, verb, "queue_hand_back_failed", SETTLED_DEFER)

    async def redeliver_or_bury(
        self,
        pair: _Pair,
        msg: RawMessage,
        redeliver: Callable[[], Awaitable[None]],
        failed_event: str,
        outcome: str,
    ) -> bool:
        """A delivery that did not end in an ack: the dead letter once none remain, else ``redeliver``.

        True when it was handed back to come again. A redelivery the transport
        refuses is logged (``failed_event``), not raised: the handler's outcome
        is settled and the consumer goes on.
        """
        if remaining_after(msg.delivered) == 0:
            await self.bury(pair, msg, reason=DEAD_LETTER_MAX_DELIVERIES)
            return False
        try:
            await redeliver()
        except QueueError:
            logger.warning(failed_event, exc_info=True)
            return False
        self._observe_settled(pair.topic, outcome)
        return True

    async def bury(self, pair: _Pair, msg: RawMessage, *, reason: str) -> None:
        """Copy to CREWLET_DLQ, then terminate; if the copy fails, keep the message.

        Once the copy is stored, the burial is recorded as a
        ``message_dead_lettered`` event, so it is a row in this node's history
        and in the trace of the work it belonged to, not only an entry on a
        stream that ages out.
        """
        headers = dead_letter_headers(pair.topic, pair.group, msg.delivered, reason, time.time())
        try:
            seq = await self._transport.publish(topics.dlq(pair.topic, pair.group), msg.data, headers)
        except QueueError:
            logger.error("queue_dead_letter_failed", extra={"topic": pair.topic, "group": pair.group})
            try:
                await msg.nak(self._timings.backoff_cap_s)
            except QueueError:
                pass
            return
        logger.warning(
            "queue_dead_lettered",
            extra={"topic": pair.topic, "group": pair.group, "deliveries": msg.delivered, "reason": reason},
        )
        try:
            await msg.term()
        except QueueError:
            logger.warning("queue_term_failed", exc_info=True)
        self._observe_settled(pair.topic, SETTLED_DEAD_LETTER, reason)
        await self._record_burial(pair, msg, reason=reason, ref=str(seq) if seq else "")

    async def _record_burial(self, pair: _Pair, msg: RawMessage, *, reason: str, ref: str) -> None:
        """Publish the ``message_dead_lettered`` of one burial (:meth:`_record`)."""
        await self._record(
            msg,
            lambda original: MessageDeadLettered(
                topic=pair.topic,
                group=pair.group,
                seat=topics.inbox_seat(pair.topic),
                ref=ref,
                deliveries=msg.delivered,
                reason=reason,
                **original,
            ),
            "queue_dead_letter_unrecorded",
            {"topic": pair.topic, "group": pair.group, "ref": ref, "reason": reason},
        )

    async def _record(
        self, msg: RawMessage, body_of: Callable[[dict[str, str]], Any], failed_event: str, fields: dict[str, Any]
    ) -> None:
        """Publish the queue's record of what became of ``msg``; a failure is logged (``failed_event``), never raised.

        Under the message's own trace (a child span of it), so the row lands
        in the trace of the delivery it is about; an undecodable message has
        no trace and starts one. ``body_of`` is given the message's
        ``original_id`` and ``original_type``. The queue's record of one of its
        own records is not made, so a consumer failing everything on the event
        stream cannot feed itself a chain of them.
        """
        try:
            original: Optional[Event] = Event.from_json(msg.data)
        except Exception:
            original = None
        if original is not None and original.type in _QUEUE_RECORDS:
            return
        parent = Trace.of(original) if original is not None else None
        body = body_of(
            {
                "original_id": original.id if original is not None else "",
                "original_type": original.type if original is not None else "",
            }
        )
        event = events.new(body, parent.child() if parent is not None else Trace.root(), source=_QUEUE_SOURCE)
        try:
            await self._publish(topics.event(event.type), event)
        except (QueueError, OSError):
            logger.error(failed_event, extra=fields, exc_info=True)
