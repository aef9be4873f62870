"""``manage.py events [--follow]`` and ``manage.py dlq list|replay`` against a real ``manage.py up``.

One ``up`` on a broker the test started (so the test can bury a message on
ada's inbox the way production buries one: bytes its consume loop cannot
decode), with an operator token. The commands run as an operator runs them,
as separate processes given ``--url`` and ``--token``.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from crewlet.queue import topics
from eventstore.management.commands.events import FOLLOWING
from tests.process_support import REPO_ROOT, ProcessOutput
from tests.up_support import REQUEST_TIMEOUT_S, UpProcess, http_call, http_json, serve, up_env
from waiting_support import wait_until

pytestmark = pytest.mark.integration  # every test here runs manage.py as a child (and most a nats-server)

TOKEN = "ops-cli-test-operator-token-0123456789abcdef"
WRONG_TOKEN = "ops-cli-wrong-token-zyxwvutsrqponmlkjihgf"
SEAT = "ada"
INBOX = topics.agent_inbox(SEAT)
#: How long one command may take to start and answer on a loaded machine (not a bound any test asserts).
COMMAND_S = 120.0


@dataclass
class Broker:
    """The test's broker, and the loop its clients run on."""

    url: str
    loop: Any


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    from crewlet.queue.broker import EmbeddedBroker
    from tests.browser_support import LoopThread

    loop = LoopThread()
    embedded = EmbeddedBroker(store_dir=tmp_path_factory.mktemp("ops-cli-broker"))
    loop.run(embedded.start())
    try:
        yield Broker(embedded.url, loop)
    finally:
        loop.run(embedded.stop())
        loop.close()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, broker: Broker) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("ops-cli")
    env = up_env(
        CREWLET_STREAM_TYPE="nats", CREWLET_STREAM_URL=broker.url, CREWLET_VAR_DIR=str(tmp / "data"),
        CREWLET_OPERATOR_TOKEN=TOKEN,
    )
    yield from serve(UpProcess(tmp, node="cli1", env=env))


def manage(up: UpProcess, *argv: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    """One command against ``up``, as an operator types it (no CREWLET_ setting of its own)."""
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *argv, "--url", up.url, "--token", token],
        cwd=up.tmp, env=up_env(), capture_output=True, text=True, timeout=COMMAND_S,
    )


