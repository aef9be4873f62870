"""The event queue: one contract, two certified backends (memory twin, JetStream)."""
from __future__ import annotations

from crewlet.queue import topics
from crewlet.queue.contract import (
    MAX_DELIVERIES,
    MAX_LINGER_SECONDS,
    MAX_PAYLOAD_BYTES,
    BatchOptions,
    Closable,
    DeadLetter,
    Delivery,
    EventQueue,
    Outcome,
    Partition,
    Subscription,
    SubscriptionRef,
    Timings,
)
from crewlet.queue.errors import InvalidArgument, NoAnswer, NotLive, QueueError, TooLarge, Unavailable

__all__ = [
    "MAX_DELIVERIES",
    "MAX_LINGER_SECONDS",
    "MAX_PAYLOAD_BYTES",
    "BatchOptions",
    "Closable",
    "DeadLetter",
    "Delivery",
    "EventQueue",
    "Outcome",
    "Partition",
    "Subscription",
    "SubscriptionRef",
    "Timings",
    "topics",
    "QueueError",
    "TooLarge",
    "NotLive",
    "Unavailable",
    "InvalidArgument",
    "NoAnswer",
]
