"""The store's services on a running engine, contributed by ``EventStoreConfig.engine_services``.

The writer (the queue's publish listener: every event this node publishes
becomes a row), the hourly retention sweep, the fleet reads (this node's store
served to every asker, every live node asked for each history read) and the
live projection, seeded through the fleet reads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from crewlet.engine.services import Service
from crewlet.engine.interfaces import EVENT_STORE, FLEET, FLEET_READS, LIVE_PROJECTION
from eventstore.retention import RETENTION, retention_periodic

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine


class WriterService:
    """Attach the writer once the queue is connected; close it when the engine stops."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.writer: Optional[Any] = None

    async def start(self) -> None:
        from eventstore.writer import attach

        assert self.engine.queue is not None
        self.writer = attach(self.engine.queue)

    async def stop(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            await writer.aclose()


def services(engine: "Engine") -> list[Service]:
    """The writer, the retention duty and the fleet reads (after the writer), and the projection of ``engine.company``."""
    from eventstore.fanout import for_engine
    from eventstore.projection import ProjectionService

    return [
        # After the fleet membership: a node refused for sharing another's store writes nothing into it.
        Service(EVENT_STORE, WriterService, after=(FLEET,)),
        Service(RETENTION, lambda e: retention_periodic(e.settings), after=(EVENT_STORE,)),
        Service(FLEET_READS, for_engine, after=(EVENT_STORE,)),
        Service(LIVE_PROJECTION, lambda e: ProjectionService(e), after=(EVENT_STORE, FLEET_READS)),
    ]


def install(engine: "Engine") -> None:
    for service in services(engine):
        engine.add(service)
