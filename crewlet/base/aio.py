"""asyncio helpers every package may use (no third-party imports here)."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine, Iterable, Optional, Protocol, TypeVar

_T = TypeVar("_T")


class Closable(Protocol):
    """Anything closed with ``await x.close()`` (a subscription, a feed, a server)."""

    async def close(self) -> None:
        """Stop; idempotent."""


async def keeping_cancel(awaitable: Awaitable[_T]) -> _T:
    """Await ``awaitable`` without losing a cancellation of the calling task.

    Python 3.11's ``asyncio.wait_for`` swallows a cancel that lands in the same
    loop iteration as its inner future completing (CPython gh-86296, fixed in
    3.12): it returns the result and the task runs on as if never cancelled.
    nats-py awaits every request reply, flush and ``next_msg`` that way, so a
    service cancelled while it asks JetStream something — the engine stopping
    during start-up — could carry on (measured here: about half of the cancels
    landing in a loop of ``backlog`` calls were lost); our own ``wait_for``
    calls wrap themselves in it for the same reason. A rise of the task's
    ``cancelling()`` count across the await is a cancel that was asked for and
    never delivered: deliver it.
    """
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    result = await awaitable
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError()
    return result


def spawn_kept(tasks: set[asyncio.Task[_T]], coro: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
    """Start ``coro`` as a task held in ``tasks`` until it is done.

    The event loop keeps only a weak reference to a task: one nobody holds can
    be collected mid-run. The owner keeps the set, and awaits or cancels what
    is left in it when it closes.
    """
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def close_each(closables: Iterable[Closable], logger: Optional[logging.Logger] = None, event: str = "") -> None:
    """Close every one of ``closables``, the rest too when one of them fails.

    For an owner shutting down: a part that cannot close cleanly is gone all
    the same, and must not keep the others open. A failure is logged at debug
    under ``event`` (when a ``logger`` is given). Iterates over a copy, since
    closing a part may take it out of the owner's collection.
    """
    for closable in list(closables):
        try:
            await closable.close()
        except Exception:
            if logger is not None:
                logger.debug(event, exc_info=True)




async def bounded_each(items: Iterable[_T], work: Callable[[_T], Awaitable[Any]], limit: int) -> None:
    """``await work(item)`` for every item, at most ``limit`` at once; the first failure is raised once all ended.

    What a node does once per seat at start and stop (a mailbox ensured, an
    inbox attached or detached) is a round trip to the broker or the store:
    one seat at a time, a company's start and stop grow by a round trip per
    seat, while unbounded they would put thousands of requests on the
    broker's API at once. Every item is worked on even when one fails, so a
    stop still detaches the other seats.
    """
    gate = asyncio.Semaphore(max(int(limit), 1))

    async def one(item: _T) -> None:
        async with gate:
            await work(item)

    results = await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


__all__ = ["Closable", "bounded_each", "close_each", "keeping_cancel", "spawn_kept"]
