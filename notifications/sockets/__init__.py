"""Surfaces whose deliveries arrive over a socket this node opens: Slack's Socket Mode, Mattermost's websocket.

A laptop has no public URL, so a vendor cannot POST to ``/webhooks/<kind>``;
with ``mode: socket`` in the company file the node dials the vendor instead
(:mod:`notifications.sockets.slack`, :mod:`notifications.sockets.mattermost`).
Each frame that carries a delivery is handed to the SAME edge the webhook
route uses (:meth:`notifications.edge.Edge.deliver`): the same parser, trace
root, ``raw_webhook`` publish, ``inbound_delivery`` record and provider-retry
dedupe (Slack's ``event_id`` / ``trigger_id``, Mattermost's post id). A frame
is acknowledged (Slack) or counted as read (Mattermost's ``seq``) only once
the edge has put it on the broker, so a frame the node could not take is sent
again by the vendor.

A seat with a chat identity of its own opens a socket of its own beside the
company-level one (:func:`company_sockets`): one per Slack app whose seat
names ``app_token_env`` (an app-level token serves Socket Mode alone, so it
opens whatever ``surfaces.slack.mode`` says), and, with
``surfaces.mattermost.mode: socket``, one per seat's Mattermost bot — a bot
is sent only the events of the channels it is in, so a DM to a seat's bot
reaches no other bot's socket. Each is a service and a duty lease of its own,
``surface_socket:<kind>:<seat>``.

Each client is an engine service (``surface_socket:<kind>``) that keeps a
:class:`SurfaceStatus`: whether it is connected, when the last frame came,
the last error. ``/readyz`` lists it among its components and the dashboard's
overview shows it (both through :meth:`crewlet.engine.core.Engine.status_reports`).
"""
from __future__ import annotations

import abc
import asyncio
import importlib
import logging
import os
import random
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Optional

from django.conf import settings

from crewlet.engine.services import Task, cancel_and_wait
from crewlet.company.org import (
    MODE_SOCKET, SEAT_SOCKET_ANY_MODE, SEAT_SOCKET_TOKEN_KEYS, SURFACE_SOCKET_TOKEN_KEYS, Organization, Surface,
)

if TYPE_CHECKING:  # pragma: no cover
    from notifications.edge import Edge, EdgeResponse

log = logging.getLogger("crewlet.notifications.sockets")

#: The engine service name of a surface's socket client, and its ``/readyz`` component.
SERVICE_PREFIX = "surface_socket:"
#: The ``route`` a socket's deliveries are recorded under (the webhook route's is its path).
ROUTE_PREFIX = "socket:"

STATE_CONNECTED = "connected"
STATE_CONNECTING = "connecting"
#: Another node holds the surface's duty lease and runs its socket; this one waits to take over.
STATE_STANDBY = "standby"
STATE_NOT_CONFIGURED = "not configured"
STATE_STOPPED = "stopped"


class SocketError(Exception):
    """The root of the socket clients' errors: a vendor or a socket that failed, translated at the boundary."""


class SocketRefused(SocketError):
    """The vendor refused the token (no retry will help until the operator changes it, but the client keeps trying)."""


class FrameNotTaken(SocketError):
    """The edge could not put a frame on the broker: the session ends without counting it read, so it comes again."""


def service_name(surface: str, seat: str = "") -> str:
    """``surface_socket:<kind>``, or ``surface_socket:<kind>:<seat>`` for a seat's own: the service, the duty lease, the component."""
    return f"{SERVICE_PREFIX}{surface}" + (f":{seat}" if seat else "")


def route_of(surface: str) -> str:
    return f"{ROUTE_PREFIX}{surface}"


def socket_surfaces(org: Organization) -> list[Surface]:
    """The surfaces the company says arrive over a socket (``mode: socket``), in the company's order."""
    return [s for s in org.surfaces.values() if s.mode == MODE_SOCKET]


def token_key(surface: Surface) -> str:
    """The company file's key naming ``surface``'s socket token variable (for a hint)."""
    return SURFACE_SOCKET_TOKEN_KEYS.get(surface.name, "token_env")


