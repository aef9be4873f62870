"""What a clustered member knows of its cluster, the ``cluster`` block it is configured with, and how it says the cluster did not form.

Leaf nodes (``stream.leaf``): a member with ``leaf_port`` also listens for
leaf nodes behind the same secret (user :data:`LEAF_USER`)
(:func:`leaf_listen_config`); a leaf's nats-server runs no JetStream and
dials the members' leafnode listeners (:func:`leaf_remote_config`), moving to
another when the one it is attached to dies. Every member serves JetStream in
the domain :data:`JETSTREAM_DOMAIN`, and a leaf maps its clients' ``$JS.API.>``
onto ``$JS.<domain>.API.>``: nats-server 2.15 does not carry a leaf client's
plain ``$JS.API`` requests to a hub of the same (empty) domain, while the
domain's API is imported on every member and reaches them across the leaf
connection. A leaf's engine thus talks to the members' streams through its
own loopback server exactly as a member's engine does.

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
import json
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence
from urllib.parse import quote

from crewlet.queue.natsserver import BrokerStartError, quote_conf

#: The user name every member's route listener expects, with the cluster secret as its password.
ROUTE_USER = "crewlet-route"
#: The user name a member's leafnode listener expects, with the cluster secret as its password.
LEAF_USER = "crewlet-leaf"
#: The JetStream domain every clustered member serves; a leaf's clients reach it as ``$JS.<domain>.API``.
JETSTREAM_DOMAIN = "crewlet"
#: How long one question to the members' JetStream waits for its answer while a leaf attaches.
_ATTACH_ASK_TIMEOUT_S = 1.0
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

    @property
    def leaf_port(self) -> int: ...

    def peer_addresses(self) -> list[tuple[str, int]]: ...


class LeafConfig(Protocol):
    """What a leaf needs to know of the members it dials (``crewlet.company.conf.LeafSettings`` is one)."""

    @property
    def urls(self) -> Sequence[str]: ...

    @property
    def attach_timeout_s(self) -> float: ...

    def member_addresses(self) -> list[tuple[str, int]]: ...


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


def jetstream_config(store: Optional[Path], cluster: Optional[ClusterConfig], leaf: Optional[LeafConfig]) -> list[str]:
    """The ``jetstream`` block (a clustered member's in :data:`JETSTREAM_DOMAIN`), or for a leaf, the mapping of its clients' API onto the members'."""
    if leaf is not None:
        return ["mappings {", f"  {quote_conf('$JS.API.>')}: {quote_conf(f'$JS.{JETSTREAM_DOMAIN}.API.>')}", "}"]
    if store is None:
        raise BrokerStartError("a broker that is no leaf keeps its streams in a store directory, and none was given")
    domain = [f"  domain: {quote_conf(JETSTREAM_DOMAIN)}"] if cluster is not None else []
    return ["jetstream {", f"  store_dir: {quote_conf(store)}", *domain, "}"]


def leaf_listen_config(cluster: Optional[ClusterConfig], secret: str) -> list[str]:
    """A member's ``leafnodes`` listener on ``cluster.host:cluster.leaf_port`` behind the secret (nothing when off)."""
    if cluster is None or not cluster.leaf_port:
        return []
    return [
        "leafnodes {",
        f"  listen: {quote_conf(f'{cluster.host}:{cluster.leaf_port}')}",
        "  authorization {",
        f"    user: {quote_conf(LEAF_USER)}",
        f"    password: {quote_conf(secret)}",
        "  }",
        # A leaf dials the URLs it was given: no other member's leafnode address is gossiped to it.
        "  no_advertise: true",
        "}",
    ]


def leaf_remote_config(leaf: Optional[LeafConfig], secret: str) -> list[str]:
    """A leaf's ``leafnodes`` block: one remote over every member's URL, the secret riding in each; redialled a second apart."""
    if leaf is None:
        return []
    password = quote(secret, safe="")
    urls = []
    for url in leaf.urls:
        scheme, rest = url.split("://", 1)
        urls.append(quote_conf(f"{scheme}://{LEAF_USER}:{password}@{rest}"))
    return ["leafnodes {", f"  remotes [ {{ urls: [{', '.join(urls)}] }} ]", '  reconnect: "1s"', "}"]


async def wait_attached(url: str, leaf: LeafConfig, exited: Callable[[], Optional[int]], log_tail: Callable[[int], str]) -> float:
    """Wait until the members' JetStream answers through the leaf's server at ``url``; the seconds it took.

    Until the leaf connection is up (and the members have a meta leader),
    ``$JS.API.INFO`` has no responder or an error; it is asked again a second
    apart until ``leaf.attach_timeout_s``, which fails naming the members whose
    leafnode port did not accept a connection.
    """
    import nats
    import nats.errors

    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + float(leaf.attach_timeout_s)
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=1, error_cb=_quiet)
    try:
        while True:
            asked = loop.time()
            try:
                msg = await nc.request("$JS.API.INFO", b"", timeout=_ATTACH_ASK_TIMEOUT_S)
                if not json.loads(msg.data).get("error"):
                    return asked - started
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError, ValueError):
                pass
            rc = exited()
            if rc is not None:
                raise BrokerStartError(f"nats-server exited with status {rc} while attaching as a leaf:\n{log_tail(40)}")
            if loop.time() >= deadline:
                unreached = await unreachable_peers(leaf.member_addresses())
                why = f"could not reach {', '.join(unreached)}" if unreached else "every member's leafnode port accepts connections: check CREWLET_CLUSTER_SECRET"
                raise ClusterFormTimeout(
                    f"the members' JetStream did not answer through stream.leaf.urls within {leaf.attach_timeout_s:g} s "
                    f"(stream.leaf.attach_timeout_s): {why}.\n{log_tail(10)}",
                    unreached,
                )
            await asyncio.sleep(max(0.0, _ATTACH_ASK_TIMEOUT_S - (loop.time() - asked)))
    finally:
        await nc.close()


async def _quiet(e: Exception) -> None:
    return None


__all__ = [
    "JETSTREAM_DOMAIN",
    "LEAF_USER",
    "LeafConfig",
    "jetstream_config",
    "leaf_listen_config",
    "leaf_remote_config",
    "wait_attached",
    "ROUTE_USER",
    "ClusterConfig",
    "ClusterFormTimeout",
    "route_config",
    "unreachable_peers",
]
