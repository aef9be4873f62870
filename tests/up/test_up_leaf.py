"""``manage.py up`` as a leaf node (``stream.leaf.urls``) of a real 3-member JetStream cluster.

The members are three clustered :class:`~crewlet.queue.broker.EmbeddedBroker` s
listening for leaf nodes (``stream.cluster.leaf_port``; ``LeafedCluster``, configured
from ``ClusterSettings`` as a member's ``up`` configures its own), started on the
test's loop thread; the leaf is a real ``up`` (SQLite, its own event store)
whose embedded nats-server runs no JetStream and dials them. Its seat works
through the members' streams, and ``kill -9`` of the member it is attached
to moves it to another with nothing lost.
"""
from __future__ import annotations

import json
import secrets
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.browser_support import LoopThread, slack_message
from tests.cluster_support import free_ports
from tests.queue.test_broker_leaf import LeafedCluster as Members
from tests.up_support import UpProcess, http_call, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "leaf-test-operator-token-0123456789abcdef"
#: One agent seat and the person who writes to it; each turn takes a second, so one is in flight at the kill.
COMPANY = """\
org: acme
providers: {llm: [{kind: echo, delay_s: 1}]}
surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}
seats:
  - {handle: ada, kind: agent, identities: {slack: U0ADA}}
  - {handle: grace, kind: human, identities: {slack: U0GRACE}}
"""


@pytest.fixture
def members(tmp_path: Path) -> Iterator[tuple[LoopThread, Members]]:
    loop = LoopThread()  # the members' parent-death signal follows this thread: it lives as long as they do
    cluster = Members(tmp_path / "members")
    try:
        loop.run(cluster.start(), timeout_s=120)
        yield loop, cluster
    finally:
        loop.run(cluster.stop(), timeout_s=60)
        loop.close()


def delivery(n: int) -> bytes:
    """A DM to ada in a channel of its own (its own conversation, its own turn)."""
    body = slack_message(f"Ev{secrets.token_hex(6)}", f"job {n}")
    body["event"]["channel"] = f"D{n:08d}"
    return json.dumps(body).encode()


def post(up: UpProcess, n: int, body: bytes | None = None) -> int:
    """POST delivery ``n`` (``body`` when it is a retry of one already sent, as Slack resends it); the status."""
    status, _, _ = http_call("POST", up.url + "/webhooks/slack", body or delivery(n), {"Content-Type": "application/json"})
    return status


def turns(up: UpProcess, etype: str, n: int) -> int:
    """How many ``etype`` events conversation ``n`` has in the leaf's own event store."""
    return len(up.api(f"/api/events?type={etype}&conversation_key=slack:D{n:08d}")["events"])


def completed(up: UpProcess, n: int) -> int:
    return turns(up, "agent_turn_completed", n)


def attached_to(leaf_ports: list[int], monitor_port: int) -> int:
    """Which of the members' ``leaf_ports`` the leaf's broker is attached to now (as the leaf's /leafz shows it); -1: none."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/leafz", timeout=5) as answer:
        leafs: list[dict[str, Any]] = json.loads(answer.read()).get("leafs") or []
    return leaf_ports.index(leafs[0]["port"]) if len(leafs) == 1 else -1


def test_a_leaf_up_runs_its_seat_through_the_members_keeps_no_streams_and_survives_its_member_killed(
    members: tuple[LoopThread, Members], tmp_path: Path
) -> None:
    loop, cluster = members
    (tmp_path / "company.yaml").write_text(COMPANY)
    monitor_port = free_ports(1)[0]
    env = up_env(
        CREWLET_VAR_DIR=str(tmp_path / "leaf"),
        CREWLET_STREAM_LEAF_URLS=",".join(f"nats-leaf://127.0.0.1:{p}" for p in cluster.leaf_ports),
        CREWLET_STREAM_REPLICAS="3",
        CREWLET_STREAM_MONITOR_PORT=str(monitor_port),
        CREWLET_STREAM_ACK_WAIT_S="5",
        CREWLET_CLUSTER_SECRET=cluster.secret,
        CREWLET_OPERATOR_TOKEN=TOKEN,
        SLACK_SIGNING_SECRET="unused",
    )
    with UpProcess(tmp_path, "--company", str(tmp_path / "company.yaml"), node="leaf1", env=env) as leaf:
        assert "event=embedded_broker_leaf_attached" in leaf.output_so_far()
        assert post(leaf, 1) == 202
        wait_until(lambda: completed(leaf, 1) == 1, 60, "the leaf's seat completed its first turn")

        # A delivery accepted just before the kill of the leaf's member, and one after: each runs exactly once.
        victim = attached_to(cluster.leaf_ports, monitor_port)
        assert victim >= 0
        assert post(leaf, 2) == 202
        loop.run(cluster.kill(victim))
        wait_until(lambda: attached_to(cluster.leaf_ports, monitor_port) not in (-1, victim) or None, 30, "the leaf attached to another member")
        # A refusal while the leaf moves may come after the broker stored the message: Slack's retry resends the same
        # event, which the broker's duplicate window absorbs, never a new one.
        third, answers = delivery(3), list[int]()

        def accepted() -> bool:
            answers.append(post(leaf, 3, third))
            return answers[-1] == 202

        wait_until(accepted, 30, "the leaf accepting a webhook again")
        wait_until(lambda: completed(leaf, 2) >= 1 and completed(leaf, 3) >= 1, 90, "both turns completed")
        assert [completed(leaf, n) for n in (1, 2, 3)] == [1, 1, 1], f"the third delivery was answered {answers}"
        assert [turns(leaf, "agent_turn_started", n) for n in (1, 2, 3)] == [1, 1, 1]  # none redelivered and run again

        # Nothing of the broker's under the leaf's data directory: no JetStream store, no stream file.
        data = tmp_path / "leaf"
        assert not [p for p in data.rglob("*") if "jetstream" in p.name.lower() or p.suffix in (".blk", ".idx")]
        assert cluster.secret not in leaf.output_so_far()
