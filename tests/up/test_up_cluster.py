"""``manage.py up`` with ``stream.cluster``: three processes whose embedded brokers form one JetStream cluster.

Three ``up`` processes on loopback, each with its own data directory and
broker store, started together (each waits for the others' brokers); one
fleet serves the module. Each node has its own SQLite store here: what is
under test is the brokers' cluster, not the coordination store.
"""
from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.browser_support import slack_message
from tests.cluster_support import free_ports, node_name, start_together, stop_together, up_node_env
from tests.up_support import UpProcess, http_call, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = secrets.token_hex(16)


def node_env(base: Path, i: int, route_ports: list[int], **extra: str) -> dict[str, str]:
    return up_node_env(base, i, route_ports, SECRET, **extra)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[UpProcess]]:
    base = tmp_path_factory.mktemp("fleet")
    ports = free_ports(3)
    # n3 names no store_dir: up gives its member the data dir's, as it does a lone broker.
    envs = [node_env(base, 0, ports), node_env(base, 1, ports), up_node_env(base, 2, ports, SECRET, settings={"stream": {"store_dir": ""}})]
    nodes = [UpProcess(base / node_name(i), node=node_name(i), env=envs[i]) for i in range(3)]
    try:
        start_together(nodes)
        yield nodes
    finally:
        stop_together(nodes)


def post_slack(node: UpProcess, text: str) -> int:
    body = json.dumps(slack_message(f"Ev{uuid.uuid4().hex[:10]}", text)).encode()
    status, _, _ = http_call("POST", node.url + "/webhooks/slack", body, {"Content-Type": "application/json"})
    return status


def test_three_up_processes_form_one_cluster_each_serving_and_none_logs_the_secret(fleet: list[UpProcess]) -> None:
    for node in fleet:
        assert "event=embedded_broker_cluster_formed" in node.output_so_far()
        status, health = http_json("GET", node.url + "/healthz")
        assert (status, health["broker"], health["node"]) == (200, "connected", node.node)
        assert post_slack(node, f"hello {node.node}") == 202
        assert SECRET not in node.output_so_far()


def test_with_one_up_killed_the_other_two_keep_accepting_and_it_rejoins_when_started_again_on_its_data(fleet: list[UpProcess]) -> None:
    killed = fleet[2]
    killed.kill()
    for node in fleet[:2]:
        # A stream whose leader was on the dead node elects another within seconds; until then a publish is a 503.
        wait_until(lambda: post_slack(node, "still here") == 202, 30, f"{node.node} accepting a webhook")
        status, health = http_json("GET", node.url + "/healthz")
        assert (status, health["broker"]) == (200, "connected")
    killed.start()  # the same data dir and broker store
    assert (killed.tmp / "data" / "jetstream" / "jetstream").is_dir()  # n3's store: the one up gave it
    assert "event=embedded_broker_cluster_formed" in killed.output_so_far()
    status, health = http_json("GET", killed.url + "/healthz")
    assert (status, health["broker"], health["node"]) == (200, "connected", "n3")
    # Its broker is connected, but its member may still be catching up on a stream: a publish is a 503 until then,
    # which the sender retries.
    wait_until(lambda: post_slack(killed, "back") == 202, 30, "n3 accepting a webhook once it rejoined")


def refused(tmp_path: Path, env: dict[str, str]) -> str:
    """``up`` started with ``env``: it must exit non-zero by itself; what it printed."""
    up = UpProcess(tmp_path, node="n1", env=env)
    with pytest.raises(AssertionError):
        up.start()  # never ready: the process ends first
    assert up.proc is not None
    assert up.proc.wait(timeout=120) != 0
    output = up.output()
    assert SECRET not in output
    return output


def test_up_refuses_more_replicas_than_its_lone_broker_naming_the_setting_and_what_is_allowed(tmp_path: Path) -> None:
    output = refused(tmp_path, up_env(CREWLET_STREAM_REPLICAS="3", CREWLET_VAR_DIR=str(tmp_path / "data")))
    assert "stream.replicas=3: a lone embedded broker keeps one copy; allowed: 1" in output
    assert "(from CREWLET_STREAM_REPLICAS)" in output


def test_up_refuses_peers_without_the_cluster_secret(tmp_path: Path) -> None:
    env = node_env(tmp_path, 0, free_ports(3))
    del env["CREWLET_CLUSTER_SECRET"]
    assert "CREWLET_CLUSTER_SECRET='(unset)': required when stream.cluster.peers is set" in refused(tmp_path, env)


def test_up_whose_peers_never_come_fails_after_the_form_timeout_naming_them(tmp_path: Path) -> None:
    ports = free_ports(3)
    output = refused(tmp_path, node_env(tmp_path, 0, ports, CREWLET_STREAM_CLUSTER_FORM_TIMEOUT_S="5"))
    assert "event=embedded_broker_cluster_waiting" in output  # the progress line, every 3 s
    # The last line says it, whatever the log above it holds.
    assert output.rstrip().splitlines()[-1] == (
        "CommandError: the engine could not start: cluster 'crewlet-test' did not elect a JetStream meta leader "
        f"within 5 s (stream.cluster.form_timeout_s): could not reach peers 127.0.0.1:{ports[1]}, 127.0.0.1:{ports[2]}."
    )
