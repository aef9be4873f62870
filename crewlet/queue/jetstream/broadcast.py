"""Live feeds: one ephemeral, ack-none pull consumer per stream a pattern reaches."""
from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, Awaitable, Callable, Optional

import nats.errors

from crewlet.base.aio import close_each, keeping_cancel
from crewlet.queue import topics
from crewlet.queue.contract import Closable
from crewlet.queue.errors import QueueError, Unavailable
from crewlet.queue.jetstream.configs import BROADCAST_PREFIX, broadcast_config, is_subset
from crewlet.queue.jetstream.pull import _FETCH_GRACE_S
from crewlet.queue.jetstream.streams import StreamsPart
from crewlet.queue.jetstream.wire import (
    _NATS_ERRORS,
    _ApiError,
    _status_of,
    consumer_deleted,
    next_subject,
    pull_request,
)

logger = logging.getLogger(__name__)

#: A broadcast consumer's pull request: batch and expiry.
_BROADCAST_BATCH = 256
_BROADCAST_EXPIRES_S = 5.0


class _BroadcastStream:
    """One ephemeral pull consumer on one stream, dispatching sequentially."""

    def __init__(
        self,
        transport: "StreamsPart",
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
        body = pull_request(_BROADCAST_BATCH, _BROADCAST_EXPIRES_S)
        try:
            await self._nc.publish(next_subject(self.spec.name, self.consumer), body, reply=reply)
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
                if status == "503" or consumer_deleted(status, desc):
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
                    await self._t._consumer_info(self.spec.name, self.consumer)
                    return
                except _ApiError as e:
                    if not e.no_consumer:
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
    def __init__(self, transport: "StreamsPart", parts: list[_BroadcastStream]) -> None:
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


class BroadcastPart(StreamsPart):
    """``open_broadcast``: a feed over every stream the pattern reaches, closed as one."""

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
            await close_each(parts)
            if isinstance(e, _NATS_ERRORS):
                raise Unavailable(f"cannot open a broadcast on {pattern!r}: {e!r}") from e
            raise
        broadcast = _Broadcast(self, parts)
        self._closables.add(broadcast)
        return broadcast
