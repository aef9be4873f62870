"""The thread-aware ledger is the fleet's: a message answered in its thread on one node is dropped on another.

Three real ``manage.py up`` nodes on one nats-server and one PostgreSQL
coordination store (``tests/fleet/test_fleet_up.py``'s fleet), ada's Slack
tools and thread reads pointed at a local Slack Web API, the model a local
OpenAI-compatible server that fails on message A until it is asked about B.
A's turn fails on the node running ada and is NAK'd; B's turn on that node
is shown A waiting in its thread and answers; that node is then killed, so
A's redelivery reaches whichever node takes ada over, which drops it as
answered in its thread: one reply in all. The thread's next message then
runs on the new node and is given the episode B's turn wrote on the dead one
(the episodes are in the coordination store).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from chat_vendor_support import CallLog, slack_web_api
from crewlet.events.types.phrases import TRIGGER_ANSWERED_IN_THREAD
from seats.episodes import BLOCK_CLOSE, BLOCK_OPEN
from cluster_support import start_together
from seats_support import json_vendor
from tests.fleet.test_fleet_up import TOKEN, Fleet, Node, _pg, fleet  # noqa: F401  (fixtures)
from tests.seats.test_chat_reply_up import COMPANY, Model, grace_said, slack_mention
from tests.up.test_up_inflight import broker, loop  # noqa: F401  (fixtures)
from tests.up_support import http_json
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.timeout(400)]

ADA_SLACK_TOKEN = "xoxb-ada-fleet-thread-token"
#: Generous bounds for a loaded 2-core machine (nothing here asserts a duration).
WAIT_S = 90.0
#: A NAK'd message's first redelivery waits this long: past B's turn and the kill that follows it, with room
#: for a loaded machine (the redelivery reaching the killed node first would fail the node assertion).
BACKOFF_S = 15.0


class Chat:
    def __init__(self, fleet: Fleet, model: Model) -> None:  # noqa: F811
        self.fleet, self.model = fleet, model

    def api(self, node: Node, path: str) -> Any:
        status, answer = http_json("GET", node.url + path, None, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, (path, answer)
        return answer

    def events(self, node: Node, trace_id: str, kind: str) -> list[dict[str, Any]]:
        rows = self.api(node, f"/api/events?trace_id={trace_id}&type={kind}")["events"]
        return [dict(self.api(node, f"/api/events/{row['id']}")["event"]["wire"]) for row in rows]

    def post(self, node: Node, payload: dict[str, Any]) -> str:
        status, answer = http_json(
            "POST", f"{node.url}/webhooks/slack", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        assert status == 202, answer
        return str(answer["trace_id"])


def ledger_turn(fleet: Fleet, identity: str) -> str:  # noqa: F811
    """The turn the coordination store's completion ledger says worked ``identity`` for ada ('' while none)."""
    with _pg(fleet.coordination) as db:
        row = db.execute("SELECT turn_id FROM seats_ledger_entry WHERE seat = 'ada' AND trigger = %s", (identity,)).fetchone()
    return str(row[0]) if row else ""


@pytest.fixture
def chat(fleet: Fleet, tmp_path: Path) -> Iterator[tuple[Chat, Any]]:  # noqa: F811
    log = CallLog()
    model = Model(log)
    with slack_web_api(log, {ADA_SLACK_TOKEN}) as slack, json_vendor(model.answer) as model_url:
        # The chat reply tests' company: ada with her own Slack bot token (its Mattermost half is never called here).
        text = COMPANY
        for name, value in (("MODEL_URL", model_url), ("SLACK_URL", slack.url), ("MATTERMOST_URL", "http://127.0.0.1:9"),
                            ("ADA_MM_ID", "adammid0000000000000000000"), ("GRACE_MM_ID", "gracemmid00000000000000000")):
            text = text.replace(name, value)
        (fleet.tmp / "company.yaml").write_text(text)
        nodes = []
        for name in ("n1", "n2", "n3"):
            node = Node(fleet, name)
            node.env.update(
                CHAT_UP_OPENAI_KEY="sk-fleet-thread", SLACK_SIGNING_SECRET="unused", MATTERMOST_WEBHOOK_TOKEN="unused",
                ADA_SLACK_BOT_TOKEN=ADA_SLACK_TOKEN, CREWLET_DELIVERY_BACKOFF_BASE_S=str(BACKOFF_S),
            )
            fleet.nodes[name] = node
            nodes.append(node)
        start_together(nodes)
        yield Chat(fleet, model), slack


def test_a_message_answered_in_its_thread_on_one_node_is_dropped_when_its_redelivery_reaches_another(
    chat: tuple[Chat, Any]
) -> None:
    talk, slack = chat
    fleet = talk.fleet
    holder = wait_until(lambda: fleet.seat_holders().get("ada"), WAIT_S, "a node running ada")
    running, others = fleet.nodes[holder], [n for name, n in fleet.nodes.items() if name != holder]
    channel, root, a_ts, b_ts = "C0FLT", "1718000030.000100", "1718000030.000200", "1718000030.000300"
    thread = slack.threads[(channel, root)] = [
        {"type": "message", "ts": root, "user": "U0GRACE", "text": "the release is stuck", "thread_ts": root},
        grace_said(a_ts, "message A: what is it waiting on?", root),
    ]
    talk.model.failing.add("message A")
    trace_a = talk.post(others[0], slack_mention(channel, root, a_ts, "message A: what is it waiting on?"))
    failed = wait_until(lambda: talk.events(others[0], trace_a, "agent_turn_completed"), WAIT_S, "A's turn")
    assert failed[0]["failed"] and failed[0]["node"] == holder

    thread.append(grace_said(b_ts, "message B: still stuck?", root))
    reply = {"channel": channel, "thread_ts": root, "text": "It waits on the signing key; renewed."}
    talk.model.script["message B"] = ("slack__reply_in_thread", reply)
    talk.post(others[0], slack_mention(channel, root, b_ts, "message B: still stuck?"))
    answered = wait_until(lambda: ledger_turn(fleet, f"message:slack:{channel}:{a_ts}"), WAIT_S, "A in the ledger via B's turn")
    running.kill()  # before A comes round: its redelivery is the next holder's

    skipped = wait_until(lambda: talk.events(others[0], trace_a, "turn_trigger_skipped"), WAIT_S, "A's redelivery dropped")
    assert skipped[0]["reason"] == TRIGGER_ANSWERED_IN_THREAD and skipped[0]["turn_id"] == answered
    assert skipped[0]["node"] in {n.node for n in others}
    assert ledger_turn(fleet, f"message:slack:{channel}:{b_ts}") == answered  # B's own turn
    assert [c.args for c in talk.model.log.of("slack", "chat.postMessage")] == [reply]

    # The thread's next message runs on ada's new node, and is given the episode B's turn wrote on the dead one.
    c_ts = "1718000030.000400"
    thread.append(grace_said(c_ts, "message C: and now?", root))
    trace_c = talk.post(others[0], slack_mention(channel, root, c_ts, "message C: and now?"))
    done = wait_until(lambda: talk.events(others[0], trace_c, "agent_turn_completed"), WAIT_S, "C's turn")
    assert not done[0]["failed"] and done[0]["node"] in {n.node for n in others}
    header = BLOCK_OPEN.format(conversation=f"slack:{channel}:{root}")
    given = [c.args["said"] for c in talk.model.asked("message C")]
    episodes = [said.split(header, 1)[1].split(BLOCK_CLOSE, 1)[0] for said in given if header in said]
    assert episodes and len(episodes) == len(given) and all("message B: still stuck?" in block for block in episodes)
