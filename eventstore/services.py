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


#: A data node's side of custody: it keeps stateless nodes' batches and settles them (eventstore.custody).
CUSTODY = "eventstore_custody"


class WriterService:
    """Attach the writer once the queue is connected; close it when the engine stops.

    On a stateless node (``node.data: false``) the publish listener is the
    custody writer instead: its rows go to a live data node, and nothing is
    written here.
    """

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.writer: Optional[Any] = None

    async def start(self) -> None:
        from eventstore.writer import attach

        queue = self.engine.queue
        assert queue is not None
        settings = self.engine.settings
        if settings.node.data:
            self.writer = attach(queue)
            return
        from eventstore.custody import CustodyWriter

        custody = CustodyWriter(queue, queue.node, timeout_s=settings.history.custody_timeout_s)
        queue.add_publish_listener(custody)
        self.writer = custody

    async def stop(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            await writer.aclose()


def _keeper(engine: "Engine") -> Any:
    from eventstore.custody import CustodyKeeper

    assert engine.queue is not None
    return CustodyKeeper(engine.queue, engine.queue.node, every_s=engine.settings.history.custody_settle_s)


def services(engine: "Engine") -> list[Service]:
    """The writer, the retention duty and the fleet reads (after the writer), and the projection of ``engine.company``.

    A data node also keeps stateless nodes' custody batches.
    """
    from eventstore.fanout import for_engine
    from eventstore.projection import ProjectionService

    custody = [Service(CUSTODY, _keeper, after=(EVENT_STORE,))] if engine.settings.node.data else []
    return [
        # After the fleet membership: a node refused for sharing another's store writes nothing into it.
        Service(EVENT_STORE, WriterService, after=(FLEET,)),
        *custody,
        Service(RETENTION, lambda e: retention_periodic(e.settings), after=(EVENT_STORE,)),
        Service(FLEET_READS, for_engine, after=(EVENT_STORE,)),
        Service(LIVE_PROJECTION, lambda e: ProjectionService(e), after=(EVENT_STORE, FLEET_READS)),
    ]


def install(engine: "Engine") -> None:
    for service in services(engine):
        engine.add(service)
