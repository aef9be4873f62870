"""In-flight mail across a stop of `manage.py up`: a clean stop hands it back at once, a crash costs one ack window.

`up` runs for real (``stream.type: nats``) against a nats-server this test
starts, so the test holds its own JetStream client on the same broker and
attaches to the seats' own durable subscriptions after `up` let go of them:
what it receives, and how soon, is what the next process would get. Turns are
the echo model's, made long with ``delay_s``, so a turn is in flight when the
signal lands.
"""
from __future__ import annotations

import contextlib
import signal
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from crewlet.queue import MAX_DELIVERIES, Timings, topics
from tests.browser_support import LoopThread, slack_message
from tests.up_support import UpProcess, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: A stop's hand-back must arrive well inside this; the ack clock is far longer in the clean-stop case.
PROMPT_S = 10.0

COMPANY = """\
org: acme
providers:
  llm: [{kind: echo, delay_s: 600}]   # a turn outlasts every wait of this test
node: {max_concurrent: 1}
notification_coalesce_window_seconds: %(linger)s
notification_coalesce_max_batch: 20
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}}
  - {handle: linus, kind: agent, role: reviewer, identities: {slack: U0LINUS}}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}
"""


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def broker(loop: LoopThread, tmp_path: Path) -> Iterator[Any]:
    from crewlet.queue.broker import EmbeddedBroker

    server = EmbeddedBroker(store_dir=tmp_path / "jetstream")
    loop.run(server.start())
    yield server
    loop.run(server.stop())


