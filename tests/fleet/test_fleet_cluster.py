"""A fleet on a clustered broker under load: three `up` nodes whose embedded brokers form one R3 cluster.

One PostgreSQL coordination store, an events database per node, the brokers'
cluster formed by the nodes themselves (``stream.cluster``, ``stream.replicas:
3``). Webhooks keep arriving at n1 while another node is killed outright; what happened
is read afterwards from the three event stores (the dead node's included:
each node wrote its own rows before it died). Before the kill, a seat the doomed
node runs remembers a row (its scripted model calls ``memory_remember``); after it, the
seat's next turn on its new node is given that row, replayed from
CREWLET_MEMORY before the seat's inbox was attached there.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from pathlib import Path
import pytest

from tests.browser_support import slack_message
from tests.cluster_support import free_ports, node_name, start_together, stop_together, up_node_env
from tests.fleet.test_fleet_up import AGENTS, COMPANY, SLACK_ID, Fleet, _pg
from tests.up_support import UpProcess, http_call
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SECRET = secrets.token_hex(16)
#: How long n1 takes webhooks before and after the kill, and how often (each delivery is its own turn:
#: a faster pace only lengthens the wait for every turn to complete on a 2-core machine).
LOAD_BEFORE_S = 3.0
LOAD_AFTER_S = 10.0
POST_EVERY_S = 0.2
SETTLE_S = 180.0
#: The fleet's company with the memory tools granted and a model that remembers when asked to.
REMEMBERING = COMPANY.replace(
    "providers: {llm: [{kind: echo, delay_s: 3}]}",
    "providers: {llm: [{kind: echo, delay_s: 3, match: 'please remember', script: ["
    "{tool: memory_remember, arguments: {key: deploy, value: 'deploys happen on Thursdays'}}, {answer: noted}]}]}",
).replace("kind: agent,", "kind: agent, tools: [memory],")
REMEMBERED = "notes/deploy: deploys happen on Thursdays"


def post(node: UpProcess, seat: str, n: int, text: str = "") -> tuple[str, int]:
    """One DM to ``seat`` in a channel of its own (its own conversation, its own turn): the conversation and the status."""
    body = slack_message(f"Ev{uuid.uuid4().hex[:12]}", text or f"job {n}", to=SLACK_ID[seat])
    body["event"]["channel"] = f"D{n:08d}"
    status, _, _ = http_call("POST", node.url + "/webhooks/slack", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return f"slack:D{n:08d}", status


def turn_rows(fleet: Fleet) -> list[tuple[str, str, str, float, str]]:
    """(type, seat, turn_id, ts, conversation) of every turn start and completion in every node's event store."""
    out = []
    for dbname in fleet.events.values():
        with _pg(dbname) as db:
            rows = db.execute(
                "SELECT type, seat, body, extract(epoch from ts) FROM eventstore_event "
                "WHERE type IN ('agent_turn_started', 'agent_turn_completed')"
            ).fetchall()
        for t, seat, body, ts in rows:
            data = json.loads(body)
            out.append((t, seat, str(data.get("turn_id", "")), float(ts), str(data.get("conversation_key", ""))))
    return out


def memory_rows(fleet: Fleet, node: str, seat: str) -> list[str]:
    """The keys of ``seat``'s memory in ``node``'s own store."""
    with _pg(fleet.events[node]) as db:
        return [r[0] for r in db.execute("SELECT key FROM seats_memory_row WHERE seat = %s AND NOT deleted", (seat,))]


def prompts_of(fleet: Fleet, seat: str) -> list[str]:
    """The user prompt of every phase ``seat`` completed, on every node."""
    out = []
    for dbname in fleet.events.values():
        with _pg(dbname) as db:
            rows = db.execute("SELECT body FROM eventstore_event WHERE type = 'agent_phase_completed' AND seat = %s", (seat,))
            out += [str(json.loads(body).get("user_prompt", "")) for (body,) in rows]
    return out


