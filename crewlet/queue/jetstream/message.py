"""One fetched JetStream message and how it is settled (ack, nak, term, in progress)."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from crewlet.queue.errors import Unavailable
from crewlet.queue.jetstream.wire import _NATS_ERRORS, _num_delivered


#: A Nak delayed by one nanosecond. An immediate Nak only queues a message for redelivery in
#: the running broker's memory; the consumer's stored state keeps the delivery's timestamp,
#: so a broker that loads the consumer afresh (restarted, or a new leader) redelivers it only
#: when its ack clock runs out. A delayed Nak makes nats-server rewrite the stored timestamp
#: to "ack clock ran out ``delay`` from now" (``processNak`` -> ``updateDelivered``, persisted
#: and replicated): a running broker redelivers it on its next pending check (10 ms), one
#: that loads the consumer does so as it starts (0.5-1.5 s), ahead of never-delivered mail.
NAK_EXPIRED = b'-NAK {"delay": 1}'


async def nak_expired(nc: NatsClient, reply: str) -> None:
    """Send :data:`NAK_EXPIRED` for the delivery whose ack subject is ``reply``, confirmed when connected."""
    if not nc.is_connected:
        await _settle("nak", nc.publish(reply, NAK_EXPIRED))
        return  # buffered; it goes out on reconnect
    try:
        await nc.request(reply, NAK_EXPIRED, timeout=5)
    except _NATS_ERRORS as e:
        raise Unavailable(f"handing back a message failed: {e!r}") from e


async def _settle(verb: str, call: Awaitable[None]) -> bool:
    """Send one settlement (``verb`` names it in the error); False when the message was settled already.

    A second settlement of one delivery is not an error to the caller: the
    first one stands, and the broker's view of the message is what it made it.
    """
    try:
        await call
    except nats.errors.MsgAlreadyAckdError:
        return False
    except _NATS_ERRORS as e:
        raise Unavailable(f"{verb} failed: {e!r}") from e
    return True


class JetStreamMessage:
    """One fetched, unsettled JetStream message (a :class:`~crewlet.queue.transport.RawMessage`)."""

    __slots__ = ("_msg", "_nc", "_unsubscribing", "data", "delivered")

    def __init__(self, msg: Msg, nc: NatsClient, unsubscribing: Callable[[], bool] = lambda: False) -> None:
        self._msg = msg
        self._nc = nc
        self._unsubscribing = unsubscribing
        self.data: bytes = msg.data
        self.delivered: int = _num_delivered(msg.reply)

    async def _behind_unsubscribes(self) -> None:
        """Let a puller's UNSUB reach the wire before this hand-back.

        A Nak makes the message available at once; a pull request that a
        hold or a quiesce just gave up is still live on the broker until its
        UNSUB arrives, and would be handed the message again (an orphan,
        Nak'ed once more: a delivery the message never had a turn for).
        """
        if self._unsubscribing():
            await asyncio.sleep(0)

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def headers(self) -> dict[str, str]:
        return dict(self._msg.headers or {})

    async def ack(self) -> None:
        await _settle("ack", self._msg.ack())

    async def nak(self, delay_s: float) -> None:
        await self._behind_unsubscribes()
        await _settle("nak", self._msg.nak(delay=delay_s if delay_s and delay_s > 0 else None))

    async def nak_head(self) -> None:
        """An immediate Nak the broker confirms: the next fetch cannot race it (ARCHITECTURE: broker facts).

        A flush only proves the Nak reached the server; the consumer works its
        acks off an internal queue afterwards, so a fetch sent right behind it
        could still be handed the next message. Sent as a request, the Nak is
        answered once the consumer has processed it (JetStream replies to any
        acknowledgement that carries a reply subject).
        """
        msg = self._msg
        if msg._ackd:
            return
        msg._ackd = True
        await self._behind_unsubscribes()
        if not self._nc.is_connected:
            await _settle("nak", self._nc.publish(msg.reply, Msg.Ack.Nak))
            return  # buffered; it goes out on reconnect
        try:
            await self._nc.request(msg.reply, Msg.Ack.Nak, timeout=5)
        except _NATS_ERRORS as e:
            raise Unavailable(f"handing back a message failed: {e!r}") from e

    async def nak_leaving(self) -> None:
        """A hand-back by a consumer that is going away: :data:`NAK_EXPIRED`, which the broker stores.

        ``up`` stops its embedded broker with it, so what a clean stop handed
        back with :meth:`nak_head` waited out its ack clock after the restart.
        Not used while the consumer stays: the delayed Nak is back on the
        broker's next pending check, not before the reply, so the consumer's
        own next fetch could race it.
        """
        msg = self._msg
        if msg._ackd:
            return
        msg._ackd = True
        await self._behind_unsubscribes()
        await nak_expired(self._nc, msg.reply)

    async def term(self) -> None:
        await _settle("term", self._msg.term())

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