class Up(UpProcess):
    """One `manage.py up` (an :class:`UpProcess`) on the test's broker, with the test's company and ack window."""

    def __init__(self, tmp: Path, broker_url: str, *, ack_wait_s: float, linger_s: int) -> None:
        company = tmp / "company.yaml"
        company.write_text(COMPANY % {"linger": linger_s})
        env = up_env(
            CREWLET_STREAM_TYPE="nats",
            CREWLET_STREAM_URL=broker_url,
            CREWLET_VAR_DIR=str(tmp / "data"),
            CREWLET_STREAM_ACK_WAIT_S=str(ack_wait_s),
        )
        super().__init__(tmp, "--company", str(company), node="u1", env=env)

    def post_slack(self, to: str, channel: str, text: str) -> None:
        import json
        import urllib.request

        body = slack_message(f"Ev{uuid.uuid4().hex[:10]}", text, to=to)
        body["event"]["channel"] = channel
        request = urllib.request.Request(
            self.url + "/webhooks/slack", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 202, response.read()


class Watcher:
    """The test's own node: a broadcast of crewlet.events.> and, later, the seats' durable inboxes."""

    def __init__(self, loop: LoopThread, broker: Any, ack_wait_s: float) -> None:
        from crewlet.queue.jetstream import JetStreamQueue

        self.loop = loop
        self.queue = loop.run(
            JetStreamQueue.connect(broker.url, node="tester", timings=Timings(ack_wait_s=ack_wait_s),
                                   memory_storage=broker.memory_storage)
        )
        self.events: list[Any] = []
        self.got: dict[str, list[tuple[str, int, float]]] = {}

        async def seen(_subject: str, event: Any) -> None:
            self.events.append(event)

        loop.run(self.queue.subscribe_stream("crewlet.events.>", seen))

    def turns_started(self, seat: str) -> int:
        return sum(1 for e in self.loop.call(lambda: list(self.events))
                   if e.type == "agent_turn_started" and getattr(e.data, "seat", "") == seat)

    def fetched(self, handle: str) -> int:
        """Messages of the seat's inbox fetched and not settled (the broker's own count)."""
        info = self.loop.run(self.queue.transport.consumer_info(topics.agent_inbox(handle), topics.agent_inbox_group(handle)))
        return int((info or {}).get("num_ack_pending", 0))

    def take_inbox(self, handle: str) -> None:
        """Attach to the seat's own durable inbox (as the next node would) and record what arrives."""
        got = self.got.setdefault(handle, [])

        async def handler(delivery: Any) -> None:
            got.append((delivery.event.id, delivery.remaining, time.monotonic()))

        self.loop.run(self.queue.subscribe(topics.agent_inbox(handle), topics.agent_inbox_group(handle), handler))

    def received(self, handle: str) -> list[tuple[str, int, float]]:
        return self.loop.call(lambda: list(self.got.get(handle, [])))

    def close(self) -> None:
        self.loop.run(self.queue.close())


@contextlib.contextmanager
def running(loop: LoopThread, broker: Any, tmp: Path, *, ack_wait_s: float, linger_s: int) -> Iterator[tuple[Up, Watcher]]:
    """`up` started on the test's broker and the test's own node watching it; both gone when the block ends."""
    with Up(tmp, broker.url, ack_wait_s=ack_wait_s, linger_s=linger_s) as up:
        watcher = Watcher(loop, broker, ack_wait_s)
        try:
            yield up, watcher
        finally:
            watcher.close()


def test_sigterm_hands_back_held_and_gated_mail_at_once_and_a_second_sigterm_the_running_turns(
    loop: LoopThread, broker: Any, tmp_path: Path
) -> None:
    ack_wait_s = 600.0  # so nothing below can be the ack clock's doing
    with running(loop, broker, tmp_path, ack_wait_s=ack_wait_s, linger_s=2) as (up, watcher):
        # Three conversations with ada inside one linger: one drain, three partitions.
        for n in (1, 2, 3):
            up.post_slack("U0ADA", f"D0ADA{n}", f"conversation {n}")
        wait_until(lambda: watcher.turns_started("ada") == 1, 60, "ada's first turn")
        wait_until(lambda: watcher.fetched("ada") == 3, 30, "ada's drain holding all three")
        # linus's wake reaches the node's one turn slot, which ada's turn holds, and waits there.
        up.post_slack("U0LINUS", "D0LINUS", "for linus")
        wait_until(lambda: watcher.fetched("linus") == 1, 30, "linus's wake fetched and waiting at the gate")
        assert watcher.turns_started("linus") == 0

        up.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        watcher.take_inbox("ada")
        watcher.take_inbox("linus")
        # While the drain still waits for ada's running turn, the rest is already back on the broker.
        wait_until(lambda: len(watcher.received("ada")) == 2 and len(watcher.received("linus")) == 1, PROMPT_S,
                   "the undispatched partitions and the gated wake at the next consumer")
        assert up.proc.poll() is None, "up is still draining ada's turn"
        held_back_s = max(t for _, _, t in watcher.received("ada") + watcher.received("linus")) - signalled

        up.proc.send_signal(signal.SIGTERM)  # skip the drain: the running turn is cancelled
        second = time.monotonic()
        try:
            wait_until(lambda: len(watcher.received("ada")) == 3, PROMPT_S, "the cancelled turn's trigger")
        except AssertionError:
            print("\n".join(l for l in up.out.text().splitlines() if "jetstream_connected" not in l)[-6000:])
            raise
        cancelled_back_s = watcher.received("ada")[-1][2] - second
        assert up.proc.wait(timeout=60) == 0, up.out.text()[-4000:]

        ids = [i for i, _, _ in watcher.received("ada")] + [i for i, _, _ in watcher.received("linus")]
        assert len(set(ids)) == 4, ids
        # Each came back with one delivery spent (being fetched was the delivery), none dead-lettered.
        assert {r for _, r, _ in watcher.received("ada") + watcher.received("linus")} == {MAX_DELIVERIES - 2}
        assert loop.run(watcher.queue.dead_letters()) == []
        text = up.out.text()
        assert "clean=true" in text and "event=engine_drain_skipped" in text
        assert "event=queue_handed_back_on_stop" in text
        print(f"\nclean stop: held and gated mail back {held_back_s:.3f}s after SIGTERM; "
              f"the running turn's trigger {cancelled_back_s:.3f}s after the second SIGTERM")


def test_kill_9_mid_turn_returns_the_turns_trigger_after_about_one_ack_window(
    loop: LoopThread, broker: Any, tmp_path: Path
) -> None:
    ack_wait_s = 5.0  # the least stream.ack_wait_s allows
    with running(loop, broker, tmp_path, ack_wait_s=ack_wait_s, linger_s=0) as (up, watcher):
        up.post_slack("U0ADA", "D0ADA", "a long one")
        wait_until(lambda: watcher.turns_started("ada") == 1, 60, "ada's turn")
        # Two ack windows of the turn running: in-progress signals keep the trigger with `up`.
        watcher.take_inbox("ada")
        time.sleep(2 * ack_wait_s)
        assert watcher.received("ada") == [], "a running turn keeps its trigger past the ack window"

        up.kill()
        killed = time.monotonic()
        wait_until(lambda: len(watcher.received("ada")) == 1, 10 * ack_wait_s, "the trigger back from the dead node")
        (event_id, remaining, at), = watcher.received("ada")
        assert remaining == MAX_DELIVERIES - 2  # the same message, redelivered: its turn runs again
        print(f"\nkill -9 mid-turn: the trigger back {at - killed:.3f}s after the kill (ack wait {ack_wait_s} s)")
