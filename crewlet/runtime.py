"""The process-wide handle on this process's queue client.

The engine registers its queue here once it is connected (and clears it
before closing it), so code served by the same process — webhook views,
``/healthz`` — publishes through the engine's own connection instead of
dialling the broker again.

A web-only process (no engine) has no queue registered. :func:`aget_queue`
then dials the broker named by the settings (``stream.type: nats``) once,
lazily, on first use; with ``stream.type: embedded`` there is no broker to
dial from outside ``manage.py up``, and it says so.

:func:`call_on_loop` is the one way a thread that is not the engine's (a sync
view, an admin action, an ``on_commit`` announcement) runs a coroutine on the
engine's loop and waits for its answer.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Awaitable, Callable, Optional, TypeVar

from asgiref.sync import SyncToAsync
from opentelemetry import context as otel_context

from crewlet.queue.contract import EventQueue

log = logging.getLogger("crewlet.runtime")

_queue: Optional[EventQueue] = None
_lazy_lock: Optional[asyncio.Lock] = None


class NoQueue(RuntimeError):
    """No queue client in this process (and none can be dialled from the settings)."""


def set_queue(queue: EventQueue) -> None:
    """Make ``queue`` this process's queue (the engine calls this once connected)."""
    global _queue
    _queue = queue


def clear_queue(queue: Optional[EventQueue] = None) -> None:
    """Forget the registered queue (only ``queue`` itself, when given)."""
    global _queue
    if queue is None or _queue is queue:
        _queue = None


def current_queue() -> Optional[EventQueue]:
    """The registered queue, or None."""
    return _queue


def get_queue() -> EventQueue:
    """The registered queue; raises :class:`NoQueue` with what to do when there is none."""
    if _queue is None:
        raise NoQueue(
            "no queue in this process: the engine is not running here "
            "(run manage.py up, or use aget_queue() in a web-only process with stream.type nats)"
        )
    return _queue


async def aget_queue() -> EventQueue:
    """The registered queue, else one dialled from the settings on first use (``stream.type: nats`` only)."""
    global _lazy_lock
    if _queue is not None:
        return _queue
    if _lazy_lock is None:
        _lazy_lock = asyncio.Lock()
    async with _lazy_lock:
        if _queue is not None:
            return _queue
        from crewlet.conf import load_settings
        from crewlet.queue.jetstream import JetStreamQueue

        settings = load_settings()
        if settings.stream.type != "nats":
            raise NoQueue(
                f"no queue in this process and stream.type is {settings.stream.type!r}: "
                "an embedded broker lives inside manage.py up; a web-only process needs stream.type nats"
            )
        queue = await JetStreamQueue.connect(
            settings.stream.url,
            node=settings.node.id,
            timings=settings.delivery.timings(),  # ensuring a mailbox aligns its ack window with these
            event_retention_hours=settings.stream.event_retention_hours,
        )
        log.info("web_queue_connected", extra={"node": settings.node.id})
        set_queue(queue)
        return queue


def is_connected(queue: EventQueue) -> bool:
    """Whether ``queue``'s broker connection is up."""
    return queue.connected


# -- a thread waiting on the engine's loop ---------------------------------------------------

_T = TypeVar("_T")

#: Why a thread could not ask the engine's loop, when no engine runs in this process.
NO_ENGINE = "no engine runs in this process to reach the queue"


class EngineAway(Exception):
    """The engine's loop cannot be asked from here, or it did not answer in time."""


def call_on_loop(
    make: Callable[[], Awaitable[_T]], loop: Optional[asyncio.AbstractEventLoop], timeout_s: float
) -> _T:
    """Run ``make()`` as a task on ``loop`` and wait at most ``timeout_s`` for its result.

    The task runs in a fresh :mod:`contextvars` context, as the engine's own
    tasks do, never in a copy of the calling thread's. A copy would carry
    asgiref's per-request thread marker: the coroutine's store calls
    (``sync_to_async(thread_sensitive=True)``) would then be queued on the very
    request thread that is blocked here waiting for them, and the wait could
    only end by timing out — after the work had been half done. In a fresh
    context they run on the engine's store thread. A copy would also carry the
    request thread's database connections into that thread. The caller's
    OpenTelemetry context (its current span) is carried across explicitly, so
    events the coroutine publishes still hang off the caller's trace.

    Refuses (:class:`EngineAway`) rather than waiting where waiting cannot
    end: on a thread that runs an event loop (await the coroutine instead), and
    on the store thread itself (the coroutine's store calls would queue behind
    this wait). On a timeout the task is cancelled and :class:`EngineAway`
    raised; what the coroutine had already committed stays committed.
    """
    if loop is None or loop.is_closed():
        raise EngineAway(NO_ENGINE)
    try:
        running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None:
        raise EngineAway("a thread running an event loop must await the coroutine, not block on a loop")
    if SyncToAsync.deadlock_context.get(False):
        raise EngineAway("this is the store thread the engine's coroutine needs: blocking here would deadlock")
    carried = otel_context.get_current()

    async def run() -> _T:
        token = otel_context.attach(carried)
        try:
            return await make()
        finally:
            otel_context.detach(token)

    coro = run()
    try:
        # run_coroutine_threadsafe schedules the task with the context current at the call: a fresh one.
        future = contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, loop)
    except RuntimeError as exc:  # the loop closed since the check above
        coro.close()
        raise EngineAway(NO_ENGINE) from exc
    try:
        return future.result(timeout=timeout_s)
    except TimeoutError as exc:
        future.cancel()
        log.warning("engine_loop_timeout", extra={"timeout_s": timeout_s})
        raise EngineAway(f"the engine did not answer within {timeout_s:g}s") from exc


__all__ = [
    "NO_ENGINE",
    "EngineAway",
    "NoQueue",
    "aget_queue",
    "call_on_loop",
    "clear_queue",
    "current_queue",
    "get_queue",
    "is_connected",
    "set_queue",
]
