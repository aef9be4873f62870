"""Once-per-fleet duties: a duty's pass runs only on the node holding the duty's lease.

Wrap a duty's function with :func:`under_duty` and register it as usual (a
:class:`~crewlet.engine.services.Periodic`): every node ticks, and on each tick the
node that holds (or can take) lease ``name`` runs the pass while the others
skip it. An engine without a fleet membership (a test's bare engine) runs it.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional, Protocol, TypeVar

from crewlet.engine.interfaces import FLEET, ServiceKey

_T = TypeVar("_T")


class Services(Protocol):
    """What :func:`under_duty` asks of an engine: its running service under a key, or None."""

    def find(self, key: ServiceKey[_T]) -> Optional[_T]: ...


def under_duty(engine: Services, name: str, fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Optional[Any]]]:
    """``fn`` run only while this node holds duty lease ``name``; a skipped pass returns None."""

    async def run() -> Optional[Any]:
        member = engine.find(FLEET)
        if member is not None and not await member.hold_duty(name):
            return None
        return await fn()

    return run


__all__ = ["Services", "under_duty"]
