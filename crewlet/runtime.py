"""The process-wide handle on this process's queue client.

The engine registers its queue here once it is connected (and clears it
before closing it), so code served by the same process — webhook views,
``/healthz`` — publishes through the engine's own connection instead of
dialling the broker again.

A web-only process (no engine) has no queue registered. :func:`aget_queue`
then dials the broker named by the settings (``stream.type: nats``) once,
lazily, on first use; with ``stream.type: embedded`` there is no broker to
dial from outside ``manage.py up``, and it says so.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

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
            event_retention_hours=settings.stream.event_retention_hours,
        )
        log.info("web_queue_connected", extra={"node": settings.node.id})
        set_queue(queue)
        return queue


def is_connected(queue: EventQueue) -> bool:
    """Whether ``queue``'s broker connection is up."""
    return queue.connected


__all__ = ["NoQueue", "aget_queue", "clear_queue", "current_queue", "get_queue", "is_connected", "set_queue"]
