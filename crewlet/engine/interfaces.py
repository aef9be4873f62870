"""The services the engine hands out between layers: their names and what each provides.

The core (``crewlet``) and the apps meet here instead of importing each other:
an app registers a service under one of these names (from its
``AppConfig.engine_services``) and whoever needs it asks the running engine
(:meth:`crewlet.engine.core.Engine.service`, or from a request thread
:func:`crewlet.engine.runtime.engine`) for that name, typed by the protocol below.
So ``/healthz`` and the config poller never import ``seats``, and the live
projection in ``eventstore`` reads the seat runtime's holds without importing
it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.company.org import CompanyHolder, Organization

#: The event store's writer (attached to the queue before anything that publishes starts).
EVENT_STORE = "eventstore_writer"
#: The live projection of the company (:class:`eventstore.projection.LiveProjection`).
LIVE_PROJECTION = "eventstore_projection"
#: The fleet's history reads: this node's answers served, and every node asked (:mod:`eventstore.fanout`).
FLEET_READS = "eventstore_fleet_reads"
#: This node's seat runtime: its inbox loops, holds and pauses (:class:`SeatLoops`).
SEAT_RUNTIME = "seat_runtime"
#: The notifications duties, whose ``edge`` publishes what ``POST /webhooks/<source>`` receives.
NOTIFY = "notify"
#: The config poller (applies the active company revision to :data:`SEAT_RUNTIME`).
CONFIG_POLLER = "config_poller"
#: This node's fleet membership: presence, seat and duty leases (:class:`crewlet.fleet.member.FleetMember`).
FLEET = "fleet"
#: The web server (``manage.py up`` only); it starts after every other service.
WEB = "web"


@dataclass(frozen=True)
class PauseRow:
    """A seat's pause as the coordination store holds it (what the projection seeds from)."""

    paused: bool
    reason: str
    paused_by: str


class SeatLoops(Protocol):
    """What the seat runtime offers the rest of the engine."""

    holder: "CompanyHolder"

    def healthy(self) -> bool:
        """Started, not stopped, every duty alive and every claimed seat's loop attached."""

    def held_locally(self) -> dict[str, bool]:
        """The seats this node runs, each with whether a turn of it runs right now."""

    async def apply(self, org: "Organization") -> None:
        """Serve ``org`` from now on (an applied config revision)."""

    def pause_rows(self, handles: list[str]) -> dict[str, PauseRow]:
        """The stored pauses of ``handles`` (blocking: call it in a worker thread)."""


class WebhookEdge(Protocol):
    """What the webhook view needs of the notifications edge."""

    def limit(self) -> int: ...

    async def receive(self, req: Any) -> Any: ...


def seat_loops(engine: Any) -> Optional[SeatLoops]:
    """The engine's seat runtime, or None when it runs none (yet)."""
    found: Optional[SeatLoops] = engine.lookup(SEAT_RUNTIME)
    return found


__all__ = [
    "CONFIG_POLLER",
    "EVENT_STORE",
    "FLEET",
    "FLEET_READS",
    "LIVE_PROJECTION",
    "NOTIFY",
    "PauseRow",
    "SEAT_RUNTIME",
    "SeatLoops",
    "WEB",
    "WebhookEdge",
    "seat_loops",
]