def page(up: UpProcess, limit: int) -> list[dict[str, Any]]:
    status, body = http_json("GET", f"{up.url}/api/events?limit={limit}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body
    rows: list[dict[str, Any]] = body["events"]
    return rows


def post_slack_message(up: UpProcess, text: str) -> str:
    """A direct message to ada from grace; the trace id the webhook answered."""
    body = {
        "type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex[:12]}",
        "event": {
            "type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE", "text": f"<@U0ADA> {text}",
            "ts": f"1718000000.{uuid.uuid4().int % 10**6:06d}",
        },
        "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
    }
    status, _, answer = http_call("POST", up.url + "/webhooks/slack", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert status == 202, answer
    trace_id: str = json.loads(answer)["trace_id"]
    return trace_id


# -- events ------------------------------------------------------------------------------------------


def test_events_prints_the_latest_page_oldest_first_one_line_per_event_and_exits(up: UpProcess) -> None:
    from eventstore.opsclient import event_line

    wait_until(lambda: len(page(up, 3)) == 3, REQUEST_TIMEOUT_S, "three events in the history")
    done = manage(up, "events", "--limit", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    stamps = [line.split(" ", 1)[0] for line in lines]
    assert stamps == sorted(stamps), "oldest first, as a log reads"
    assert set(lines) <= {event_line(row) for row in page(up, 50)}, "each line is a row the API lists"


def test_events_follow_prints_a_webhooks_event_as_it_arrives(up: UpProcess) -> None:
    argv = [sys.executable, str(REPO_ROOT / "manage.py"), "events", "--follow", "--limit", "1", "--url", up.url, "--token", TOKEN]
    proc = subprocess.Popen(argv, cwd=up.tmp, env=up_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = ProcessOutput(proc)
        out.wait_for(FOLLOWING.format(url=up.url), timeout_s=COMMAND_S)
        trace_id = post_slack_message(up, "tail me")
        line = out.wait_for(f"trace={trace_id}", timeout_s=REQUEST_TIMEOUT_S)
        assert " webhook:message " in line or f" {SEAT} " in line, line
        out.wait_for(f"agent_turn_completed {SEAT} ", timeout_s=REQUEST_TIMEOUT_S)
        assert proc.poll() is None, "--follow keeps following"
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert TOKEN not in out.text()


# -- dlq ------------------------------------------------------------------------------------------------


def _bury_garbage(broker: Broker) -> None:
    """Bytes no event decodes from, on ada's inbox once up reads it: up's consume loop dead-letters them."""
    from seats_support import publish_raw, subscribed_on

    wait_until(lambda: broker.loop.run(subscribed_on(broker.url, INBOX)), REQUEST_TIMEOUT_S, "up's durable subscription on ada's inbox")
    broker.loop.run(publish_raw(broker.url, INBOX, b"\xff no event at all"))


def test_dlq_lists_a_real_dead_letter_and_replays_it_once(up: UpProcess, broker: Broker) -> None:
    _bury_garbage(broker)

    def buried() -> bool:
        status, body = http_json("GET", f"{up.url}/api/dead-letters", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, body
        return any(row["topic"] == INBOX for row in body["dead_letters"])

    wait_until(buried, REQUEST_TIMEOUT_S, "the dead letter on CREWLET_DLQ")
    listed = manage(up, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    (line,) = [line for line in listed.stdout.splitlines() if f" {INBOX} " in line]
    ref = line.split(" ", 1)[0]
    assert ref.isdigit() and "deliveries=1" in line and " unreadable " in line, line

    replayed = manage(up, "dlq", "replay", ref)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.strip().startswith(f"replayed {ref} onto {INBOX} (replayed"), replayed.stdout

    again = manage(up, "dlq", "replay", ref)
    assert again.returncode != 0 and again.stdout == ""
    assert "404 gone (args.ref)" in again.stderr, again.stderr
    not_a_ref = manage(up, "dlq", "replay", "twelve")
    assert not_a_ref.returncode != 0 and "400 bad_args (args.ref)" in not_a_ref.stderr, not_a_ref.stderr


# -- errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, says",
    [
        (("events",), "401 authentication_failed"),
        (("dlq", "replay", "1"), "401 authentication_failed"),
        (("events", "--follow"), "refused the live feed (403)"),
    ],
)
def test_a_wrong_token_exits_non_zero_saying_why_and_never_prints_the_token(up: UpProcess, argv: tuple[str, ...], says: str) -> None:
    done = manage(up, *argv, token=WRONG_TOKEN)
    assert done.returncode != 0 and done.stdout == ""
    assert says in done.stderr, done.stderr
    assert WRONG_TOKEN not in done.stderr + done.stdout


def test_an_unreachable_node_or_no_token_exits_non_zero_saying_why(up: UpProcess) -> None:
    gone = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "dlq", "list", "--url", "http://127.0.0.1:9", "--token", TOKEN],
        cwd=up.tmp, env=up_env(), capture_output=True, text=True, timeout=COMMAND_S,
    )
    assert gone.returncode != 0 and "cannot reach the node at http://127.0.0.1:9" in gone.stderr, gone.stderr
    assert TOKEN not in gone.stderr
    tokenless = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "events", "--url", up.url],
        cwd=up.tmp, env=up_env(), capture_output=True, text=True, timeout=COMMAND_S,
    )
    assert tokenless.returncode != 0 and "no operator token" in tokenless.stderr, tokenless.stderr
