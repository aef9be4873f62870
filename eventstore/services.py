"""The store's duties on a running engine (``manage.py up`` / ``runconsumers`` install them)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from eventstore.retention import retention_duty

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine import Engine


async def writer_service(engine: "Engine") -> None:
    """Attach the writer once the queue is connected; close it when the engine stops."""
    from eventstore.writer import attach

    assert engine.queue is not None
    writer = attach(engine.queue)
    try:
        await asyncio.Event().wait()  # until the engine cancels its services
    finally:
        await writer.aclose()


async def retention_service(engine: "Engine") -> None:
    await retention_duty(engine.settings)


def install(engine: "Engine") -> None:
    engine.add_service(writer_service, name="eventstore_writer")
    engine.add_service(retention_service, name="eventstore_retention")
