"""The A2A maintenance duty as an engine service: :func:`a2a.services.sweep` on a fixed tick.

Every node may run it: each close is a compare-and-set on the record, so a
channel is closed (and its ``a2a_channel_closed`` published) exactly once.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from crewlet.events.emit import Emitter

from a2a import services

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine import Engine

log = logging.getLogger("crewlet.a2a.runtime")

#: How often the duty looks (the thresholds themselves are the services' constants).
SWEEP_EVERY_S = 300.0


async def run_sweeps(queue: Any, *, every_s: float = SWEEP_EVERY_S, **options: Any) -> None:
    """Sweep now and every ``every_s`` until cancelled; a failing pass is logged and tried next time."""
    emitter = Emitter(queue)
    try:
        while True:
            try:
                await services.sweep(queue, emitter=emitter, **options)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("a2a_sweep_failed")
            await asyncio.sleep(every_s)
    finally:
        await emitter.close()


def install(engine: "Engine", **options: Any) -> None:
    """Register the sweep as an engine service (started once the queue is connected)."""

    async def a2a_sweep_service(engine: "Engine") -> None:
        assert engine.queue is not None
        await run_sweeps(engine.queue, **options)

    engine.add_service(a2a_sweep_service, name="a2a_sweep")


__all__ = ["SWEEP_EVERY_S", "install", "run_sweeps"]
