"""The engine's one projection: the service that feeds and seeds it, and how a reader finds it.

One projection per process, owned by the engine (``LIVE_PROJECTION``): the
service opens the broadcast stream first and seeds after, and a page or a tab
finds it through :func:`current` / :func:`running` rather than making one of
its own, so a process without an engine shows no company rather than a
made-up one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from crewlet.engine.interfaces import FLEET_READS, LIVE_PROJECTION, seat_loops
from crewlet.company.org import CompanyHolder
from crewlet.queue import topics
from crewlet.engine.runtime import NO_ENGINE
from eventstore.projection.model import LiveProjection

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.queue.contract import Closable, EventQueue


class NoEngineHere(LookupError):
    """No engine runs in this process, so no projection does: its seats and their live state are not known here.

    A web-only process serves the store's reads but not the company: which
    seats there are is the running engine's company file (or its active
    revision), so a page says so rather than guess with some other company.
    ``str()`` is :data:`NO_ENGINE`, the words the dashboard's other reads use.
    """

    def __init__(self) -> None:
        super().__init__(NO_ENGINE)


def current() -> Optional[LiveProjection]:
    """The running engine's projection, or None when none runs in this process."""
    from crewlet.engine import runtime

    running = runtime.current_engine()
    service = running.lookup(LIVE_PROJECTION) if running is not None else None
    return service.projection if service is not None else None


def running() -> LiveProjection:
    """The running engine's projection; :class:`NoEngineHere` when none runs here (a web-only process)."""
    found = current()
    if found is None:
        raise NoEngineHere()
    return found


async def subscribe(queue: "EventQueue", projection: LiveProjection) -> "Closable":
    """The one broadcast consumer that feeds ``projection`` everything under ``crewlet.events.>``."""
    return await queue.subscribe_stream(topics.EVENTS_ALL, projection.handler)


class ProjectionService:
    """The engine's projection of its company (``engine.company``), as an engine service.

    The company is the engine's, so the seed reads the seats the engine
    serves even before the seat runtime is up. The stream opens first (so
    nothing falls between), then the seed reads the store; what the stream
    delivers meanwhile waits for it.
    """

    def __init__(self, engine: "Engine", projection: Optional[LiveProjection] = None) -> None:
        self.engine = engine
        holder: CompanyHolder = engine.company
        self.projection = projection or LiveProjection(holder.current, seats=lambda: seat_loops(engine))
        self._stream: Optional["Closable"] = None

    async def start(self) -> None:
        assert self.engine.queue is not None
        projection = self.projection
        with projection._lock:
            projection._pending = []  # what the stream delivers while the seed reads waits for it
        self._stream = await subscribe(self.engine.queue, projection)
        await projection.seed(fleet=self.engine.lookup(FLEET_READS))

    async def stop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()


__all__ = ["NO_ENGINE", "NoEngineHere", "ProjectionService", "current", "running", "subscribe"]
