"""Which seats this node runs: one component, so the fleet issue can put leases behind it.

Membership of a seat's consumer group IS ownership — the node that attaches is
the node that gets the seat's work — so every place that attaches or keeps an
inbox loop running asks this object first. Today a node claims every agent seat
of the company; a fleet replaces :class:`SeatOwnership` with a lease-backed one
(same four verbs) and nothing else changes: a loop whose seat is no longer
owned defers what it was handed and stops.
"""
from __future__ import annotations

import logging
from typing import Iterable, Protocol, runtime_checkable

log = logging.getLogger("crewlet.seats.ownership")


@runtime_checkable
class Ownership(Protocol):
    """The seam: what the runtime needs to know about who runs which seat."""

    def claimed(self) -> frozenset[str]:
        """Handles this node holds right now."""

    def owns(self, handle: str) -> bool:
        """Whether this node may do ``handle``'s work at this moment (asked per delivery)."""

    async def claim(self, handle: str) -> bool:
        """Take ``handle``; False when another node holds it (never, for the solo claimer)."""

    async def release(self, handle: str) -> None:
        """Give ``handle`` up; idempotent."""


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

    async def release(self, handle: str) -> None:
        if handle in self._claimed:
            self._claimed.discard(handle)
            log.info("seat_released", extra={"seat": handle, "node": self.node_id})


__all__ = ["Ownership", "SeatOwnership"]
