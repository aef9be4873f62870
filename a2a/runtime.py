"""The A2A maintenance duty as an engine service: :func:`a2a.services.sweep` on a fixed tick.

Once per fleet: the pass runs on the node holding the duty's lease. Each close
is a compare-and-set on the record besides, so even two nodes racing would
close a channel (and publish its ``a2a_channel_closed``) exactly once.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from crewlet.engine.interfaces import EVENT_STORE, FLEET
from crewlet.engine.services import Service, periodic
from crewlet.fleet.duty import under_duty

from a2a import services

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.a2a.runtime")

#: How often the duty looks (the thresholds themselves are the services' constants).
SWEEP_EVERY_S = 300.0
#: The duty's name (a failing pass logs ``a2a_sweep_failed``).
SWEEP = "a2a_sweep"


def engine_services(engine: "Engine", *, every_s: float = SWEEP_EVERY_S, **options: Any) -> list[Service]:
    """The sweep, now and every ``every_s``, publishing through the engine's emitter."""

    async def sweep() -> None:
        assert engine.queue is not None
        await services.sweep(engine.queue, emitter=engine.emitter, **options)

    return [periodic(SWEEP, every_s, under_duty(engine, SWEEP, sweep), after=(EVENT_STORE, FLEET), logger=log)]


__all__ = ["SWEEP", "SWEEP_EVERY_S", "engine_services"]
