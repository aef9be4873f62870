"""The notifications app's engine service (:data:`~crewlet.engine.interfaces.NOTIFY`): ``NotifyService(queue, holder)``.

``start()`` warns about every surface the company left unverified (the
example company does, so the README's curl example works) and about every
verified surface the company configures whose secret variable is unset
(``webhook_secret_missing``, naming the variable: such a surface refuses
every delivery; for a ``mode: socket`` surface, its token variable) — a
surface the company file never names is not warned about — logs how each surface's
deliveries arrive (``surface_mode``: webhook or socket), builds the
webhook edge on ``queue`` (``POST /webhooks/<source>`` served by this process
asks the running engine's notify service for it and publishes through it), creates the fleet-wide ``notify`` group
and attaches the router, and runs the hourly prune of old dedupe keys, rate
windows and cold thread follows. ``stop()`` undoes all of it.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Mapping, Optional

from crewlet.engine.interfaces import EVENT_STORE, FLEET, NOTIFY
from crewlet.engine.services import Periodic, Service
from crewlet.queue.emit import Emitter
from crewlet.company.org import SURFACE_SECRET_KEYS, CompanyHolder, Organization
from crewlet.queue.contract import EventQueue
from notifications import edge as edge_module
from notifications import service, store
from notifications.seat_identities import verified_by_seats, warn_seat_identities
from notifications.sockets import SocketClient, SocketSpec, SocketTimings, client_for, company_sockets, missing_token

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.notifications")

PRUNE_INTERVAL_S = 3600.0


def unverified_surfaces(org: Organization) -> list[str]:
    """The surfaces whose deliveries are accepted without verification (``verify: false``)."""
    return [name for name, surface in org.surfaces.items() if not surface.verify]


def warn_unverified(org: Organization) -> list[str]:
    names = unverified_surfaces(org)
    for name in names:
        log.warning(
            "webhook_surface_unverified",
            extra={"surface": name, "hint": f"surfaces.{name}.verify is false: anyone who can reach /webhooks/{name} can wake a seat"},
        )
    return names


def unconfigured_surfaces(org: Organization, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(surface, variable) for each configured surface whose deliveries cannot arrive for want of its variable in ``environ``.

    Only surfaces the company file names under ``surfaces`` count: one it
    never names is not expected to receive anything. A webhook surface:
    verified, with its secret variable unset or empty (``variable`` is ""
    when the company names none); the edge refuses every delivery to it
    (401, "not configured"). A socket surface: its token
    variable unset or empty; its client cannot connect.
    """
    return [
        (name, surface.token_env if surface.socket else surface.secret_env)
        for name, surface in org.surfaces.items()
        if surface.configured
        # A socket surface naming no token of its own leaves its sockets to the seats' own (seat_identities warns of those).
        and (surface.token_env and missing_token(surface, environ) if surface.socket else surface.verify and not (surface.secret_env and environ.get(surface.secret_env, "")))
        and (surface.secret_env or not verified_by_seats(org, name))  # no company-level app: the seats' own verify
    ]


