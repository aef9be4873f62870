"""The JetStream backend: broker primitives over nats-py (design: Delivery Semantics).

``JetStreamQueue.connect(url, ...)`` returns the shared
:class:`~crewlet.queue.client.QueueClient` over a :class:`JetStreamTransport`;
every semantic the contract promises is decided there. This package only
speaks to the broker: it provisions the stream topology of
``crewlet.queue.topics``, creates and lists durable pull consumers, pulls,
settles, runs broadcast consumers and core-NATS scatter/gather.

``nats`` is imported in this package, ``crewlet.queue.natsclient`` and
``crewlet.queue.broker`` only. Every nats exception is translated at this
boundary (``Unavailable``, ``TooLarge``, ``InvalidArgument``, ``Gone``);
none escapes.

The modules, bottom up:

- ``wire``: the API prefix, error codes, the API call, status and
  reply-subject parsing, the nats-py exceptions translated here.
- ``configs``: durable names and the configurations the broker is told (pure).
- ``message``: one fetched message and its settlement.
- ``pull``: ``JetStreamPuller``, one pull request per fetch.
- ``base``: the state every part of the transport shares, and the API call.
- ``streams``, ``consumers``, ``dead_letters``, ``broadcast``, ``ask_serve``:
  the transport's parts, one concern each.
- ``snapshots``: a stream's snapshot and restore over JetStream's own API
  (``STREAM.SNAPSHOT`` / ``STREAM.RESTORE``), for a node's backup.
- ``transport``: ``JetStreamTransport`` assembled from the parts, its
  connection's life (connect, reconnect, sever, close), and ``JetStreamQueue``.
"""
from __future__ import annotations

from crewlet.queue.jetstream.configs import (
    BROADCAST_PREFIX,
    MAX_MESSAGE_BYTES,
    META_GROUP,
    META_TOPIC,
    WIRE_HEADROOM_BYTES,
    broadcast_config,
    consumer_config,
    durable_name,
    is_subset,
    stream_config,
)
from crewlet.queue.jetstream.message import JetStreamMessage
from crewlet.queue.jetstream.pull import JetStreamPuller
from crewlet.queue.jetstream.transport import JetStreamQueue, JetStreamTransport
from crewlet.queue.jetstream.wire import redact_url

__all__ = [
    "JetStreamQueue",
    "JetStreamTransport",
    "JetStreamPuller",
    "JetStreamMessage",
    "durable_name",
    "stream_config",
    "consumer_config",
    "broadcast_config",
    "is_subset",
    "redact_url",
    "MAX_MESSAGE_BYTES",
    "WIRE_HEADROOM_BYTES",
    "META_TOPIC",
    "META_GROUP",
    "BROADCAST_PREFIX",
]
