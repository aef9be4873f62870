"""Names and configurations (pure; the tests read them too).

What the broker is told: a durable's name, a stream's, a mailbox's and a
live feed's configuration, and the metadata keys that carry the exact
(topic, group) pair a durable serves.
"""
from __future__ import annotations

import re
from typing import Any

from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, MAX_PAYLOAD_BYTES, STREAM_INACTIVE_THRESHOLD_S, Timings
from crewlet.queue.jetstream.wire import _NS
from crewlet.queue.transport import DUPLICATE_WINDOW_S

#: Room on the wire for headers (dead-letter headers, Nats-Msg-Id) beside an 8 MiB event.
WIRE_HEADROOM_BYTES = 64 * 1024
#: The largest message a Crewlet stream accepts: an event at the limit plus its headers.
MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES + WIRE_HEADROOM_BYTES

#: Consumer metadata keys that carry the exact (topic, group) pair.
META_TOPIC = "crewlet_topic"
META_GROUP = "crewlet_group"

#: A broadcast consumer's name starts with this (ephemeral; never listed).
BROADCAST_PREFIX = "crewlet_bcast_"

#: Generous: the client, not the broker, bounds how much it takes in flight.
_MAX_ACK_PENDING = 10_000

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_\-]")
_READABLE_MAX = 64


def durable_name(topic: str, group: str) -> str:
    """The durable consumer of (topic, group): a lossy readable rewrite plus the identity digest.

    ``crewlet.agent.ada.inbox`` / ``agent-ada`` -> ``crewlet_agent_ada_inbox_agent-ada_<16 hex>``.
    Only the digest is identity; the readable head is for operators.
    """
    readable = _UNSAFE_NAME.sub("_", f"{topic}_{group}")[:_READABLE_MAX]
    return f"{readable}_{topics.digest(topic, group)}"


def stream_config(
    spec: topics.StreamSpec,
    *,
    event_retention_hours: float,
    memory_storage: bool,
    replicas: int = 1,
    max_consumers: int = topics.DEFAULT_MAX_CONSUMERS,
) -> dict[str, Any]:
    """The JetStream configuration of one stream of the topology (JSON, durations in ns)."""
    max_age_s = 0.0
    if spec.max_age == "events":
        max_age_s = float(event_retention_hours) * 3600.0
    elif spec.max_age == "config":
        max_age_s = topics.CONFIG_MAX_AGE_S
    cfg: dict[str, Any] = {
        "name": spec.name,
        "subjects": [spec.subjects],
        "retention": "interest" if spec.retention == "interest" else "limits",
        "storage": "memory" if memory_storage else "file",
        # Explicit, never -1: a stream without a limit of its own is held to the broker's
        # jetstream.limits.default_max_consumers (1,000 in nats-server 2.15), which refuses the mailbox of
        # the 500th agent seat; the engine's own bound (stream.max_consumers) is the one in force instead.
        "max_consumers": int(max_consumers),
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": int(max_age_s * _NS),
        "max_msgs_per_subject": 1 if spec.per_subject_last else -1,
        "max_msg_size": MAX_MESSAGE_BYTES,
        "discard": "old",
        "num_replicas": max(int(replicas), 1),
        # Direct gets count a subject's stored messages from a sequence on
        # (``Nats-Num-Pending``): what a backlog read needs to see its own
        # writes before the consumer's running count has caught up with them.
        "allow_direct": True,
    }
    if max_age_s > 0:
        # The broker refuses a duplicate window longer than the age bound.
        cfg["duplicate_window"] = int(min(DUPLICATE_WINDOW_S, max_age_s) * _NS)
    return cfg


def consumer_config(topic: str, group: str, timings: Timings) -> dict[str, Any]:
    """A seat's mailbox: durable, pull, explicit ack, DeliverAll, the pair in its metadata.

    No server backoff: the client computes each Nak's delay (nats-server issue
    4726: a consumer's backoff does not apply to naks). MaxDeliver is the
    backstop of the client's own dead-letter decision.
    """
    name = durable_name(topic, group)
    return {
        "name": name,
        "durable_name": name,
        "filter_subject": topic,
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": int(float(timings.ack_wait_s) * _NS),
        "max_deliver": MAX_DELIVERIES,
        "max_ack_pending": _MAX_ACK_PENDING,
        "replay_policy": "instant",
        "metadata": {META_TOPIC: topic, META_GROUP: group},
    }


def broadcast_config(name: str, filter_subject: str) -> dict[str, Any]:
    """A live feed: ephemeral, from now, acknowledging nothing, reaped a minute after it goes quiet."""
    return {
        "name": name,
        "deliver_policy": "new",
        "ack_policy": "none",
        "inactive_threshold": int(STREAM_INACTIVE_THRESHOLD_S * _NS),
        "filter_subject": filter_subject,
        "replay_policy": "instant",
        "mem_storage": True,
    }


def is_subset(pattern: str, of: str) -> bool:
    """Whether every subject ``pattern`` matches is also matched by ``of`` (NATS wildcards)."""
    p, s = topics.split(pattern), topics.split(of)
    for i, tok in enumerate(s):
        if tok == ">":
            return len(p) > i
        if i >= len(p):
            return False
        if p[i] == ">":
            return False
        if tok == "*":
            continue
        if p[i] == "*" or p[i] != tok:
            return False
    return len(p) == len(s)
