"""Parking: a delivery the node cannot work now, kept from being dead-lettered untried.

A delivery handed back because the node or its store is failing — the
coordination store is away, the node is stopping — is deferred: back at the
head of the inbox, at the cost of one of its deliveries (design: Defer). An
outage of a few minutes, or a few outages in a row, would spend the whole
budget of a message no turn ever tried. So a delivery whose partition's
headroom (the smallest ``remaining`` of its messages: one outcome covers them
all) is within :data:`PARK_HEADROOM` deliveries of the dead-letter is not
deferred again but parked: each of its events is republished to the seat's
inbox as a message of its own, with a whole budget, and the delivery is acked.
The copy keeps the event's id, so the completion ledger and the duplicate drop
know it as the same work; it arrives behind the mail waiting now (it gives up
its place, never its life). A park that cannot be published is deferred after
all: the broker's copy is then the only one, and it keeps what budget it has.
"""
from __future__ import annotations

import logging

from crewlet.base.logfmt import short_reason
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue, Partition

log = logging.getLogger("crewlet.seats.inbox")

#: A failing node's hand-back parks a delivery, rather than deferring it, once this few deliveries are left.
PARK_HEADROOM = 5


def parks(partition: Partition) -> bool:
    """Whether handing ``partition`` back once more would bring a message within :data:`PARK_HEADROOM` of the dead-letter."""
    return partition.headroom <= PARK_HEADROOM


async def park(queue: EventQueue, handle: str, partition: Partition, why: str) -> bool:
    """Republish the partition's events to ``handle``'s inbox, each as a fresh message; False if a publish failed."""
    topic = topics.agent_inbox(handle)
    try:
        for ev in partition.events:
            await queue.publish(topic, ev)
    except Exception as exc:
        log.warning("seat_park_failed", extra={"seat": handle, "why": why, "error": short_reason(exc)})
        return False
    log.warning(
        "seat_delivery_parked",
        extra={"seat": handle, "why": why, "events": len(partition.deliveries), "headroom": partition.headroom},
    )
    return True


__all__ = ["PARK_HEADROOM", "park", "parks"]
