"""The fleet read (design: Reading the fleet's history): every history question answered by every live node.

:mod:`.wire` is the request and reply on the broker and the reasons coverage
names; :mod:`.merge` the plans that merge every node's part exactly;
:mod:`.kept` every round of a plan, asked so that a row a custody batch holds
on two stores counts once; :mod:`.service` the engine service that serves
this node's store and asks the others. Callers import from the package.
"""
from __future__ import annotations

from eventstore.fanout.merge import merge_pages, plan_for, seed_plan
from eventstore.fanout.service import (
    NODE_PARTS,
    FleetReads,
    for_engine,
    live_roster,
    node_part,
    reader,
)
from eventstore.fanout.wire import NOT_ASKED, OTHER_VERSION, READ_FAILED, REASONS, TIMED_OUT, UNREADABLE

__all__ = [
    "FleetReads",
    "NODE_PARTS",
    "NOT_ASKED",
    "OTHER_VERSION",
    "READ_FAILED",
    "REASONS",
    "TIMED_OUT",
    "UNREADABLE",
    "for_engine",
    "live_roster",
    "merge_pages",
    "node_part",
    "plan_for",
    "reader",
    "seed_plan",
]
