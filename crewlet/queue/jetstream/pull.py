"""Pulling from a durable: one pull request per fetch, each on its own reply subject.

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
import logging
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Optional

from nats.aio.msg import Msg

from crewlet.base.aio import spawn_kept
from crewlet.queue.errors import Gone, Unavailable
from crewlet.queue.jetstream.message import JetStreamMessage, nak_expired
from crewlet.queue.jetstream.wire import _NATS_ERRORS, _ApiError, _status_of, consumer_deleted, next_subject, pull_request

if TYPE_CHECKING:
    from crewlet.queue.jetstream.base import TransportBase

logger = logging.getLogger(__name__)

#: How long a client waits past a pull request's expiry for the broker's status.
_FETCH_GRACE_S = 0.5
#: Below this a fetch is a pure no-wait poll (no expiry on the request).
_MIN_EXPIRES_S = 0.01


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

    def __init__(self, transport: "TransportBase", stream: str, consumer: str, topic: str, group: str) -> None:
        self._t = transport
        self._nc = transport._nc
        self.stream = stream
        self.consumer = consumer
        self.topic = topic
        self.group = group
        self._next_subject = next_subject(stream, consumer)
        self._sub: Any = None
        self._prefix = ""
        self._gen = 0
        self._seq = 0
        self._active: Optional[_Fetch] = None
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        #: The caller is going away (``interrupt(leaving=True)``, ``close``, a cancelled fetch):
        #: mail arriving for an ended request goes back with the stored Nak.
        self._leaving = False

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
            if consumer_deleted(status, desc):
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
            f.msgs.append(JetStreamMessage(msg, self._nc, lambda: self._t._unsub_pending > 0))
            if len(f.msgs) >= f.max_n:
                f.terminated = True  # the batch is complete: the broker sends nothing more for it
                f.finish()
            return
        # Delivered for a request we gave up on: never hold it.
        await self._hand_back(msg)

    async def fetch(self, max_n: int, timeout_s: float, ready: Callable[[], bool]) -> list[JetStreamMessage]:
        if self._closed or not ready():
            return []
        self._leaving = False
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
            if wait < _MIN_EXPIRES_S:
                wait = 0.0
            body = pull_request(n, wait, no_wait=True)
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
            self._leaving = True  # only a stop cancels a consume loop's fetch
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
            await self._t._consumer_info(self.stream, self.consumer)
        except _ApiError as e:
            if e.no_consumer:
                raise Gone(f"the durable {self.consumer} on {self.stream} does not exist") from e
            raise
        raise Unavailable(f"the durable {self.consumer} on {self.stream} did not answer a pull")

    def interrupt(self, leaving: bool = False) -> None:
        """End a waiting fetch now, and take its request off the broker.

        The reply subscription is retired at once (its UNSUB is queued on the
        connection before anything this transport publishes next), so mail
        published after a hold, a quiesce or a detach is not delivered into a
        request nobody waits on, and keeps its delivery count. ``leaving``:
        what still arrives for it goes back with the stored Nak.
        """
        if leaving:
            self._leaving = True
        f = self._active
        if f is not None and not f.done:
            f.finish()
            self._retire_sub()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        spawn_kept(self._background, coro)

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
            await self._hand_back(m._msg)

    async def _hand_back(self, msg: Msg) -> None:
        """Nak mail nobody will handle; stored (``nak_expired``) when the caller is going away."""
        try:
            if self._leaving or self._closed:
                await nak_expired(self._nc, msg.reply)
            else:
                await msg.nak()
        except Exception:
            logger.debug("jetstream_orphan_nak_failed", exc_info=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.interrupt(leaving=True)
        self._retire_sub()
        self._t._pullers.discard(self)
        if self._background:
            await asyncio.wait(list(self._background), timeout=6.0)

    def __repr__(self) -> str:
        return f"<JetStreamPuller {self.stream}/{self.consumer}>"
