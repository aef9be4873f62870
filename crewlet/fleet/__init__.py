"""The fleet: which nodes are live, which node runs which seat, which node runs a once-per-fleet duty.

Every answer lives in the coordination store (``default``) as a lease — a row
with a holder and an ``expires_at`` that a node takes and keeps by
compare-and-set (:mod:`crewlet.fleet.leases`). A node's presence is its node
lease (:mod:`crewlet.fleet.roster` reads the live ones); a seat's lease says
who may attach to its mailbox; a duty's lease says who runs it this time.
A process that dies holds nothing past its TTL, and one that stops cleanly
gives everything back at once.

Infrastructure: this package imports no app. The seat runtime puts its
ownership behind :class:`crewlet.fleet.member.FleetMember`.
"""
from __future__ import annotations

#: The fleet protocol this build speaks: written in its node lease, read by whoever asks the fleet a question.
PROTOCOL_VERSION = 1


class FleetError(Exception):
    """The root of this package's errors."""


class StoreClaimed(FleetError):
    """Another live node already writes this event store (or already runs under this node id on another store)."""


__all__ = ["PROTOCOL_VERSION", "FleetError", "StoreClaimed"]
