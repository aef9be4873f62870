"""Which seats this node runs: the seat leases of the fleet, behind one seam.

Membership of a seat's consumer group IS ownership — the node that attaches is
the node that gets the seat's work — so every place that attaches or keeps an
inbox loop running asks this object first. :class:`LeasedOwnership` (what an
engine runs) answers from this node's seat leases in the coordination store
and plans its fair share under the seats' placement
(:mod:`crewlet.fleet.placement`); :class:`SeatOwnership` is the solo claimer a
test builds a runtime with. A loop whose seat is no longer owned defers what
it was handed (head of the queue) and is detached.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol, runtime_checkable

from crewlet.base.db import in_store
from crewlet.fleet import leases, placement
from crewlet.fleet.leases import SEAT
from crewlet.fleet.placement import Unplaceable
from crewlet.fleet.roster import live_nodes
from crewlet.company.org import Organization

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.fleet.member import FleetMember

log = logging.getLogger("crewlet.seats.ownership")


@dataclass(frozen=True)
class Plan:
    """One placement sweep's work for this node: seats to take, seats to give up, seats nobody can run."""

    take: tuple[str, ...] = ()
    give: tuple[str, ...] = ()
    unplaceable: tuple[Unplaceable, ...] = ()


@runtime_checkable
class Ownership(Protocol):
    """The seam: what the runtime needs to know about who runs which seat."""

    def claimed(self) -> frozenset[str]:
        """Handles this node holds right now."""

    def owns(self, handle: str) -> bool:
        """Whether this node may do ``handle``'s work at this moment (asked per delivery)."""

    async def claim(self, handle: str) -> bool:
        """Take ``handle``; False when another node holds it (never, for the solo claimer)."""

    async def claim_many(self, handles: list[str]) -> list[str]:
        """:meth:`claim` of each of ``handles`` at once; the ones taken, in the order given."""

    async def release(self, handle: str) -> None:
        """Give ``handle`` up; idempotent."""

    async def release_many(self, handles: list[str]) -> None:
        """:meth:`release` of each of ``handles`` at once."""

    async def plan(self, org: Organization, held: frozenset[str]) -> Plan:
        """What this node should take and give up now, ``held`` being the seats it runs."""


class SeatOwnership:
    """The solo claimer: this node claims every agent seat it is asked to.

    ``claimable`` narrows it (a test's "nobody runs this seat yet"); a fleet
    swaps the whole class for leases in the coordination store.
    """

    def __init__(self, node_id: str = "", *, claimable: Iterable[str] | None = None) -> None:
        self.node_id = node_id
        self._claimed: set[str] = set()
        self._claimable: set[str] | None = set(claimable) if claimable is not None else None

    def claimed(self) -> frozenset[str]:
        return frozenset(self._claimed)

    def owns(self, handle: str) -> bool:
        return handle in self._claimed

    def allow(self, handle: str) -> None:
        """Make ``handle`` claimable (only meaningful when built with ``claimable``)."""
        if self._claimable is not None:
            self._claimable.add(handle)

    async def claim(self, handle: str) -> bool:
        if self._claimable is not None and handle not in self._claimable:
            return False
        if handle not in self._claimed:
            self._claimed.add(handle)
            log.info("seat_claimed", extra={"seat": handle, "node": self.node_id})
        return True

    async def claim_many(self, handles: list[str]) -> list[str]:
        return [handle for handle in handles if await self.claim(handle)]

    async def release(self, handle: str) -> None:
        if handle in self._claimed:
            self._claimed.discard(handle)
            log.info("seat_released", extra={"seat": handle, "node": self.node_id})

    async def release_many(self, handles: list[str]) -> None:
        for handle in handles:
            await self.release(handle)

    async def plan(self, org: Organization, held: frozenset[str]) -> Plan:
        """Alone, every agent seat is this node's (``claim`` narrows it to the claimable ones)."""
        return Plan(take=tuple(s.handle for s in org.agent_seats() if s.handle not in held))


class LeasedOwnership:
    """Seat ownership as this node's seat leases (:class:`~crewlet.fleet.member.FleetMember`).

    ``owns`` is the member's own deadline for the seat, so a node whose
    renewals stopped getting through stops doing a seat's work before its
    lease lets another node start it.
    """

    def __init__(self, member: "FleetMember", *, moves_per_sweep: int = placement.MOVES_PER_SWEEP) -> None:
        self.member = member
        self.node_id = member.node_id
        self.moves_per_sweep = moves_per_sweep

    def claimed(self) -> frozenset[str]:
        return self.member.seats()

    def owns(self, handle: str) -> bool:
        return self.member.holds_seat(handle)

    async def claim(self, handle: str) -> bool:
        return await self.member.acquire_seat(handle)

    async def claim_many(self, handles: list[str]) -> list[str]:
        """One transaction of the store for all of ``handles``, not a commit per seat (a fleet's share of thousands)."""
        taken = await self.member.acquire_seats(handles)
        return [handle for handle in handles if handle in taken]

    async def release(self, handle: str) -> None:
        await self.member.release_seat(handle)

    async def release_many(self, handles: list[str]) -> None:
        await self.member.release_seats(handles)

    async def plan(self, org: Organization, held: frozenset[str]) -> Plan:
        """This node's fair share under placement, from the live roster and the live seat leases."""
        placements = {seat.handle: seat.placement for seat in org.agent_seats()}
        nodes, holders = await in_store(_read_fleet)(list(placements))
        live = {node.id for node in nodes}
        holding = {seat: node for seat, node in holders.items() if node in live}
        assignment = placement.assign(placements, nodes, holding)
        allowed = placement.allowed_on(self.node_id, self.member.labels, placements)
        moves = placement.moves(self.node_id, assignment, holding, held, allowed, limit=self.moves_per_sweep)
        return Plan(take=moves.take, give=moves.give, unplaceable=assignment.unplaceable)


def _read_fleet(handles: list[str]) -> tuple[list, dict[str, str]]:
    """The live roster and the live leases of ``handles`` (blocking)."""
    return live_nodes(), leases.holders(SEAT, names=handles)


__all__ = ["LeasedOwnership", "Ownership", "Plan", "SeatOwnership"]
