"""The engine's one projection: the service that feeds and seeds it, and how a reader finds it.

One projection per process, owned by the engine (``LIVE_PROJECTION``): the
service opens the broadcast stream first and seeds after, and a page or a tab
finds it through :func:`current` / :func:`running` (the engine's service, by
its key) rather than making one of its own, so a process without an engine
shows no company rather than a made-up one: a web-only process serves the
store's reads but not the company, since which seats there are is the running
engine's company file (or its active revision).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from crewlet.engine import runtime
from crewlet.engine.interfaces import FLEET_READS, LIVE_PROJECTION, SEAT_RUNTIME, LiveProjectionService
from crewlet.company.org import CompanyHolder
from crewlet.queue import topics
from eventstore.fanout import FleetReads
from eventstore.projection.model import LiveProjection

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.queue.contract import Closable, EventQueue



def _projection(service: LiveProjectionService) -> LiveProjection:
    """The projection a :data:`LIVE_PROJECTION` service feeds: a :class:`ProjectionService`'s, of this app's class."""
    found = service.projection
    assert isinstance(found, LiveProjection)
    return found


def current() -> Optional[LiveProjection]:
    """The running engine's projection, or None when none runs in this process."""
    service = runtime.find_service(LIVE_PROJECTION)
    return _projection(service) if service is not None else None


def running() -> LiveProjection:
    """The running engine's projection; :class:`~crewlet.engine.runtime.EngineAway` when none runs here."""
    return _projection(runtime.service(LIVE_PROJECTION))


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
        self.projection = projection or LiveProjection(holder.current, seats=lambda: engine.find(SEAT_RUNTIME))
        self._stream: Optional["Closable"] = None

    async def start(self) -> None:
        assert self.engine.queue is not None
        projection = self.projection
        with projection._lock:
            projection._pending = []  # what the stream delivers while the seed reads waits for it
        self._stream = await subscribe(self.engine.queue, projection)
        reads = self.engine.find(FLEET_READS)
        # The fleet reads are this app's own (eventstore.fanout), whose plans the seed runs.
        assert reads is None or isinstance(reads, FleetReads)
        await projection.seed(fleet=reads)

    async def stop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()


__all__ = ["ProjectionService", "current", "running", "subscribe"]