@dataclass(frozen=True)
class SocketSpec:
    """One socket the company opens: the surface as it dials it (its token variable, its server), and whose token it is.

    ``seat`` is "" for the company-level socket (``surfaces.<kind>``);
    ``named_by`` is the company-file key naming the token variable, for a hint;
    ``identity`` the seat's ``identities.<kind>`` (what routing knows its bot as).
    """

    surface: Surface
    seat: str = ""
    named_by: str = ""
    identity: str = ""

    @property
    def name(self) -> str:
        return service_name(self.surface.name, self.seat)


def company_sockets(org: Organization) -> list[SocketSpec]:
    """Every socket the company opens: the company-level ones that name a token, then each seat's own (see the module's docstring)."""
    specs = [SocketSpec(s, named_by=f"surfaces.{s.name}.{token_key(s)}") for s in socket_surfaces(org) if s.token_env]
    for seat in org.agent_seats():
        for kind, key in SEAT_SOCKET_TOKEN_KEYS.items():
            surface, token_env = org.surfaces.get(kind), seat.own_socket_token_env(kind)
            if surface is None or not token_env or not (surface.socket or kind in SEAT_SOCKET_ANY_MODE):
                continue
            specs.append(SocketSpec(
                replace(surface, mode=MODE_SOCKET, token_env=token_env), seat.handle,
                f"seats.{seat.handle}.{kind}.{key}", seat.identities.get(kind, ""),
            ))
    return specs


@dataclass(frozen=True)
class SocketTimings:
    """How long a client waits before reconnecting (doubling from ``retry_min_s`` to ``retry_max_s``), how often it pings, how long it waits for the edge, how often it asks for its duty lease."""

    retry_min_s: float = 1.0
    retry_max_s: float = 60.0
    ping_s: float = 10.0
    deliver_timeout_s: float = 30.0
    #: How often a node asks whether it holds (or may now take) the socket's duty lease (the fleet's renewal pace).
    duty_check_s: float = 5.0

    @classmethod
    def from_settings(cls) -> "SocketTimings":
        return cls(
            retry_min_s=float(getattr(settings, "SURFACE_SOCKET_RETRY_MIN_S", cls.retry_min_s)),
            retry_max_s=float(getattr(settings, "SURFACE_SOCKET_RETRY_MAX_S", cls.retry_max_s)),
            ping_s=float(getattr(settings, "SURFACE_SOCKET_PING_S", cls.ping_s)),
        )


