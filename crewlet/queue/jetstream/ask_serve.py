"""Scatter/gather on core NATS (no stream): ``ask`` gathers answers, ``serve`` answers."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

import nats.errors
from nats.aio.msg import Msg

from crewlet.base.aio import keeping_cancel, spawn_kept
from crewlet.queue import topics
from crewlet.queue.contract import MAX_PAYLOAD_BYTES, Closable
from crewlet.queue.errors import InvalidArgument, NoAnswer, TooLarge, Unavailable
from crewlet.queue.jetstream.base import TransportBase
from crewlet.queue.jetstream.wire import _NATS_ERRORS, _status_of, ordered_flush

logger = logging.getLogger(__name__)

#: How long closing a server waits for answers in flight before cancelling them.
_SERVE_CLOSE_WAIT_S = 60.0


class _Server:
    def __init__(self, transport: "TransportBase", subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None:
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
        spawn_kept(self._tasks, self._answer(msg))

    async def _answer(self, msg: Msg) -> None:
        try:
            reply = await self._answer_fn(msg.data)
        except asyncio.CancelledError:
            raise
        except NoAnswer as declined:
            logger.debug("jetstream_serve_declined", extra={"subject": self.subject, "reason": str(declined)})
            return
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


class AskServePart(TransportBase):
    """Request/reply without a stream: nothing is stored, an answer goes to whoever asked."""

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
