"""A real JetStream cluster on loopback, its members configured exactly as clustered nodes configure theirs.

Each member is an :class:`~crewlet.queue.broker.EmbeddedBroker` built from a
:class:`~crewlet.company.conf.ClusterSettings` — the class and the configuration code
``manage.py up`` uses for ``stream.cluster`` — running the venv's
``nats-server`` with its own store directory, client port and route port on
127.0.0.1. Nobody supervises a member here, so a killed one stays dead until
the test restarts it.

    async with LoopbackCluster(tmp_path) as cluster:   # 3 members, formed
        url = cluster.url(0)                            # one member, with its credential
        urls = cluster.urls()                           # every live member, comma-separated
        await cluster.kill(2)                           # kill -9
        await cluster.restart(2)                        # same ports, same store; back once formed

For ``manage.py up`` processes that form a cluster themselves,
:func:`cluster_settings` is the ``stream`` mapping of node ``i`` of a cluster on
the given route ports (:func:`free_ports` picks them), :func:`up_node_env` the
environment of such a node (its settings file written), and
:func:`start_together` / :func:`stop_together` start and stop the processes at
once (each one's start waits for a majority of the brokers, so one at a time
would never get past the first)::

    ports = free_ports(3)
    nodes = [UpProcess(base / node_name(i), node=node_name(i), env=up_node_env(base, i, ports, secret)) for i in range(3)]
    start_together(nodes)
"""
from __future__ import annotations

import asyncio
import json
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Optional, Sequence

import yaml

from crewlet.company.conf import ClusterSettings
from crewlet.company.loading import CLUSTER_SECRET_ENV
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.errors import Unavailable
from crewlet.queue.jetstream import JetStreamTransport
from crewlet.queue.jetstream.message import JetStreamMessage
from tests.up_support import UpProcess, up_env

#: The cluster's name in every test cluster.
CLUSTER_NAME = "crewlet-test"
#: A formed cluster is seconds away on loopback, but each `up` of a fleet migrates and imports before its
#: broker starts: on a loaded 2-core machine the last one can come a minute after the first. Not a bound any test asserts.
FORM_TIMEOUT_S = 120.0


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (held together while chosen, so distinct)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def node_name(i: int) -> str:
    """The node id (and server name) of member ``i``: n1, n2, ..."""
    return f"n{i + 1}"


def cluster_settings(
    i: int,
    route_ports: Sequence[int],
    *,
    store_dir: Path,
    replicas: int = 3,
    name: str = CLUSTER_NAME,
    form_timeout_s: float = FORM_TIMEOUT_S,
) -> dict[str, Any]:
    """The ``stream`` settings mapping of member ``i`` of the loopback cluster on ``route_ports``."""
    return {
        "store_dir": str(store_dir),
        "replicas": replicas,
        "cluster": {
            "name": name,
            "host": "127.0.0.1",
            "port": route_ports[i],
            "peers": [f"127.0.0.1:{p}" for j, p in enumerate(route_ports) if j != i],
            "form_timeout_s": form_timeout_s,
        },
    }


def up_node_env(
    base: Path, i: int, route_ports: Sequence[int], secret: str, *, settings: Optional[dict[str, Any]] = None, **extra: str
) -> dict[str, str]:
    """The environment of ``manage.py up`` as node ``i`` of the cluster on ``route_ports``, at home in ``base/n<i+1>``.

    Writes its settings file (:func:`cluster_settings`, merged over ``settings``:
    other sections, or stream keys); sets ``CREWLET_CLUSTER_SECRET`` and its own
    ``CREWLET_VAR_DIR``; ``extra`` are further variables (a PostgreSQL store's, say).
    """
    home = base / node_name(i)
    home.mkdir(parents=True, exist_ok=True)
    mapping = dict(settings or {})
    mapping["stream"] = {**cluster_settings(i, route_ports, store_dir=home / "stream"), **mapping.get("stream", {})}
    path = home / "settings.yaml"
    path.write_text(yaml.safe_dump(mapping))
    env = {"CREWLET_SETTINGS_FILE": str(path), CLUSTER_SECRET_ENV: secret, "CREWLET_VAR_DIR": str(home / "data"), **extra}
    return up_env(**env)


def start_together(nodes: Sequence[UpProcess]) -> None:
    """Start every ``up`` at once and wait for each one's ready line (the first failure raises)."""
    with ThreadPoolExecutor(len(nodes)) as pool:
        for started in [pool.submit(n.start) for n in nodes]:
            started.result()


def stop_together(nodes: Sequence[UpProcess]) -> list[str]:
    """Stop every ``up`` at once (SIGTERM, then what is left killed); their outputs."""
    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(UpProcess.stop, nodes))


