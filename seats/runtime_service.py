"""The seat runtime as an engine service: what the seats app contributes to a node's engine.

Kept beside :mod:`seats.runtime` rather than in it: the runtime is what a node
does for its seats, this is how the engine builds one from its settings and
services (the fleet member's leases, the toolbox, the event store's writer).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from django.conf import settings as django_settings

from crewlet.engine.interfaces import EVENT_STORE, FLEET, SEAT_RUNTIME
from crewlet.engine.services import Service
from crewlet.fleet.member import FleetMember
from seats.coalescer import coalesce
from seats.indicator import WORKING_INDICATOR
from seats.ownership import LeasedOwnership
from seats.runtime import TOOLBOX, SeatRuntime
from seats.scheduler import rehearsal_clock
from seats.steering import SteerServer
from seats.tools.base import SEAT_TOOLS
from seats.turn_types import Trigger

#: The steer scatter's server (:mod:`seats.steering`): a duty nobody asks the engine for.
STEER_SERVER = "seat_steering"

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine


def services(engine: "Engine", **options: Any) -> list[Service]:
    """The seat runtime of ``engine.company`` as the :data:`~crewlet.engine.interfaces.SEAT_RUNTIME` service.

    It starts once the event store's writer is attached (so what it
    publishes is stored) and the seats' toolbox runs (:data:`SEAT_TOOLS`,
    which its turns call and which stops after it, as do the chat working
    indicators, :data:`~seats.indicator.WORKING_INDICATOR`), and publishes telemetry
    through the engine's emitter. In production a multi-wake partition is merged by the
    digest (``seats.coalescer.coalesce``) into ONE trigger.
    """
    if "merge" not in options:
        options["merge"] = coalesce

    def make(engine: "Engine") -> SeatRuntime:
        assert engine.queue is not None
        options.setdefault("node_max_concurrent", engine.settings.node.max_concurrent)
        options.setdefault("stop_grace_s", engine.settings.node.stop_grace_s)
        options.setdefault("turn_stall_s", engine.settings.node.turn_stall_s)
        options.setdefault("provider_retry_scale", engine.settings.delivery.provider_retry_scale)
        options.setdefault("budget_meters_every_s", engine.settings.node.budget_meters_every_s)
        options.setdefault("max_consumers", engine.settings.stream.max_consumers)
        options.setdefault("toolbox", engine.find(TOOLBOX))
        options.setdefault("scheduler_clock", rehearsal_clock())
        options.setdefault("sandbox_dir", Path(django_settings.VAR_DIR) / "sandbox")
        member = engine.find(FLEET)
        if member is not None and "ownership" not in options:
            # Seat leases are the fleet member's own (crewlet.fleet.member), which leased ownership works through.
            assert isinstance(member, FleetMember)
            options.update(
                ownership=LeasedOwnership(member), hold_duty=member.hold_duty, placement_every_s=member.renew_every_s
            )
        runtime = SeatRuntime(
            engine.queue, engine.company, node_id=engine.settings.node.id, emitter=engine.emitter, **options
        )
        if member is not None:
            member.on_lost(runtime.seats_lost)
        engine.add_stop_hook(runtime.gate.close)  # what waits at the gate goes back, not into a turn
        return runtime

    def make_steering(engine: "Engine") -> SteerServer:
        assert engine.queue is not None
        runtime = engine.find(SEAT_RUNTIME)
        assert isinstance(runtime, SeatRuntime)

        def turn_of(handle: str) -> tuple[bool, Optional[Trigger]]:
            loop = runtime.loops.get(handle)
            return (loop is not None, loop.turn.trigger if loop is not None else None)

        return SteerServer(engine.queue, engine.settings.node.id or engine.queue.node, turn_of)

    return [
        Service(SEAT_RUNTIME, make, after=(EVENT_STORE, SEAT_TOOLS, FLEET, WORKING_INDICATOR)),
        Service(STEER_SERVER, make_steering, depends_on=(SEAT_RUNTIME,)),
    ]


def install(engine: "Engine", **options: Any) -> None:
    """Register :func:`services` on ``engine`` (what ``SeatsConfig.engine_services`` contributes)."""
    for service in services(engine, **options):
        engine.add(service)


__all__ = ["STEER_SERVER", "install", "services"]
