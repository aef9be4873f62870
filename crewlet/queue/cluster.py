"""What a clustered member knows of its cluster, the ``cluster`` block it is configured with, and how it says the cluster did not form.

A member of a JetStream cluster (``stream.cluster``) listens for routes and
dials every peer behind the fleet's shared secret (:func:`route_config`), and
is ready only once the cluster has elected its meta leader. Both the embedded
broker (a member waiting for that leader) and
:func:`crewlet.queue.connect.connect_queue` (a member whose streams cannot be
placed on enough peers) report a cluster that did not form the same way: a
:class:`ClusterFormTimeout` naming the peers whose route port did not answer.
"""
from __future__ import annotations

import asyncio
from typing import Optional, Protocol, Sequence
from urllib.parse import quote

from crewlet.queue.natsserver import BrokerStartError, quote_conf

#: The user name every member's route listener expects, with the cluster secret as its password.
ROUTE_USER = "crewlet-route"
_PEER_DIAL_TIMEOUT_S = 1.0


class ClusterConfig(Protocol):
    """What a clustered member needs to know of its cluster (``crewlet.company.conf.ClusterSettings`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def form_timeout_s(self) -> float: ...

    def peer_addresses(self) -> list[tuple[str, int]]: ...


class ClusterFormTimeout(BrokerStartError):
    """A clustered member saw no JetStream meta leader elected in time; ``unreached`` names the peers it could not dial."""

    def __init__(self, message: str, unreached: Sequence[str]) -> None:
        super().__init__(message)
        self.unreached = list(unreached)


async def unreachable_peers(peers: Sequence[tuple[str, int]], timeout_s: float = _PEER_DIAL_TIMEOUT_S) -> list[str]:
    """``host:port`` of each peer whose route port does not accept a TCP connection within ``timeout_s``."""

    async def dial(host: str, port: int) -> Optional[str]:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=timeout_s)
        except (OSError, asyncio.TimeoutError):
            return f"{host}:{port}"
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        return None

    found = await asyncio.gather(*(dial(h, p) for h, p in peers))
    return [f for f in found if f is not None]


def route_config(cluster: Optional[ClusterConfig], secret: str) -> list[str]:
    """The ``cluster`` block: the route listener and a route to every peer, both behind the secret."""
    if cluster is None:
        return []
    password = quote(secret, safe="")
    routes = [
        quote_conf(f"nats-route://{ROUTE_USER}:{password}@{host}:{port}") for host, port in cluster.peer_addresses()
    ]
    return [
        "cluster {",
        f"  name: {quote_conf(cluster.name)}",
        f"  listen: {quote_conf(f'{cluster.host}:{cluster.port}')}",
        "  authorization {",
        f"    user: {quote_conf(ROUTE_USER)}",
        f"    password: {quote_conf(secret)}",
        "  }",
        f"  routes: [{', '.join(routes)}]",
        # Clients are this member's own engine only: no other member's client port is gossiped to them.
        "  no_advertise: true",
        "}",
    ]


__all__ = [
    "ROUTE_USER",
    "ClusterConfig",
    "ClusterFormTimeout",
    "route_config",
    "unreachable_peers",
]
