"""The services the engine hands out between layers: the key each is registered under and what it provides.

The core (``crewlet``) and the apps meet here instead of importing each other:
an app registers a service under one of these keys (``Service(KEY, make)``
from its ``AppConfig.engine_services``) and whoever needs it asks the running
engine for that key (:meth:`crewlet.engine.core.Engine.get` / ``find``, or
from a request thread :func:`crewlet.engine.runtime.service`), and is handed
what the key's protocol below says, typed. So ``/healthz`` and the config
poller never import ``seats``, and the live projection in ``eventstore`` reads
the seat runtime's holds without importing it. A protocol names what callers
use; the core cannot import an app's classes, so where a value of an app's own
type crosses (a seat's pause change, a history question) it is ``Any`` here and
typed in the app.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generic, Optional, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.company.org import CompanyHolder, Organization

_T = TypeVar("_T")


class Lifecycle(Protocol):
    """What a service's factory makes: started once its dependencies run, stopped before they stop."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class ServiceKey(Generic[_T]):
    """The name a service is registered under, and the class or protocol of what it hands out.

    Two keys of one name are one service: the engine's registry is by name,
    so a service registered under a plain name (a duty nobody asks for) is
    found by a key of that name too. ``provides`` is taken as a callable
    returning ``_T`` rather than a ``type[_T]`` because a protocol is not a
    concrete class, and a class (or protocol) object is a callable returning
    its instances: that is how the key's type is read from it.
    """

    name: str
    provides: Callable[..., _T] = field(compare=False, repr=False)


@dataclass(frozen=True)
class PauseRow:
    """A seat's pause as the coordination store holds it (what the projection seeds from)."""

    paused: bool
    reason: str
    paused_by: str


class SeatLoops(Protocol):
    """What the seat runtime offers the rest of the engine, and the seats' own pause calls."""

    holder: "CompanyHolder"

    def healthy(self) -> bool:
        """Started, not stopped, every duty alive and every claimed seat's loop attached."""

    def held_locally(self) -> dict[str, bool]:
        """The seats this node runs, each with whether a turn of it runs right now."""

    async def apply(self, org: "Organization") -> None:
        """Serve ``org`` from now on (an applied config revision)."""

    def pause_rows(self, handles: list[str]) -> dict[str, PauseRow]:
        """The stored pauses of ``handles`` (blocking: call it in a worker thread)."""

    def run_holds(self, handles: list[str]) -> dict[str, tuple[str, ...]]:
        """The coding runs holding each of ``handles`` that one holds, by run id (blocking: call it in a worker thread)."""

    async def on_pause_change(self, change: Any) -> None:
        """Apply a pause or resume this process just made (a ``seats.actions.PauseChange``) to the seat's inbox."""


class WebhookEdge(Protocol):
    """What the webhook view needs of the notifications edge."""

    def limit(self) -> int: ...

    async def receive(self, req: Any) -> Any: ...


class Notifications(Protocol):
    """What the notifications service offers: the webhook edge, while it runs (None before start and after stop)."""

    @property
    def edge(self) -> Optional[WebhookEdge]: ...


class WriterCounts(Protocol):
    """What ``/metrics`` reads of the event store's writer."""

    @property
    def backlog(self) -> int:
        """Rows published and not yet written."""

    @property
    def refused(self) -> int:
        """Rows the store refused for what they held, set aside."""

    def lag_s(self, now: datetime) -> float:
        """Age at ``now`` of the oldest event whose row is still owed (0 when none is)."""


class EventStoreWriter(Protocol):
    """The event store's writer service: the writer it attached to the queue, while it runs."""

    @property
    def writer(self) -> Optional[WriterCounts]: ...


class FleetHistory(Protocol):
    """The fleet's history reads: every live node asked a question, and how many reads came back without one."""

    @property
    def reads(self) -> int:
        """History reads this node asked of the fleet."""

    @property
    def partial(self) -> int:
        """Of those, the ones some live node did not answer."""

    @property
    def kept_asked(self) -> int:
        """Rounds of those reads that asked the second question (``kept``): a custody batch was in flight."""

    def ask(self, question: Any) -> dict[str, Any]:
        """The fleet's answer to one question (an ``eventstore.questions.Question``), from a request thread."""


class FleetMembership(Protocol):
    """This node's fleet membership as the engine and the apps ask it: its leases, by its own deadline."""

    @property
    def renew_every_s(self) -> float:
        """How often the member renews its leases (what a duty holder re-checks at)."""

    def present(self) -> bool:
        """Whether this node's presence lease is good."""

    def seats(self) -> frozenset[str]:
        """The seats whose leases this node holds."""

    def duties(self) -> frozenset[str]:
        """The once-per-fleet duties whose leases this node holds."""

    async def hold_duty(self, name: str) -> bool:
        """Whether this node holds duty lease ``name`` now, taking it when it is free."""

    def on_lost(self, listener: Callable[[frozenset[str]], Awaitable[None]]) -> None:
        """Tell ``listener`` of the seats this node has just lost."""


class LiveProjectionService(Protocol):
    """The service that feeds the live projection: the projection (an ``eventstore.projection.LiveProjection``)."""

    @property
    def projection(self) -> object: ...


#: The event store's writer (attached to the queue before anything that publishes starts).
EVENT_STORE: ServiceKey[EventStoreWriter] = ServiceKey("eventstore_writer", EventStoreWriter)
#: The live projection of the company (:class:`eventstore.projection.LiveProjection`).
LIVE_PROJECTION: ServiceKey[LiveProjectionService] = ServiceKey("eventstore_projection", LiveProjectionService)
#: The fleet's history reads: this node's answers served, and every node asked (:mod:`eventstore.fanout`).
FLEET_READS: ServiceKey[FleetHistory] = ServiceKey("eventstore_fleet_reads", FleetHistory)
#: This node's seat runtime: its inbox loops, holds and pauses (:class:`SeatLoops`).
SEAT_RUNTIME: ServiceKey[SeatLoops] = ServiceKey("seat_runtime", SeatLoops)
#: The notifications duties, whose ``edge`` publishes what ``POST /webhooks/<source>`` receives.
NOTIFY: ServiceKey[Notifications] = ServiceKey("notify", Notifications)
#: The config poller (applies the active company revision to :data:`SEAT_RUNTIME`); nothing asks it for more than to run.
CONFIG_POLLER: ServiceKey[Lifecycle] = ServiceKey("config_poller", Lifecycle)
#: This node's fleet membership: presence, seat and duty leases (:class:`crewlet.fleet.member.FleetMember`).
FLEET: ServiceKey[FleetMembership] = ServiceKey("fleet", FleetMembership)
#: The web server (``manage.py up`` only); it starts after every other service.
WEB: ServiceKey[Lifecycle] = ServiceKey("web", Lifecycle)


__all__ = [
    "CONFIG_POLLER",
    "EVENT_STORE",
    "EventStoreWriter",
    "FLEET",
    "FLEET_READS",
    "FleetHistory",
    "FleetMembership",
    "LIVE_PROJECTION",
    "Lifecycle",
    "LiveProjectionService",
    "NOTIFY",
    "Notifications",
    "PauseRow",
    "SEAT_RUNTIME",
    "SeatLoops",
    "ServiceKey",
    "WEB",
    "WebhookEdge",
    "WriterCounts",
]
