"""Clustered embedded brokers: a real 3-member JetStream cluster on loopback (tests/cluster_support.py).

One cluster serves the whole module (forming one costs seconds); each test
leaves every member running as it found it.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import nats
import pytest
import pytest_asyncio

from crewlet.company.conf import ClusterSettings
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.cluster import ClusterFormTimeout
from crewlet.queue.connect import connect_queue
from crewlet.queue.errors import ReplicasUnplaceable
from crewlet.queue.jetstream import JetStreamTransport
from tests.cluster_support import LoopbackCluster, drain, free_ports, node_name, publish_eventually
from waiting_support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

AGENT_STREAM = "CREWLET_AGENT"
CONFIG_STREAM = "CREWLET_CONFIG"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LoopbackCluster]:
    async with LoopbackCluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@asynccontextmanager
async def transport(cluster: LoopbackCluster, *, replicas: int, url: Optional[str] = None) -> AsyncIterator[JetStreamTransport]:
    # A short API deadline: a publish during a leader election is retried after 1 s rather than 5.
    t = await JetStreamTransport.connect(url or cluster.urls(), node="tester", replicas=replicas, reconnect_wait_s=0.05, api_timeout_s=1.0)
    try:
        yield t
    finally:
        await t.close()


@asynccontextmanager
async def raw(url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=2)
    try:
        yield nc
    finally:
        await nc.close()


async def api(url: str, suffix: str, body: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    async with raw(url) as nc:
        msg = await nc.request(f"$JS.API.{suffix}", json.dumps(body).encode() if body is not None else b"", timeout=10)
        answer: dict[str, Any] = json.loads(msg.data)
        return answer


async def stream_info(cluster: LoopbackCluster, name: str) -> dict[str, Any]:
    info = await api(cluster.url(cluster.running()[0]), f"STREAM.INFO.{name}")
    assert "error" not in info, info
    return info


def replica_count(info: dict[str, Any]) -> int:
    """How many servers hold the stream or consumer: its leader and the replicas beside it."""
    cluster = info.get("cluster") or {}
    return (1 if cluster.get("leader") else 0) + len(cluster.get("replicas") or [])


async def remake(cluster: LoopbackCluster, name: str, replicas: int) -> None:
    """Delete the engine stream ``name`` and create it again at ``replicas`` copies, as an operator would."""
    spec = next(s for s in topics.ENGINE_STREAMS if s.name == name)
    url = cluster.url(cluster.running()[0])
    await api(url, f"STREAM.DELETE.{name}")
    made = await api(url, f"STREAM.CREATE.{name}", {"name": name, "subjects": [spec.subjects], "retention": "limits", "storage": "file", "num_replicas": replicas})
    assert "error" not in made, made


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == event]


async def test_streams_and_durables_are_created_at_the_setting_s_three_replicas_on_three_members(cluster: LoopbackCluster) -> None:
    async with transport(cluster, replicas=3) as t:
        topic, group = topics.agent_inbox("ada"), "agent-ada"
        await t.ensure_consumer(topic, group)
        info = await stream_info(cluster, AGENT_STREAM)
        assert info["config"]["num_replicas"] == 3
        assert replica_count(info) == 3
        assert {info["cluster"]["leader"], *(r["name"] for r in info["cluster"]["replicas"])} == {"n1", "n2", "n3"}
        consumer = await t.consumer_info(topic, group)
        assert consumer is not None and replica_count(consumer) == 3


async def test_an_r3_stream_keeps_accepting_and_delivering_with_one_member_killed(cluster: LoopbackCluster) -> None:
    topic, group = topics.agent_inbox("grace"), "agent-grace"
    async with transport(cluster, replicas=3) as t:
        await t.ensure_consumer(topic, group)
        for i in range(3):
            await t.publish(topic, f"before-{i}".encode())
        leader = (await stream_info(cluster, AGENT_STREAM))["cluster"]["leader"]
        victim = next(i for i in range(3) if node_name(i) == leader)  # the stream's leader: the hardest one to lose
        await cluster.kill(victim)
        killed = time.monotonic()
        try:
            for i in range(3):
                await publish_eventually(t, topic, f"after-{i}".encode())
            print(f"\nR3 stream, its leader killed: publishes taken again {time.monotonic() - killed:.1f}s later (the raft election)")
            got = await drain(t, topic, group, 6)
            assert sorted(got) == sorted([f"before-{i}".encode() for i in range(3)] + [f"after-{i}".encode() for i in range(3)])
        finally:
            await cluster.restart(victim)  # returns once every stream is whole again
        info = await stream_info(cluster, AGENT_STREAM)
        assert replica_count(info) == 3 and node_name(victim) in {info["cluster"]["leader"], *(r["name"] for r in info["cluster"]["replicas"])}


async def test_a_three_replica_stream_is_never_lowered_by_a_node_set_to_one(cluster: LoopbackCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.queue.jetstream.streams")
    await remake(cluster, CONFIG_STREAM, replicas=3)
    async with transport(cluster, replicas=1):
        info = await stream_info(cluster, CONFIG_STREAM)
    assert info["config"]["num_replicas"] == 3 and replica_count(info) == 3
    assert info["config"]["retention"] == "limits" and info["config"]["max_age"] > 0  # the rest of the topology is aligned
    kept = [r for r in logged(caplog, "jetstream_stream_replicas_kept") if r.stream == CONFIG_STREAM]
    assert [(r.replicas, r.setting) for r in kept] == [(3, 1)]
    assert not logged(caplog, "jetstream_stream_replicas_raised")


async def test_a_one_replica_stream_is_raised_to_the_setting_and_the_raise_is_logged(cluster: LoopbackCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.queue.jetstream.streams")
    await remake(cluster, CONFIG_STREAM, replicas=1)
    async with transport(cluster, replicas=3):
        pass

    async def three() -> bool:
        info = await stream_info(cluster, CONFIG_STREAM)
        return info["config"]["num_replicas"] == 3 and replica_count(info) == 3

    await eventually(three, timeout_s=20, what=f"{CONFIG_STREAM} at three copies")
    raised = [r for r in logged(caplog, "jetstream_stream_replicas_raised") if r.stream == CONFIG_STREAM]
    assert [(r.replicas_was, r.replicas) for r in raised] == [(1, 3)]


async def test_a_client_given_every_member_s_url_carries_on_through_another_when_its_member_dies(cluster: LoopbackCluster) -> None:
    topic, group = topics.agent_inbox("linus"), "agent-linus"
    async with transport(cluster, replicas=3) as t:
        await t.ensure_consumer(topic, group)
        connected = t._nc.connected_url
        assert connected is not None
        victim = next(i for i in range(3) if cluster.members[i].port == connected.port)
        await cluster.kill(victim)
        try:
            await publish_eventually(t, topic, b"through-another")
            assert await drain(t, topic, group, 1) == [b"through-another"]
            assert t._nc.connected_url is not None and t._nc.connected_url.port != connected.port
        finally:
            await cluster.restart(victim)


async def test_an_external_cluster_is_dialled_through_every_url_listed_and_provisioned_at_the_setting(cluster: LoopbackCluster) -> None:
    queue, broker = await connect_queue(stream_type="nats", url=cluster.urls(), store_dir=None, node="ext", replicas=3)
    try:
        assert broker is None
        info = await stream_info(cluster, AGENT_STREAM)
        assert info["config"]["num_replicas"] == 3 and replica_count(info) == 3
    finally:
        await queue.close()


async def test_a_lone_server_asked_for_three_replicas_refuses_naming_the_setting(tmp_path: Path) -> None:
    async with EmbeddedBroker(store_dir=tmp_path / "lone") as lone:
        with pytest.raises(ReplicasUnplaceable, match=r"^stream\.replicas=3: the broker cannot place stream CREWLET_\w+ on 3 servers .*allowed: at most the cluster's members that are up$"):
            await JetStreamTransport.connect(lone.url, replicas=3)


async def test_a_member_whose_peers_never_answer_fails_naming_the_peers_it_could_not_reach(tmp_path: Path) -> None:
    route, *dead = free_ports(3)
    settings = ClusterSettings(
        name="alone", host="127.0.0.1", port=route, peers=tuple(f"127.0.0.1:{p}" for p in dead), form_timeout_s=2
    )
    member = EmbeddedBroker(tmp_path / "alone", server_name="n1", cluster=settings, cluster_secret="s3cret-of-the-routes", supervise=False)
    with pytest.raises(ClusterFormTimeout) as failed:
        await member.start()
    assert failed.value.unreached == [f"127.0.0.1:{p}" for p in dead]
    assert f"could not reach peers 127.0.0.1:{dead[0]}, 127.0.0.1:{dead[1]}" in str(failed.value)
    assert "stream.cluster.form_timeout_s" in str(failed.value)
    assert "s3cret-of-the-routes" not in str(failed.value)
    assert not member.running
