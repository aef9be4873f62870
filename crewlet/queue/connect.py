"""Where the engine's queue comes from (ARCHITECTURE: Where the broker runs, ``stream.type``).

``embedded`` (the default) starts an :class:`~crewlet.queue.broker.EmbeddedBroker`
and dials it; ``nats`` is the same client code dialling ``stream.url`` (one
server or a comma-separated list, all handed to nats-py). :func:`connect_queue`
picks one of the two.
"""
from __future__ import annotations

from typing import Optional

from crewlet.queue.broker import DEFAULT_SERVER_NAME, EmbeddedBroker
from crewlet.queue.cluster import ClusterConfig, ClusterFormTimeout, LeafConfig, unreachable_peers
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue, Timings
from crewlet.queue.errors import InvalidArgument, ReplicasUnplaceable
from crewlet.queue.jetstream import JetStreamQueue


async def connect_queue(
    *,
    stream_type: str,
    url: Optional[str],
    store_dir: Optional[str],
    node: str,
    timings: Timings = Timings(),
    event_retention_hours: float = topics.DEFAULT_EVENT_RETENTION_HOURS,
    replicas: int = 1,
    max_consumers: int = topics.DEFAULT_MAX_CONSUMERS,
    cluster: Optional[ClusterConfig] = None,
    cluster_secret: str = "",
    monitor_port: int = 0,
    leaf: Optional[LeafConfig] = None,
) -> tuple[EventQueue, Optional[EmbeddedBroker]]:
    """The engine's queue per ``stream.type``: ``embedded`` starts a broker; ``nats`` dials ``url``.

    ``cluster`` (embedded only) makes the broker one member of that JetStream
    cluster, named ``node``; every stream and durable is kept at ``replicas``
    copies (never fewer than an existing stream already has); ``monitor_port``
    (embedded only, 0 for none) opens its monitoring endpoint on loopback. ``leaf``
    (embedded only, no ``cluster``, no ``store_dir``) makes the broker a leaf node
    of the members it names: the streams it provisions are theirs, provisioned
    idempotently through it (an existing stream is left as it is). Returns the
    queue and the embedded broker (None for ``nats``); the caller closes the
    queue first, then stops the broker.
    """
    kind = (stream_type or "embedded").strip().lower()
    broker: Optional[EmbeddedBroker] = None
    if kind == "embedded":
        broker = EmbeddedBroker(
            store_dir or None,
            server_name=node if cluster is not None or leaf is not None else DEFAULT_SERVER_NAME,
            cluster=cluster,
            cluster_secret=cluster_secret,
            monitor_port=monitor_port,
            leaf=leaf,
        )
        await broker.start()
        url, memory_storage = broker.url, broker.memory_storage
    elif kind == "nats":
        if not url:
            raise InvalidArgument("stream.type 'nats' needs stream.url")
        memory_storage = False
    else:
        raise InvalidArgument(f"stream.type={stream_type!r}: must be 'embedded' or 'nats'")
    try:
        queue = await JetStreamQueue.connect(
            url,
            node=node,
            timings=timings,
            event_retention_hours=event_retention_hours,
            memory_storage=memory_storage,
            replicas=replicas,
            max_consumers=max_consumers,
            # A majority elects the meta leader; copies need their members, the rest may still be starting,
            # and the meta layer answers slowly while every node provisions at once.
            provision_wait_s=_provision_wait_s(broker, cluster, leaf),
        )
    except BaseException as e:
        if broker is not None:  # a broker this call started is not left running
            await broker.stop()
            if cluster is not None and isinstance(e, ReplicasUnplaceable):
                unreached = await unreachable_peers(cluster.peer_addresses())
                raise ClusterFormTimeout(
                    f"{e}; could not reach peer{'s' if len(unreached) != 1 else ''} {', '.join(unreached) or '(none)'}",
                    unreached,
                ) from e
        raise
    return queue, broker


def _provision_wait_s(broker: Optional[EmbeddedBroker], cluster: Optional[ClusterConfig], leaf: Optional[LeafConfig]) -> float:
    """How long provisioning asks again a cluster still starting: a member's form timeout, a leaf's attach timeout."""
    if broker is None:
        return 0.0
    if cluster is not None:
        return float(cluster.form_timeout_s)
    return float(leaf.attach_timeout_s) if leaf is not None else 0.0


__all__ = ["connect_queue"]
