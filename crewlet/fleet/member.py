"""This node's membership of the fleet: its presence, the seats and duties it holds, kept renewed.

:class:`FleetMember` is the :data:`~crewlet.engine.interfaces.FLEET` service. At
start it reads (or writes, the first time) its event store's identity, takes
that store's lease — refusing to start when another live node already writes
the store — and writes its presence (node lease: id, labels, protocol, store).
Every third of ``fleet.lease_ttl_s`` it renews, in one pass, its presence,
its store, its duties and its seats; a seat whose renewal the database
refused is gone (another node may hold it now), and whoever listens hears of
it at once. A clean stop releases every lease so the others need not wait
for a TTL.

Whether this node may act on a lease is decided by its OWN deadline (the TTL
counted from when it sent the last renewal that succeeded, see
:class:`~crewlet.fleet.leases.LeaseClock`), never by the row, so a node cut off
from the store stops working before the row lets anyone else start. Stopping
takes a moment (a running turn is cancelled and awaited), so a seat is given
up ``guard_s`` before that deadline: a watcher wakes then, whether or not a
renewal came back at all (a store that does not answer announces nothing),
and tells the listeners the seat is lost.

The engine stops this service last, after the queue has closed
(``stop_last``): a turn that outlived the drain is cut by that close, and its
seat's lease is given back only once it has ended.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable

from django.db.models.functions import Now

from crewlet.base.db import in_store
from crewlet.engine.interfaces import FLEET
from crewlet.engine.services import Periodic, Service
from crewlet.fleet import PROTOCOL_VERSION, StoreClaimed, leases
from crewlet.fleet.leases import DUTY, NODE, SEAT
from crewlet.models import NodeLease, StoreIdentity

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.fleet")

#: The duty-lease name prefix under which a node holds its event store.
STORE_LEASE_PREFIX = "store:"

#: The share of the TTL before its own deadline at which a seat whose renewals are not getting through is given up.
GIVE_UP_SHARE = 1.0 / 6.0

#: Told the seats this node has just lost (their leases' renewal was refused, or their own deadline is near).
LostListener = Callable[[frozenset[str]], Awaitable[None]]


def store_identity() -> str:
    """This node's event store's identity, written once into the store itself (blocking)."""
    row, _created = StoreIdentity.objects.get_or_create(id=StoreIdentity.ROW_ID, defaults={"identity": uuid.uuid4().hex})
    return row.identity


class FleetMember:
    """One node's leases. ``clock`` (monotonic seconds) is injectable so a test can run out a TTL."""

    def __init__(
        self,
        node_id: str,
        *,
        labels: Iterable[str] = (),
        ttl_s: float = 15.0,
        protocol: int = PROTOCOL_VERSION,
        clock: Callable[[], float] = time.monotonic,
        data: bool = True,
    ) -> None:
        if not node_id:
            raise ValueError("a fleet member needs a node id")
        self.node_id = node_id
        self.labels = tuple(labels)
        self.ttl_s = ttl_s
        self.protocol = protocol
        self.clock = clock
        #: Whether this node keeps an event store; a stateless node's presence names none, so no read asks it.
        self.data = data
        self.store = ""
        self._seats: dict[str, float] = {}  # handle -> own deadline
        self._duties: dict[str, float] = {}  # duty name -> own deadline
        self._presence_until = 0.0
        self._listeners: list[LostListener] = []
        self._renewer = Periodic("fleet_renew", self.renew_every_s, self.renew, logger=log, first_after_s=self.renew_every_s)
        self._watcher = Periodic("fleet_seat_deadlines", self._until_next_give_up_s, self.give_up_overdue, logger=log)
        self._started = False

    # -- what the rest of the node asks --------------------------------------------------

    @property
    def renew_every_s(self) -> float:
        """A third of the TTL: two renewals may fail before a lease runs out."""
        return self.ttl_s / 3.0

    @property
    def guard_s(self) -> float:
        """How long before its own deadline a seat is given up: the time its running turn has to end."""
        return self.ttl_s * GIVE_UP_SHARE

    @property
    def store_lease(self) -> str:
        return STORE_LEASE_PREFIX + self.store

    def present(self) -> bool:
        """Whether this node's presence is good by its own deadline."""
        return self.clock() < self._presence_until

    def holds_seat(self, handle: str) -> bool:
        """Whether this node may do ``handle``'s work at this instant (asked per delivery)."""
        return self.clock() < self._seats.get(handle, 0.0) - self.guard_s

    def deadline(self, handle: str) -> float:
        """This node's own deadline for ``handle`` on its clock (0.0 when it holds no lease of it)."""
        return self._seats.get(handle, 0.0)

    def seats(self) -> frozenset[str]:
        """The seats this node holds right now."""
        now = self.clock()
        return frozenset(h for h, until in list(self._seats.items()) if now < until - self.guard_s)

    def duties(self) -> frozenset[str]:
        """The once-per-fleet duties (this node's event-store claim among them) it holds right now."""
        now = self.clock()
        return frozenset(name for name, until in list(self._duties.items()) if now < until)

    def on_lost(self, listener: LostListener) -> None:
        """Call ``listener`` with the seats a renewal found lost (it detaches their loops)."""
        self._listeners.append(listener)

    async def acquire_seat(self, handle: str) -> bool:
        """Take ``handle``'s lease; False when another live node holds it."""
        sent = self.clock()
        if not await in_store(leases.acquire)(SEAT, handle, self.node_id, self.ttl_s):
            return False
        self._seats[handle] = sent + self.ttl_s
        log.info("seat_lease_acquired", extra={"seat": handle, "node": self.node_id})
        return True

    async def acquire_seats(self, handles: list[str]) -> set[str]:
        """:meth:`acquire_seat` of many seats in one transaction of the store; the handles now this node's."""
        if not handles:
            return set()
        sent = self.clock()
        taken = await in_store(leases.acquire_many)(SEAT, handles, self.node_id, self.ttl_s)
        for handle in handles:
            if handle in taken:
                self._seats[handle] = sent + self.ttl_s
                log.info("seat_lease_acquired", extra={"seat": handle, "node": self.node_id})
        return taken

    async def release_seat(self, handle: str) -> None:
        """Give ``handle`` up at once (idempotent): another node may take it on its next sweep."""
        await self.release_seats([handle])

    async def release_seats(self, handles: list[str]) -> None:
        """:meth:`release_seat` of many seats in one statement."""
        if not handles:
            return
        for handle in handles:
            self._seats.pop(handle, None)
        held = await in_store(leases.release_held)(SEAT, handles, self.node_id)
        for handle in handles:
            if handle in held:
                log.info("seat_lease_released", extra={"seat": handle, "node": self.node_id})

    async def hold_duty(self, name: str) -> bool:
        """Whether this node runs once-per-fleet duty ``name`` now, taking its lease when it is free.

        A duty once taken stays with this node (renewed with the rest) until
        the node stops or loses it, so it does not wander between nodes.
        """
        if self.clock() < self._duties.get(name, 0.0):
            return True
        sent = self.clock()
        if not await in_store(leases.acquire)(DUTY, name, self.node_id, self.ttl_s):
            self._duties.pop(name, None)
            return False
        self._duties[name] = sent + self.ttl_s
        log.info("duty_lease_acquired", extra={"duty": name, "node": self.node_id})
        return True

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Identify the store, claim it, write the presence, start renewing. Refuses with :class:`StoreClaimed`.

        A stateless node has no store to identify or claim: its presence names none.
        """
        if self.data:
            self.store = await in_store(store_identity, alias="events")()
        sent = self.clock()
        await in_store(self._join)()
        self._presence_until = sent + self.ttl_s
        if self.data:
            self._duties[self.store_lease] = sent + self.ttl_s
        await self._renewer.start()
        await self._watcher.start()
        self._started = True
        log.info(
            "fleet_node_joined",
            extra={"node": self.node_id, "labels": list(self.labels), "store": self.store, "lease_ttl_s": self.ttl_s},
        )

    def _join(self) -> None:
        if not self.data:
            self._write_presence()
            return
        if not leases.acquire(DUTY, self.store_lease, self.node_id, self.ttl_s):
            other = leases.holder_of(DUTY, self.store_lease) or "another node"
            raise StoreClaimed(
                f"node {self.node_id} refuses to start: its event store {self.store} is already written by "
                f"live node {other}; give each node its own events database"
            )
        same_id = NodeLease.objects.filter(name=self.node_id, expires_at__gt=Now()).exclude(holder="").first()
        if same_id is not None and same_id.store and same_id.store != self.store:
            leases.release(DUTY, [self.store_lease], self.node_id)
            raise StoreClaimed(
                f"node {self.node_id} refuses to start on event store {self.store}: a live node {self.node_id} "
                f"already runs on event store {same_id.store}; give each node its own node id"
            )
        self._write_presence()

    def _write_presence(self) -> bool:
        return leases.acquire(
            NODE, self.node_id, self.node_id, self.ttl_s, labels=list(self.labels), protocol=self.protocol, store=self.store
        )

    async def stop(self) -> None:
        """Stop renewing and give every lease back at once (seats, duties, the store, the presence)."""
        if not self._started:
            return
        self._started = False
        await self._renewer.stop()
        await self._watcher.stop()
        seats, duties = list(self._seats), list(self._duties)
        self._seats.clear()
        self._duties.clear()
        self._presence_until = 0.0
        try:
            await in_store(self._leave)(seats, duties)
        except Exception:
            log.exception("fleet_leave_failed", extra={"node": self.node_id})
            return
        log.info("fleet_node_left", extra={"node": self.node_id, "seats": len(seats), "duties": len(duties)})

    def _leave(self, seats: list[str], duties: list[str]) -> None:
        leases.release(SEAT, seats, self.node_id)
        leases.release(DUTY, duties, self.node_id)
        leases.release(NODE, [self.node_id], self.node_id)

    # -- the renewal ----------------------------------------------------------------------

    async def renew(self) -> None:
        """One renewal pass: presence, duties and seats; lost seats are dropped and announced."""
        seats = dict(self._seats)
        duties = dict(self._duties)
        sent = self.clock()
        present, kept_seats, kept_duties = await in_store(self._renew)(list(seats), list(duties))
        if present:
            self._presence_until = sent + self.ttl_s
        for name, before in duties.items():
            if name in kept_duties:
                self._duties[name] = sent + self.ttl_s
            elif self._duties.get(name) == before:
                self._duties.pop(name, None)
                log.warning("duty_lease_lost", extra={"duty": name, "node": self.node_id})
        lost = []
        for handle, before in seats.items():
            if handle in kept_seats:
                if handle in self._seats:
                    self._seats[handle] = sent + self.ttl_s
            elif self._seats.get(handle) == before:  # not taken again meanwhile
                self._seats.pop(handle, None)
                lost.append(handle)
        if lost:
            log.warning("seat_leases_lost", extra={"seats": sorted(lost), "node": self.node_id})
            await self._tell_lost(lost)

    async def give_up_overdue(self) -> None:
        """Give up every seat within ``guard_s`` of its own deadline, and tell the listeners (the watcher's pass).

        Its renewals have not got through (refused, failed or unanswered), so
        by the row another node may start it at that deadline; the listeners
        end its turn before then. Its row is left to run out: the store may be
        away, and a renewal answering late does not bring the seat back (the
        next placement sweep takes it again if the row is still this node's).
        """
        now = self.clock()
        overdue = [h for h, until in list(self._seats.items()) if now >= until - self.guard_s]
        for handle in overdue:
            self._seats.pop(handle, None)
        if overdue:
            log.warning(
                "seat_leases_given_up", extra={"seats": sorted(overdue), "node": self.node_id, "guard_s": self.guard_s}
            )
            await self._tell_lost(overdue)

    def _until_next_give_up_s(self) -> float:
        """How long the watcher may sleep: until the earliest seat is due to be given up (renewals only push it later)."""
        dues = [until - self.guard_s for until in list(self._seats.values())]
        if not dues:
            return self.renew_every_s
        return max(min(dues) - self.clock(), 0.0)

    async def _tell_lost(self, handles: list[str]) -> None:
        for listener in list(self._listeners):
            try:
                await listener(frozenset(handles))
            except Exception:
                log.exception("seat_lease_lost_listener_failed", extra={"node": self.node_id})

    def _renew(self, seats: list[str], duties: list[str]) -> tuple[bool, set[str], set[str]]:
        present = bool(leases.renew(NODE, [self.node_id], self.node_id, self.ttl_s))
        if not present:
            # Lapsed (the store was away longer than a TTL): this node is back, so it says so again.
            present = self._write_presence()
            log.warning("fleet_presence_rewritten", extra={"node": self.node_id, "present": present})
        kept_duties = leases.renew(DUTY, duties, self.node_id, self.ttl_s)
        if self.store_lease in duties and self.store_lease not in kept_duties:
            if leases.acquire(DUTY, self.store_lease, self.node_id, self.ttl_s):
                kept_duties.add(self.store_lease)
            else:
                log.error("fleet_store_taken", extra={"node": self.node_id, "store": self.store})
        return present, leases.renew(SEAT, seats, self.node_id, self.ttl_s), kept_duties


def services(engine: "Engine") -> list[Service]:
    """This node's :class:`FleetMember` as the :data:`~crewlet.engine.interfaces.FLEET` service."""

    def make(engine: "Engine") -> FleetMember:
        settings = engine.settings
        return FleetMember(
            settings.node.id,
            labels=settings.node.labels,
            ttl_s=settings.fleet.lease_ttl_s,
            data=settings.node.data,
        )

    return [Service(FLEET, make, stop_last=True)]


__all__ = ["GIVE_UP_SHARE", "STORE_LEASE_PREFIX", "FleetMember", "LostListener", "services", "store_identity"]
