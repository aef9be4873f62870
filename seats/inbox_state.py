"""What an inbox loop keeps beside its handler: the keys it holds a seat's mailbox under, its stats, what it asks of coding runs.

Apart from :mod:`seats.inbox` so the modules that take or read those holds
(the sandbox coordinator, the dashboard's seat state) need not import the loop.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from crewlet.company.org import Seat
from crewlet.queue.contract import Partition

#: Hold keys this module takes on a seat's inbox.
HOLD_PAUSED = "paused"
HOLD_NO_PROVIDER = "no_provider"
#: A spent calendar token budget (:mod:`seats.budget`): lifted by a reset or a raised ceiling.
HOLD_BUDGET = "budget"
#: A coding run holds the seat (:mod:`seats.sandbox.coordinator`): lifted when the last run stops holding it.
HOLD_SANDBOX = "sandbox"
#: How many recent deliveries a loop's stats remember.
STATS_KEEP = 256


class SandboxGate(Protocol):
    """What the inbox asks of the seat's coding runs (:class:`seats.sandbox.coordinator.SandboxCoordinator`)."""

    def holding(self, handle: str) -> bool:
        """A run holds the seat: its deliveries wait on the broker."""

    async def offer(self, seat: Seat, partition: Partition) -> tuple[frozenset[str], str]:
        """Offer the deliveries to the seat's parked runs: the event ids they consumed, and why to hand back ("": don't)."""


@dataclass
class LoopStats:
    """What one loop saw, for health, the dashboard and the tests."""

    #: (event id, deliveries remaining) of the latest deliveries handed to the handler.
    deliveries: deque[tuple[str, int]] = field(default_factory=lambda: deque(maxlen=STATS_KEEP))
    turns: int = 0
    skipped: int = 0
    duplicates: int = 0
    deferred: int = 0
    parked: int = 0
    failed: int = 0


__all__ = ["HOLD_BUDGET", "HOLD_NO_PROVIDER", "HOLD_PAUSED", "HOLD_SANDBOX", "LoopStats", "STATS_KEEP", "SandboxGate"]
