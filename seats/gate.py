"""The per-node concurrency gate: how many turns this node runs at once.

One gate is shared by every inbox loop of a node (``node.max_concurrent``);
a delivery past the limit waits at the gate in this process, holding its
delivery, rather than being handed back to the broker, so a busy node keeps
its seats' order and work. The seat runtime makes it, resizes it on an
apply, and closes it when the node stops.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Optional


class GateClosed(Exception):
    """The node is stopping: the concurrency gate admits no new turn."""


class ConcurrencyGate:
    """The per-node gate: at most ``limit`` turns at once, the rest wait here.

    Resizable while work waits (an applied company changes
    ``node.max_concurrent``): growing it lets waiters in at once, shrinking
    it lets running turns finish and admits nobody until below the new size.
    Closed when the node stops: every waiter, and anyone arriving later, gets
    :class:`GateClosed` instead of a slot, so its delivery goes back to the
    broker at once rather than starting a turn during the drain.
    """

    def __init__(self, limit: int) -> None:
        self._limit = max(int(limit), 1)
        self._active = 0
        self._waiting = 0
        self._peak = 0
        self._closed = False
        self._cond: Optional[asyncio.Condition] = None

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def peak(self) -> int:
        """The most turns that ever ran at once (a gauge for the dashboard and the tests)."""
        return self._peak

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def resize(self, limit: int) -> None:
        cond = self._condition()
        async with cond:
            self._limit = max(int(limit), 1)
            cond.notify_all()

    async def close(self) -> None:
        """Admit nobody from now on; turns already running keep their slots."""
        cond = self._condition()
        async with cond:
            self._closed = True
            cond.notify_all()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        cond = self._condition()
        async with cond:
            self._waiting += 1
            try:
                await cond.wait_for(lambda: self._closed or self._active < self._limit)
            finally:
                self._waiting -= 1
            if self._closed:
                raise GateClosed()
            self._active += 1
            self._peak = max(self._peak, self._active)
        try:
            yield
        finally:
            async with cond:
                self._active -= 1
                cond.notify_all()


__all__ = ["ConcurrencyGate", "GateClosed"]
