"""A leaf node (``stream.leaf``): an embedded nats-server without JetStream dialling a real 3-member cluster.

The members are :class:`~crewlet.queue.broker.EmbeddedBroker` s configured from
``ClusterSettings`` with a leafnode port, exactly as ``manage.py up`` configures
them; the leaf is built by :func:`~crewlet.queue.connect.connect_queue` from
``LeafSettings``, as a leaf node's ``up`` builds it. Nobody supervises a
member, so a killed one stays dead until the test restarts it.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import pytest_asyncio

from crewlet.company.conf import ClusterSettings, LeafSettings
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.cluster import ClusterFormTimeout
from crewlet.queue.connect import connect_queue
from crewlet.queue.jetstream import JetStreamTransport
from tests.cluster_support import LoopbackCluster, cluster_settings, drain, free_ports, node_name, publish_eventually
from waiting_support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


class LeafedCluster(LoopbackCluster):
    """The loopback cluster, each member also listening for leaf nodes on a port of its own."""

    def __init__(self, base_dir: Path) -> None:
        super().__init__(base_dir)
        self.leaf_ports = free_ports(3)
        self.members = [
            EmbeddedBroker(
                self.store_dir(i),
                server_name=node_name(i),
                cluster=ClusterSettings(
                    **cluster_settings(i, self.route_ports, store_dir=self.store_dir(i))["cluster"], leaf_port=self.leaf_ports[i]
                ),
                cluster_secret=self.secret,
                supervise=False,
            )
            for i in range(3)
        ]

    def leaf_settings(self, **extra: Any) -> LeafSettings:
        return LeafSettings(urls=tuple(f"nats-leaf://127.0.0.1:{p}" for p in self.leaf_ports), **extra)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LeafedCluster]:
    async with LeafedCluster(tmp_path_factory.mktemp("leafed")) as c:
        yield c


def monitor(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=5) as answer:
        found: dict[str, Any] = json.loads(answer.read())
        return found


async def attached_to(cluster: LeafedCluster, monitor_port: int) -> int:
    """The member the leaf is attached to now (its leafnode port, as the leaf's /leafz shows it)."""
    leafs = (await asyncio.to_thread(monitor, monitor_port, "leafz")).get("leafs") or []
    assert len(leafs) == 1, leafs
    return cluster.leaf_ports.index(leafs[0]["port"])


async def test_a_leaf_keeps_no_streams_and_carries_on_through_another_member_when_its_member_is_killed(
    cluster: LeafedCluster, tmp_path: Path
) -> None:
    monitor_port = free_ports(1)[0]
    queue, broker = await connect_queue(
        stream_type="embedded", url=None, store_dir=None, node="leaf1", replicas=3,
        cluster_secret=cluster.secret, monitor_port=monitor_port, leaf=cluster.leaf_settings(),
    )
    assert broker is not None
    try:
        varz = await asyncio.to_thread(monitor, monitor_port, "varz")
        assert not (varz.get("jetstream") or {}).get("config"), varz.get("jetstream")  # the leaf runs no JetStream
        assert broker.store_dir is None and not broker.memory_storage
        await _request_crosses(broker.url, cluster.url(0))  # what fleet reads ride: plain request and reply
        t = await JetStreamTransport.connect(broker.url, node="leaf1", replicas=3, reconnect_wait_s=0.05, api_timeout_s=1.0)
        try:
            topic, group = topics.agent_inbox("leafy"), "agent-leafy"
            await t.ensure_consumer(topic, group)
            for i in range(3):
                await t.publish(topic, f"before-{i}".encode())
            victim = await attached_to(cluster, monitor_port)
            await cluster.kill(victim)
            try:
                await eventually(
                    lambda: _moved(cluster, monitor_port, victim), timeout_s=30, what="the leaf attached to another member"
                )
                for i in range(3):
                    await publish_eventually(t, topic, f"after-{i}".encode())
                got = await drain(t, topic, group, 6, then_look=True)
                assert sorted(got) == sorted([f"before-{i}".encode() for i in range(3)] + [f"after-{i}".encode() for i in range(3)])
            finally:
                await t.close()
                await cluster.restart(victim)
        finally:
            await queue.close()
    finally:
        await broker.stop()
    for member in cluster.members:  # the engine's streams are the members' three-copy file streams, made through the leaf
        info = json.loads((await _api(member.url, "STREAM.INFO.CREWLET_AGENT")))
        assert info["config"]["num_replicas"] == 3 and info["config"]["storage"] == "file"
    # A second leaf set to one copy finds the members' streams and leaves them as they are.
    queue, broker = await connect_queue(
        stream_type="embedded", url=None, store_dir=None, node="leaf2", replicas=1, cluster_secret=cluster.secret, leaf=cluster.leaf_settings()
    )
    await queue.close()
    assert broker is not None
    await broker.stop()
    info = json.loads(await _api(cluster.url(0), "STREAM.INFO.CREWLET_AGENT"))
    assert info["config"]["num_replicas"] == 3 and info["state"]["last_seq"] >= 6  # the same stream, not made again


async def _moved(cluster: LeafedCluster, monitor_port: int, victim: int) -> bool:
    try:
        return await attached_to(cluster, monitor_port) != victim
    except (AssertionError, OSError):
        return False


async def _request_crosses(leaf_url: str, member_url: str) -> None:
    """A request from a client of the leaf is answered by a client of a member, and the other way round."""
    import nats

    here = await nats.connect(leaf_url, allow_reconnect=False, max_reconnect_attempts=1)
    there = await nats.connect(member_url, allow_reconnect=False, max_reconnect_attempts=1)
    try:
        for asker, answerer, name in ((here, there, "member"), (there, here, "leaf")):

            async def answer(msg: Any, name: str = name) -> None:
                await msg.respond(name.encode())

            sub = await answerer.subscribe(f"test.leaf.ask.{name}", cb=answer)
            await answerer.flush()

            async def answered(asker: Any = asker, name: str = name) -> bool:
                try:
                    return bool((await asker.request(f"test.leaf.ask.{name}", b"?", timeout=1)).data == name.encode())
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    return False  # the interest has not crossed the leaf connection yet

            await eventually(answered, timeout_s=10, what=f"a request answered by the {name}'s client")
            await sub.unsubscribe()
    finally:
        await here.close()
        await there.close()


async def _api(url: str, suffix: str) -> bytes:
    import nats

    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=2)
    try:
        data: bytes = (await nc.request(f"$JS.API.{suffix}", b"", timeout=10)).data
        return data
    finally:
        await nc.close()


async def test_a_leaf_whose_members_do_not_answer_fails_naming_them_and_never_the_secret(tmp_path: Path) -> None:
    dead = free_ports(2)
    secret = "s3cret-" + secrets.token_hex(8)
    leaf = LeafSettings(urls=tuple(f"nats-leaf://127.0.0.1:{p}" for p in dead), attach_timeout_s=1)
    broker = EmbeddedBroker(None, server_name="leaf1", leaf=leaf, cluster_secret=secret, supervise=False)
    with pytest.raises(ClusterFormTimeout) as failed:
        await broker.start()
    assert failed.value.unreached == [f"127.0.0.1:{p}" for p in dead]
    assert "stream.leaf.attach_timeout_s" in str(failed.value)
    assert secret not in str(failed.value)
    assert not broker.running