def test_a_killed_node_under_load_loses_no_accepted_delivery_and_no_seat_ever_runs_two_turns_at_once(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, broker_url="")
    (tmp_path / "company.yaml").write_text(REMEMBERING)
    ports = free_ports(3)
    names = [node_name(i) for i in range(3)]
    nodes = [
        UpProcess(
            tmp_path / name, "--company", str(tmp_path / "company.yaml"), node=name,
            env=up_node_env(
                tmp_path, i, ports, SECRET,
                CREWLET_DATABASE="postgres", CREWLET_PG_DBNAME=fleet.coordination,
                CREWLET_PG_EVENTS_DBNAME=fleet.events[name], CREWLET_FLEET_LEASE_TTL_S="5", CREWLET_STREAM_ACK_WAIT_S="5",
            ),
        )
        for i, name in enumerate(names)
    ]
    try:
        start_together(nodes)
        wait_until(lambda: len(set(fleet.seat_holders().values())) == 3 and len(fleet.seat_holders()) == 5, 120,
                   "the seats spread over the three nodes")
        # The node to kill: one running an unpinned seat besides n1 (which takes the webhooks); that seat remembers.
        victim, doomed = next((s, n) for s, n in sorted(fleet.seat_holders().items()) if n != "n1" and s in AGENTS)
        assert post(nodes[0], victim, 900001, "please remember when we deploy")[1] == 202
        wait_until(lambda: memory_rows(fleet, doomed, victim) == ["deploy"] or None, 60, f"{victim} remembered on {doomed}")
        posted: list[tuple[str, int]] = []
        stop = threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set():
                posted.append(post(nodes[0], AGENTS[n % len(AGENTS)], n))
                n += 1
                time.sleep(POST_EVERY_S)

        loader = threading.Thread(target=load)
        loader.start()
        try:
            wait_until(lambda: len(posted) >= LOAD_BEFORE_S / POST_EVERY_S or None, 60, "load before the kill")
            nodes[names.index(doomed)].kill()
            killed_at = time.time()
            gone = time.monotonic()
            left = 4 if doomed == "n3" else 5  # the seat pinned to n3 runs nowhere else
            wait_until(lambda: doomed not in fleet.seat_holders().values() and len(fleet.seat_holders()) == left, 60,
                       f"{doomed}'s unpinned seats running elsewhere")
            moved_s = time.monotonic() - gone
            wait_until(lambda: time.monotonic() - gone >= LOAD_AFTER_S or None, LOAD_AFTER_S + 5, "load after the kill")
        finally:
            stop.set()
            loader.join()
        accepted = {conversation for conversation, status in posted if status == 202}
        # A publish racing the dead member's stream leaders may be answered 503 (the sender retries it).
        assert {status for _, status in posted} <= {202, 503}, posted

        def completed() -> list[str]:
            return [r[4] for r in turn_rows(fleet) if r[0] == "agent_turn_completed" and r[1] in AGENTS]

        wait_until(lambda: accepted <= set(completed()) or None, SETTLE_S, f"{len(accepted)} completed turns")
        rows = turn_rows(fleet)
        twice = [c for c in set(completed()) if completed().count(c) > 1]
        assert twice == [], f"conversations whose delivery ran two turns: {twice}"  # one completed turn each

        spans: dict[str, list[tuple[float, float]]] = {}
        ends = {tid: ts for t, _, tid, ts, _ in rows if t == "agent_turn_completed"}
        for t, seat, tid, ts, _ in rows:
            if t == "agent_turn_started":
                spans.setdefault(seat, []).append((ts, ends.get(tid, killed_at)))
        for seat, turns in spans.items():
            turns.sort()
            for (_, first_end), (second_start, _) in zip(turns, turns[1:]):
                assert second_start >= first_end, f"{seat} ran two turns at once: {turns}"
        refused = sum(1 for _, status in posted if status == 503)
        assert post(nodes[0], victim, 900002, "when is the deploy?")[1] == 202
        wait_until(lambda: any(REMEMBERED in p for p in prompts_of(fleet, victim)) or None, SETTLE_S,
                   f"{victim}'s next turn on its new node given the row")
        new_home = fleet.seat_holders()[victim]
        replayed = [line for line in nodes[names.index(new_home)].output_so_far().splitlines()
                    if f"event=seat_memory_replayed seat={victim} " in line]
        assert replayed and "rows=1 " in replayed[-1], replayed
        assert memory_rows(fleet, new_home, victim) == ["deploy"]
        print(f"\nclustered fleet: {len(accepted)} accepted ({refused} answered 503 during the re-election), "
              f"{doomed}'s seats moved {moved_s:.2f}s after kill -9, every accepted delivery one completed turn; "
              f"{victim}'s memory replayed on {new_home}: {replayed[-1].split('event=seat_memory_replayed ')[-1]}")
    finally:
        stop_together(nodes)