class LoopbackCluster:
    """``size`` clustered members on 127.0.0.1 under ``base_dir`` (``<base_dir>/n1``, ...)."""

    def __init__(
        self,
        base_dir: Path,
        *,
        size: int = 3,
        route_ports: Optional[Sequence[int]] = None,
        name: str = CLUSTER_NAME,
        secret: Optional[str] = None,
        form_timeout_s: float = FORM_TIMEOUT_S,
    ) -> None:
        self.base_dir = base_dir
        self.route_ports = list(route_ports) if route_ports is not None else free_ports(size)
        if len(self.route_ports) != size:
            raise ValueError(f"route_ports={self.route_ports!r}: needs {size} ports")
        #: The routes' shared secret (CREWLET_CLUSTER_SECRET of a node).
        self.secret = secret or secrets.token_hex(16)
        self.name = name
        self.members: list[EmbeddedBroker] = []
        for i in range(size):
            stream = cluster_settings(i, self.route_ports, store_dir=self.store_dir(i), name=name, form_timeout_s=form_timeout_s)
            self.members.append(
                EmbeddedBroker(
                    stream["store_dir"],
                    server_name=node_name(i),
                    cluster=ClusterSettings(**stream["cluster"]),
                    cluster_secret=self.secret,
                    supervise=False,
                )
            )

    def store_dir(self, i: int) -> Path:
        return self.base_dir / node_name(i)

    def url(self, i: int) -> str:
        """Member ``i``'s client URL with its own per-boot credential."""
        return self.members[i].url

    def urls(self) -> str:
        """Every running member's client URL, comma-separated (what ``stream.url`` may hold)."""
        return ",".join(m.url for m in self.members if m.running)

    def running(self) -> list[int]:
        return [i for i, m in enumerate(self.members) if m.running]

    async def start(self) -> "LoopbackCluster":
        """Start every member at once; returns when each has seen the cluster elect its meta leader."""
        await asyncio.gather(*(m.start() for m in self.members))
        return self

    async def kill(self, i: int) -> None:
        """``kill -9`` member ``i`` and wait until it is gone."""
        await self.members[i].kill()

    async def restart(self, i: int) -> None:
        """Start member ``i`` again on its ports and store; returns once every stream is whole again (:meth:`settled`)."""
        await self.members[i].start()
        await self.settled()

    async def settled(self, timeout_s: float = FORM_TIMEOUT_S) -> None:
        """Wait until every stream has a leader and each of its replicas is current and online.

        What a test needs after a member came back: a stream still catching
        up (or electing a leader) answers its API calls late or not at all.
        """
        import nats

        from waiting_support import eventually

        url = self.url(self.running()[0])

        async def whole() -> bool:
            nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=2)
            try:
                names = json.loads((await nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=2)).data).get("streams") or []
                for name in names:
                    info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=2)).data)
                    cluster = info.get("cluster") or {}
                    replicas = cluster.get("replicas") or []
                    if not cluster.get("leader") or not all(r.get("current") and not r.get("offline") for r in replicas):
                        return False
                return True
            except (nats.errors.Error, asyncio.TimeoutError, ValueError):
                return False
            finally:
                await nc.close()

        await eventually(whole, timeout_s=timeout_s, what="every stream led, each replica current", interval_s=0.2)

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.members), return_exceptions=True)

    async def __aenter__(self) -> "LoopbackCluster":
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.stop()


async def drain(transport: JetStreamTransport, topic: str, group: str, want: int, *, then_look: bool = False) -> list[bytes]:
    """Fetch and ack from the pair's durable until ``want`` messages came; their bodies in order.

    ``then_look``: ask one message more in each fetch and fetch once more at the end, so a duplicate the
    broker would deliver after the ``want`` originals is in the answer too.
    """
    from waiting_support import eventually

    extra = 1 if then_look else 0
    got: list[bytes] = []
    puller = await transport.open_puller(topic, group)
    try:

        async def more() -> bool:
            try:
                batch: list[JetStreamMessage] = await puller.fetch(want - len(got) + extra, 0.5, lambda: True)
            except Unavailable:
                return False  # reconnecting to a member still up
            for m in batch:
                got.append(m.data)
                await m.ack()
            return len(got) >= want

        await eventually(more, timeout_s=30, what=f"{want} messages from {topic}")
        if then_look:
            got.extend(m.data for m in await puller.fetch(10, 1.0, lambda: True))
    finally:
        await puller.close()
    return got


async def publish_eventually(transport: JetStreamTransport, topic: str, data: bytes) -> None:
    """Publish once the cluster takes it: a publish during the seconds of a leader election is Unavailable."""
    from waiting_support import eventually

    async def taken() -> bool:
        try:
            await transport.publish(topic, data)
        except Unavailable:
            return False
        return True

    await eventually(taken, timeout_s=30, what=f"the cluster to take a publish to {topic}")


__all__ = [
    "CLUSTER_NAME",
    "LoopbackCluster",
    "cluster_settings",
    "drain",
    "free_ports",
    "node_name",
    "publish_eventually",
    "start_together",
    "stop_together",
    "up_node_env",
]
