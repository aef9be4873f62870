"""Publishing telemetry: build an event, publish it, and never let its failure fail the work.

Telemetry is every event that records what happened (a turn's start, a skip,
an audit) rather than carrying work: the work already happened, so a publish
that fails is logged and the caller goes on. What it must not be is silently
lost because the broker was away for the seconds a restart takes: the event
store is written from the publish path, so a dropped publish is a missing
row forever. So an :class:`Emitter` keeps an event whose publish failed with
``Unavailable`` (the broker cannot be reached right now) and retries it in the
background with a doubling backoff, for at most ``retry_window_s`` from its
first failure and at most ``max_pending`` events at once; the oldest is
dropped first, each drop a counted log line, so an outage longer than the
window costs a bounded, reported number of rows and a few seconds' restart
costs none. A failure retrying cannot cure (too large, a closed client, a
refused argument) is logged and dropped at once.

Work — an inbox wake, an A2A ask whose caller answers 503 — is not
telemetry: it is published directly, and its failure is the caller's to raise.

The engine owns one ``Emitter`` (``Engine.emitter``) that every service it
runs publishes through, and closes it once they have all stopped; a service
built outside an engine (a test's) makes its own and closes it at its stop.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import Any, Optional

from crewlet.events.envelope import Event, new
from crewlet.events.trace import Trace
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import QueueError, Unavailable

log = logging.getLogger("crewlet.queue.emit")

#: How long an event is retried after its first failed publish: a broker restart takes seconds.
RETRY_WINDOW_S = 30.0
#: The most events held for retry at once; past it the oldest is dropped.
MAX_PENDING = 1000
#: The first retry's delay, doubled after each pass the broker is still away, up to RETRY_MAX_S.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 4.0

# Log event names.
LOG_RETRIED = "telemetry_publish_retried"
LOG_DROPPED = "telemetry_publish_dropped"
LOG_EXPIRED = "telemetry_publish_expired"
LOG_UNSENT = "telemetry_publish_unsent"


@dataclass
class _Held:
    topic: str
    event: Event
    log_event: str
    fields: dict[str, Any]
    deadline: float


class Emitter:
    """Publishes telemetry on one queue; a failed publish is logged and, when the broker is away, retried.

    ``emit`` and ``publish`` never raise a queue error: they return once the
    event is published, refused for good, or held for the background retry.
    """

    def __init__(
        self,
        queue: EventQueue,
        *,
        retry_window_s: float = RETRY_WINDOW_S,
        max_pending: int = MAX_PENDING,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.queue = queue
        self.retry_window_s = float(retry_window_s)
        self.max_pending = int(max_pending)
        self.retry_first_s = float(retry_first_s)
        self.retry_max_s = max(float(retry_max_s), self.retry_first_s)
        self._held: collections.deque[_Held] = collections.deque()
        self._task: Optional[asyncio.Task[None]] = None
        self._closed = False
        #: Events published on a retry, dropped for room, and given up when their window ran out.
        self.retried = 0
        self.dropped = 0
        self.expired = 0

    @property
    def pending(self) -> int:
        """How many events are held for the background retry."""
        return len(self._held)

    async def emit(
        self,
        body: Any,
        trace: Trace,
        *,
        log_event: str,
        topic: Optional[str] = None,
        source: str = "",
        extras: Optional[dict[str, Any]] = None,
        level: int = logging.WARNING,
        **log_fields: Any,
    ) -> Event:
        """Build the event of a typed ``body`` under ``trace`` and publish it (to its event topic by default).

        ``log_event`` names the log line a failure writes, with ``log_fields``
        and the event's type; the event is returned either way.
        """
        event = new(body, trace, source=source, extras=extras)
        await self.publish(topic or topics.event(event.type), event, log_event=log_event, level=level, **log_fields)
        return event

    async def publish(
        self, topic: str, event: Event, *, log_event: str, level: int = logging.WARNING, **log_fields: Any
    ) -> bool:
        """Publish a built event; True when the broker has it now, False when it failed (and may be retried)."""
        fields = {"type": event.type, "event_id": event.id, "topic": topic, **log_fields}
        try:
            await self.queue.publish(topic, event)
            return True
        except Unavailable:
            retrying = not self._closed
            log.log(level, log_event, extra={**fields, "retrying": retrying}, exc_info=True)
            if retrying:
                self._hold(topic, event, log_event, fields)
            return False
        except (QueueError, OSError):
            log.log(level, log_event, extra={**fields, "retrying": False}, exc_info=True)
            return False

    def _hold(self, topic: str, event: Event, log_event: str, fields: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        while len(self._held) >= self.max_pending:
            oldest = self._held.popleft()
            self.dropped += 1
            log.warning(LOG_DROPPED, extra={**oldest.fields, "dropped": self.dropped, "max_pending": self.max_pending})
        self._held.append(_Held(topic, event, log_event, fields, loop.time() + self.retry_window_s))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._retry(), name="telemetry-retry")

    def _expire(self, now: float) -> None:
        while self._held and self._held[0].deadline <= now:
            gone = self._held.popleft()
            self.expired += 1
            log.warning(LOG_EXPIRED, extra={**gone.fields, "expired": self.expired, "window_s": self.retry_window_s})

    async def _retry(self) -> None:
        """Publish the held events oldest first, backing off while the broker stays away; ends when none is left.

        The wait between passes is a backoff against an unreachable broker,
        not a readiness poll: a pass that gets through publishes everything
        held at once, and an event held past its window is given up.
        """
        loop = asyncio.get_running_loop()
        delay = self.retry_first_s
        while self._held:
            await asyncio.sleep(min(delay, max(self._held[0].deadline - loop.time(), 0.0)))
            self._expire(loop.time())
            while self._held:
                held = self._held[0]
                try:
                    await self.queue.publish(held.topic, held.event)
                except Unavailable:
                    break
                except (QueueError, OSError):
                    self._held.popleft()
                    log.warning(held.log_event, extra={**held.fields, "retrying": False}, exc_info=True)
                    continue
                self._held.popleft()
                self.retried += 1
                log.info(LOG_RETRIED, extra={**held.fields, "retried": self.retried})
                delay = self.retry_first_s
            else:
                return
            delay = min(delay * 2, self.retry_max_s)

    async def close(self) -> None:
        """Stop retrying; what is still held is one counted log line, not a silent loss."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._held:
            log.warning(LOG_UNSENT, extra={"unsent": len(self._held), "types": sorted({h.event.type for h in self._held})})
            self._held.clear()


__all__ = [
    "Emitter",
    "LOG_DROPPED",
    "LOG_EXPIRED",
    "LOG_RETRIED",
    "LOG_UNSENT",
    "MAX_PENDING",
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "RETRY_WINDOW_S",
]
