"""Placement: which live node should run each agent seat, computed the same way on every node.

Every node reads the same roster and the same seat leases and runs this pure
function, so the nodes agree on a target without talking to each other; the
seat leases (compare-and-set) keep them safe while they briefly disagree.

The target is a fair share under the placement rules: seats go, most
constrained first, to the eligible node carrying the fewest so far, and a
seat stays with its current holder whenever that holder is among the least
loaded — so a joining node takes about its share and no more seats move than
balance needs. A node acts on the difference a few seats per sweep
(:func:`moves`), which is what keeps a join or a departure from moving
everything at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from crewlet.fleet.roster import NodeInfo
from crewlet.company.org import Placement

#: Why a seat cannot be placed (wire strings: the ``reason`` of ``seats_unplaceable``).
REASON_PINNED_NODE_NOT_LIVE = "pinned node not live"
REASON_NO_NODE_WITH_LABELS = "no live node carries its labels"
REASON_NO_LIVE_NODE = "no live node"

#: Seats a node gives up to others in one sweep (taking free seats is not limited: nobody else runs them).
MOVES_PER_SWEEP = 2


@dataclass(frozen=True)
class Unplaceable:
    """A seat no live node may run, and why (``detail`` names the placement it asks for)."""

    seat: str
    reason: str
    detail: str


@dataclass(frozen=True)
class Assignment:
    """The target: seat -> node for every placeable seat, and the seats nobody can take."""

    target: Mapping[str, str] = field(default_factory=dict)
    unplaceable: tuple[Unplaceable, ...] = ()


def _why(placement: Placement, nodes: Sequence[NodeInfo]) -> str:
    if not nodes:
        return REASON_NO_LIVE_NODE
    if placement.node and placement.node not in {n.id for n in nodes}:
        return REASON_PINNED_NODE_NOT_LIVE
    return REASON_NO_NODE_WITH_LABELS


def assign(seats: Mapping[str, Placement], nodes: Iterable[NodeInfo], holders: Mapping[str, str]) -> Assignment:
    """Where each of ``seats`` (handle -> placement) should run among ``nodes``, given who holds what now."""
    live = sorted(nodes, key=lambda n: n.id)
    eligible = {
        handle: [n.id for n in live if placement.allows(n.id, n.labels)] for handle, placement in seats.items()
    }
    load = {n.id: 0 for n in live}
    target: dict[str, str] = {}
    unplaceable: list[Unplaceable] = []
    for handle in sorted(seats, key=lambda h: (len(eligible[h]), h)):
        candidates = eligible[handle]
        if not candidates:
            placement = seats[handle]
            unplaceable.append(Unplaceable(handle, _why(placement, live), placement.describe()))
            continue
        least = min(load[n] for n in candidates)
        holder = holders.get(handle, "")
        chosen = holder if holder in candidates and load[holder] == least else min(candidates, key=lambda n: (load[n], n))
        target[handle] = chosen
        load[chosen] += 1
    return Assignment(target=target, unplaceable=tuple(unplaceable))


@dataclass(frozen=True)
class Moves:
    """What one node does in one sweep: seats to take (free or its own) and seats to give to their target."""

    take: tuple[str, ...]
    give: tuple[str, ...]


def moves(
    node: str,
    assignment: Assignment,
    holders: Mapping[str, str],
    held: Iterable[str],
    allowed: Iterable[str],
    *,
    limit: int = MOVES_PER_SWEEP,
) -> Moves:
    """This node's part of reaching ``assignment``: take its target seats nobody live holds, give a few away.

    ``holders`` are the live leases (seat -> node); ``held`` what this node
    runs; ``allowed`` the seats its placement lets it run at all. A seat the
    target gives to another node for balance is given up at most ``limit`` per
    sweep; one this node may not run at all (pinned elsewhere, a label it
    lacks) is given up at once, since running it here breaks its placement.
    """
    mine, may = set(held), set(allowed)
    take = sorted(h for h, n in assignment.target.items() if n == node and h not in mine and holders.get(h, "") in ("", node))
    misplaced = sorted(h for h in mine if assignment.target.get(h) != node)
    forbidden = [h for h in misplaced if h not in may]
    rebalance = [h for h in misplaced if h in may and h in assignment.target][: max(0, limit)]
    return Moves(take=tuple(take), give=tuple(forbidden + rebalance))


def allowed_on(node: str, labels: Iterable[str], placements: Mapping[str, Placement]) -> set[str]:
    """Which seats of ``placements`` a node with id ``node`` and ``labels`` may run at all."""
    carried = tuple(labels)
    return {h for h, placement in placements.items() if placement.allows(node, carried)}


__all__ = [
    "MOVES_PER_SWEEP",
    "REASON_NO_LIVE_NODE",
    "REASON_NO_NODE_WITH_LABELS",
    "REASON_PINNED_NODE_NOT_LIVE",
    "Assignment",
    "Moves",
    "Unplaceable",
    "assign",
    "allowed_on",
    "moves",
]