def warn_unconfigured(org: Organization, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Say at start, naming the VARIABLE (never a value), which surfaces will receive nothing."""
    missing = unconfigured_surfaces(org, environ)
    for name, variable in missing:
        surface = org.surfaces[name]
        if surface.socket:
            hint = f"the {name} socket cannot connect until then: {missing_token(surface, environ)}"
        else:
            key = SURFACE_SECRET_KEYS.get(name, "secret_env")
            hint = f"every delivery to /webhooks/{name} is refused until then: " + (
                f"set {variable} in this process's environment, or say surfaces.{name}.verify: false"
                if variable
                else f"name the secret's variable with surfaces.{name}.{key}"
            )
        log.warning("webhook_secret_missing", extra={"surface": name, "variable": variable, "hint": hint})
    return missing


def log_modes(org: Organization) -> dict[str, str]:
    """Say at start how each surface the company configures receives: ``webhook`` (POSTed here) or ``socket`` (this node dials out).

    A surface the company file never names says nothing: its route answers
    401 like any unverified delivery, and a line about it would be noise.
    """
    modes = {name: surface.mode for name, surface in org.surfaces.items() if surface.configured}
    for name, mode in modes.items():
        surface = org.surfaces[name]
        where = f"/webhooks/{name}" if not surface.socket else (surface.server or "the vendor's default server")
        log.info("surface_mode", extra={"surface": name, "mode": mode, "where": where})
    return modes


class NotifyService:
    """The notifications app's duties on one node: the edge, the router, the prune."""

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        install_edge: bool = True,
        prune_interval_s: float = PRUNE_INTERVAL_S,
        router: Optional[service.NotifyRouter] = None,
        emitter: Optional[Emitter] = None,
        **edge_options: Any,
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.install_edge = install_edge
        self.prune_interval_s = prune_interval_s
        self.router = router or service.NotifyRouter(queue, holder, emitter=emitter)
        #: The router's telemetry emitter is closed at stop only when this service made it.
        self._owns_emitter = router is None and emitter is None
        self.edge_options = edge_options
        self.edge: Optional[edge_module.Edge] = None
        self._prune: Optional[Periodic] = None

    async def start(self) -> None:
        org = self.holder.current()
        warn_unverified(org)
        environ = self.edge_options.get("environ")
        warn_unconfigured(org, environ if environ is not None else os.environ)
        warn_seat_identities(org, environ if environ is not None else os.environ)
        log_modes(org)
        if self.install_edge:
            self.edge = edge_module.Edge(self.queue, self.holder, **self.edge_options)
        await self.router.start()
        if self.prune_interval_s > 0 and self._prune is None:
            self._prune = Periodic(
                "notify_prune", self.prune_interval_s, self.prune, logger=log, first_after_s=self.prune_interval_s
            )
            await self._prune.start()

    async def stop(self) -> None:
        """Stop the prune, detach the router, remove the edge; a cancel of the caller still does all three, then propagates."""
        prune, self._prune = self._prune, None
        try:
            if prune is not None:
                await prune.stop()
        finally:
            try:
                await self.router.stop()
            finally:
                if self._owns_emitter:
                    await self.router.emitter.close()
                self.edge = None

    async def prune(self) -> None:
        """One pass of the hourly prune (dedupe keys, rate windows, cold thread follows); ``notify_prune_failed`` when it fails."""
        deleted = await store.aprune()
        if any(deleted.values()):
            log.info("notify_pruned", extra=deleted)


def services(engine: "Engine") -> list[Service]:
    """The notifications duties on ``engine.company``: the :data:`~crewlet.engine.interfaces.NOTIFY` service, and a client per socket surface.

    A socket client starts after the notify service, whose edge it feeds, and
    runs its socket only while this node holds its duty lease (the fleet
    member's :data:`~crewlet.engine.interfaces.FLEET`), so a fleet opens each socket once.
    """

    def make(engine: "Engine") -> NotifyService:
        assert engine.queue is not None
        return NotifyService(engine.queue, engine.company, emitter=engine.emitter)

    def client_of(spec: SocketSpec) -> Service:
        def make_client(engine: "Engine") -> SocketClient:
            edge = engine.get(NOTIFY).edge
            # The notify service this engine started (depends_on) made this app's Edge: a socket feeds it.
            assert isinstance(edge, edge_module.Edge)
            whose = {"seat": spec.seat, "named_by": spec.named_by, "identity": spec.identity}
            member = engine.find(FLEET)
            if member is None:
                return client_for(spec.surface, edge, **whose)
            timings = dataclasses.replace(SocketTimings.from_settings(), duty_check_s=member.renew_every_s)
            return client_for(spec.surface, edge, hold_duty=member.hold_duty, timings=timings, **whose)

        return Service(spec.name, make_client, depends_on=(NOTIFY,), after=(FLEET,))

    org = engine.company.current() if engine.company is not None else None
    return [Service(NOTIFY, make, after=(EVENT_STORE,)), *(client_of(s) for s in (company_sockets(org) if org else []))]


__all__ = [
    "NotifyService",
    "log_modes",
    "PRUNE_INTERVAL_S",
    "services",
    "unconfigured_surfaces",
    "unverified_surfaces",
    "warn_unconfigured",
    "warn_unverified",
]