@dataclass
class Backoff:
    """Full-jitter exponential backoff: the n-th wait is uniform in [0, min(max, min·2ⁿ)], never below ``min_s``/2.

    The jitter keeps a fleet of laptops that lost the vendor together from
    coming back in one burst.
    """

    min_s: float
    max_s: float
    attempts: int = 0
    rand: Callable[[], float] = random.random

    def next_s(self) -> float:
        ceiling = min(self.max_s, self.min_s * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        return max(self.min_s / 2, ceiling * self.rand())

    def reset(self) -> None:
        self.attempts = 0


def _iso(stamp: Optional[float]) -> Optional[str]:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat() if stamp is not None else None


@dataclass
class SurfaceStatus:
    """What one socket client reports: connected or not, the last frame, the last error (never a token)."""

    surface: str
    transport: str
    clock: Callable[[], float] = time.time
    configured: bool = True
    standby: bool = False
    connected: bool = False
    stopped: bool = False
    connects: int = 0
    frames: int = 0
    delivered: int = 0
    #: Frames the edge could not put on the broker (left for the vendor to send again).
    not_taken: int = 0
    last_frame_at: Optional[float] = None
    last_error: str = ""
    last_error_at: Optional[float] = None
    hint: str = ""
    #: The seat whose own token the socket uses ("" = the company-level socket).
    seat: str = ""

    def frame(self) -> None:
        self.frames += 1
        self.last_frame_at = self.clock()

    def error(self, why: str) -> None:
        self.last_error = why
        self.last_error_at = self.clock()

    @property
    def state(self) -> str:
        if not self.configured:
            return STATE_NOT_CONFIGURED
        if self.stopped:
            return STATE_STOPPED
        if self.standby:
            return STATE_STANDBY
        return STATE_CONNECTED if self.connected else STATE_CONNECTING

    def report(self) -> dict[str, Any]:
        """The ``/readyz`` component and the dashboard's row: ``ok`` while connected, or standing by for another node."""
        out: dict[str, Any] = {
            "ok": self.state in (STATE_CONNECTED, STATE_STANDBY),
            "state": self.state,
            "surface": self.surface,
            "mode": MODE_SOCKET,
            "transport": self.transport,
            "connected": self.connected,
            "connects": self.connects,
            "frames": self.frames,
            "delivered": self.delivered,
            "not_taken": self.not_taken,
            "last_frame_at": _iso(self.last_frame_at),
            "last_error": self.last_error,
            "last_error_at": _iso(self.last_error_at),
        }
        if self.seat:
            out["seat"] = self.seat
        if self.hint:
            out["hint"] = self.hint
        return out


def missing_token(surface: Surface, environ: Mapping[str, str], named_by: str = "") -> str:
    """Why ``surface``'s socket cannot connect for want of its token ("" when the variable is set)."""
    if environ.get(surface.token_env, ""):
        return ""
    named_by = named_by or f"surfaces.{surface.name}.{token_key(surface)}"
    return f"set {surface.token_env} (named by {named_by}) in this process's environment"


#: ``hold_duty(name)``: whether this node runs once-per-fleet duty ``name`` now (the fleet member's).
HoldDuty = Callable[[str], Awaitable[bool]]


class SocketClient(abc.ABC):
    """What both socket clients share: the duty lease, the token check at start, the task, the status, and handing a frame to the edge.

    A subclass says how to :meth:`serve` (connect, read, reconnect) and how to
    :meth:`close` what it opened. The edge is the notify service's
    (:class:`~notifications.edge.Edge`), so a frame takes the webhook route's path.

    ``seat`` names the seat whose own token it connects with (its service and
    lease are ``surface_socket:<kind>:<seat>``); ``named_by`` the company-file
    key naming the token variable; ``identity`` what routing knows the seat as there.

    With ``hold_duty`` (the fleet member's), the socket runs only on the node
    holding the duty lease named after the service (``surface_socket:<kind>``):
    a vendor sends each event to every open socket of an app, so two nodes
    connected would each take every delivery. The others stand by and ask
    again every ``timings.duty_check_s``; a node that loses the lease closes its socket.
    """

    transport = ""

    def __init__(
        self,
        surface: Surface,
        edge: "Edge",
        *,
        environ: Optional[Mapping[str, str]] = None,
        timings: Optional[SocketTimings] = None,
        clock: Callable[[], float] = time.time,
        hold_duty: Optional[HoldDuty] = None,
        seat: str = "",
        named_by: str = "",
        identity: str = "",
    ) -> None:
        self.surface, self.edge, self.hold_duty = surface, edge, hold_duty
        self.seat, self.named_by, self.identity = seat, named_by, identity
        self.environ: Mapping[str, str] = environ if environ is not None else os.environ
        self.timings = timings or SocketTimings.from_settings()
        self.status = SurfaceStatus(surface.name, self.transport, clock=clock, seat=seat)
        self.backoff = Backoff(self.timings.retry_min_s, self.timings.retry_max_s)
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[Task] = None

    @property
    def name(self) -> str:
        return service_name(self.surface.name, self.seat)

    @property
    def token(self) -> str:
        return self.environ.get(self.surface.token_env, "")

    async def start(self) -> None:
        """Start connecting; with the token variable unset, report ``not configured`` (the notify service warned at start)."""
        self.loop = asyncio.get_running_loop()
        why = missing_token(self.surface, self.environ, self.named_by)
        if why:
            self.status.configured = False
            self.status.hint = why
            return
        log.info(
            "surface_socket_starting",
            extra={
                "surface": self.surface.name, "seat": self.seat, "transport": self.transport,
                "server": self.surface.server or "(default)",
            },
        )
        self._task = Task(self.name, self.run)
        await self._task.start()

    async def stop(self) -> None:
        self.status.stopped = True
        task, self._task = self._task, None
        try:
            if task is not None:
                await task.stop()
        finally:
            await self.close()
            self.status.connected = False

    def healthy(self) -> bool:
        """Whether its task runs (``/readyz``'s duties); a client with no token runs none by design.

        An unset token is reported as ``not configured`` (``/readyz``'s
        ``degraded``), never as a dead duty: like a socket that cannot reach its
        vendor, it must not take the node out of service.
        """
        return not self.status.configured or (self._task is not None and self._task.alive)

    def status_report(self) -> dict[str, Any]:
        return self.status.report()

    async def run(self) -> None:
        """Serve while this node holds the surface's duty (always, without a fleet); stand by while another node does."""
        if self.hold_duty is None:
            await self.serve()
            return
        while True:
            if not await self._holds():
                self.status.standby = True
                await asyncio.sleep(self.timings.duty_check_s)
                continue
            self.status.standby = False
            log.info("surface_socket_duty_held", extra={"surface": self.surface.name, "seat": self.seat, "duty": self.name})
            serving = asyncio.create_task(self.serve(), name=f"{self.name}:serve")
            try:
                while not serving.done():
                    await asyncio.wait({serving}, timeout=self.timings.duty_check_s)
                    if not serving.done() and not await self._holds():
                        log.warning("surface_socket_duty_lost", extra={"surface": self.surface.name, "seat": self.seat, "duty": self.name})
                        break
            finally:
                await cancel_and_wait([serving])
                await self.close()
                self.status.connected = False
            if not serving.cancelled():
                serving.result()  # serve() returns only by failing: the Task logs it

    async def _holds(self) -> bool:
        assert self.hold_duty is not None
        try:
            return await self.hold_duty(self.name)
        except Exception as exc:  # the coordination store away: not ours until it answers
            self.status.error(f"the duty lease could not be read: {type(exc).__name__}")
            log.warning("surface_socket_duty_unknown", extra={"surface": self.surface.name, "error": f"{type(exc).__name__}: {exc}"})
            return False

    @abc.abstractmethod
    async def serve(self) -> None:
        """Connect, read, reconnect: until cancelled."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close what :meth:`serve` opened (idempotent)."""

    async def pause(self, why: str) -> None:
        """Wait out the next backoff after ``why`` ended a session or a connect."""
        self.status.connected = False
        self.status.error(why)
        delay_s = self.backoff.next_s()
        log.warning(
            "surface_socket_disconnected",
            extra={"surface": self.surface.name, "seat": self.seat, "transport": self.transport, "error": why, "retry_in_s": round(delay_s, 3)},
        )
        await asyncio.sleep(delay_s)

    async def take(self, body: bytes) -> "EdgeResponse":
        """Hand one frame's delivery to the edge; :class:`FrameNotTaken` when it is not on the broker.

        A frame the edge refuses (4xx: unreadable, unstorable) is taken as
        read: the vendor sending it again would be refused again.
        """
        response = await self.edge.deliver(self.surface.name, body, route=route_of(self.surface.name))
        if response.status >= 500:
            self.status.not_taken += 1
            reason = (response.body or {}).get("error", "") if isinstance(response.body, dict) else ""
            raise FrameNotTaken(f"the edge answered {response.status}: {reason}")
        if response.status >= 400:
            log.warning(
                "surface_socket_frame_refused",
                extra={"surface": self.surface.name, "status": response.status, "reason": (response.body or {}).get("error", "")},
            )
        else:
            self.status.delivered += 1
        return response


def client_for(surface: Surface, edge: "Edge", **options: Any) -> SocketClient:
    """The client of a ``mode: socket`` surface: the ``CLIENT`` of the module named after its kind, beside this one.

    Imported only when the company asks for it, so a node with no socket
    surface never loads a vendor's SDK.
    """
    module = importlib.import_module(f"{__name__}.{surface.name}")
    client: type[SocketClient] = module.CLIENT
    return client(surface, edge, **options)


__all__ = [
    "Backoff",
    "HoldDuty",
    "FrameNotTaken",
    "ROUTE_PREFIX",
    "SERVICE_PREFIX",
    "STATE_CONNECTED",
    "STATE_CONNECTING",
    "STATE_NOT_CONFIGURED",
    "STATE_STANDBY",
    "STATE_STOPPED",
    "SocketClient",
    "SocketError",
    "SocketRefused",
    "SocketSpec",
    "SocketTimings",
    "SurfaceStatus",
    "client_for",
    "company_sockets",
    "missing_token",
    "route_of",
    "service_name",
    "socket_surfaces",
    "token_key",
]
