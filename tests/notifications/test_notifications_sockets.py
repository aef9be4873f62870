"""The socket transports (Slack Socket Mode, Mattermost's websocket) against local servers that speak the vendors' protocols.

Each client feeds the notify service's edge on the memory twin, with the
router routing into the seats' inboxes: a wake on an inbox is the turn a
seat will run. The vendors' servers are :mod:`tests.surfaces_support`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Optional

import pytest

from crewlet.events import Event, store_label
from crewlet.events.types import InboundDelivery, RawWebhook
from crewlet.company.fields import CompanyError
from crewlet.company.org import Organization
from crewlet.queue import topics
from crewlet.queue.contract import Delivery, EventQueue
from crewlet.queue.memory import MemoryBroker
from notifications.runtime import NotifyService, unconfigured_surfaces, warn_unconfigured
from notifications.sockets import STATE_CONNECTED, STATE_NOT_CONFIGURED, SocketClient, SocketTimings
from notifications.sockets.mattermost import MattermostSocket, websocket_url
from notifications.sockets.slack import SlackSocket
from notifications.sources import PARSERS
from notifications.parsers import DeliveryMeta
from notifications_support import WEBHOOKS_DIR, company, holder, need, slack_message
from seats_support import Recorder, memory_queues
from surfaces_support import MATTERMOST_BOT_TOKEN, SLACK_APP_TOKEN, MattermostServer, SlackServer, mm_posted
from waiting_support import eventually

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default"]),
    pytest.mark.usefixtures("close_store_connections"),
]

#: Slack's SDK notices a socket cut without a close frame only when its pings go unanswered (four intervals);
#: Mattermost's client sees the cut at once, so its pings may wait out a loaded machine.
FAST = SocketTimings(retry_min_s=0.02, retry_max_s=0.1, ping_s=2.0, deliver_timeout_s=10.0, duty_check_s=0.05)
FAST_SLACK = dataclasses.replace(FAST, ping_s=0.5)
ENVIRON = {"SLACK_APP_TOKEN": SLACK_APP_TOKEN, "MATTERMOST_BOT_TOKEN": MATTERMOST_BOT_TOKEN}


def socket_company(*, slack_api: str = "", mattermost: str = "") -> Organization:
    surfaces: dict[str, Any] = {}
    if slack_api:
        surfaces["slack"] = {"mode": "socket", "app_token_env": "SLACK_APP_TOKEN", "api_url": slack_api}
    if mattermost:
        surfaces["mattermost"] = {"mode": "socket", "bot_token_env": "MATTERMOST_BOT_TOKEN", "server": mattermost}
    return company(surfaces=surfaces)


@dataclasses.dataclass
class Wired:
    broker: MemoryBroker
    queue: EventQueue
    notify: NotifyService
    rec: Recorder
    wakes: dict[str, list[Event]]

    def delivery_ids(self, handle: str) -> list[str]:
        return [w.payload["delivery_id"] for w in self.wakes[handle]]

    def published(self, etype: type) -> list[Event]:
        return [ev for _, ev in self.rec.seen if isinstance(ev.data, etype)]


@contextlib.asynccontextmanager
async def wired(org: Organization, **edge_options: Any) -> AsyncIterator[Wired]:
    """The notify service (edge + router) on the memory twin, and every wake on ada's and linus's inboxes."""
    async with memory_queues("n1") as (broker, (q,)):
        wakes: dict[str, list[Event]] = {"ada": [], "linus": []}
        subs = []
        for handle in wakes:
            await q.ensure_subscription(topics.agent_inbox(handle), topics.agent_inbox_group(handle))

            async def collect(d: Delivery, handle: str = handle) -> None:
                wakes[handle].append(d.event)

            subs.append(await q.subscribe(topics.agent_inbox(handle), topics.agent_inbox_group(handle), collect))
        rec = Recorder().attach(q)
        notify = NotifyService(q, holder(org), prune_interval_s=0, **edge_options)
        await notify.start()
        try:
            yield Wired(broker, q, notify, rec, wakes)
        finally:
            for sub in subs:
                await sub.detach()
            await notify.stop()


@contextlib.asynccontextmanager
async def client_on(kind: type[SocketClient], w: Wired, org: Organization, environ: Optional[dict[str, str]] = None) -> AsyncIterator[Any]:
    assert w.notify.edge is not None
    name = "slack" if kind is SlackSocket else "mattermost"
    timings = FAST_SLACK if kind is SlackSocket else FAST
    client = kind(org.surfaces[name], w.notify.edge, environ=ENVIRON if environ is None else environ, timings=timings)
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


@contextlib.contextmanager
def captured(caplog: pytest.LogCaptureFixture, name: str) -> Iterator[None]:
    """``caplog`` hears logger ``name`` directly, at WARNING and above, whatever another test did to propagation."""
    logger = logging.getLogger(name)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # heard once, here
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture(scope="module")
def slack_server() -> Iterator[SlackServer]:
    with SlackServer() as server:
        yield server


@pytest.fixture(scope="module")
def mattermost_server() -> Iterator[MattermostServer]:
    with MattermostServer() as server:
        yield server


# -- the company file ----------------------------------------------------------------------------------


def test_a_socket_surface_needs_its_token_variable_and_mattermost_its_server() -> None:
    with pytest.raises(CompanyError, match="surfaces.slack.app_token_env"):
        company(surfaces={"slack": {"mode": "socket"}})
    with pytest.raises(CompanyError, match="surfaces.mattermost.server"):
        company(surfaces={"mattermost": {"mode": "socket", "bot_token_env": "MM_BOT"}})
    with pytest.raises(CompanyError, match="surfaces.slack.mode"):
        company(surfaces={"slack": {"mode": "carrier-pigeon"}})
    with pytest.raises(CompanyError, match="surfaces.github.mode"):
        company(surfaces={"github": {"mode": "socket"}})
    with pytest.raises(CompanyError, match="surfaces.slack.app_token_env"):
        company(surfaces={"slack": {"app_token_env": "SLACK_APP_TOKEN"}})  # read only with mode: socket
    with pytest.raises(CompanyError, match="environment variable name"):
        company(surfaces={"slack": {"mode": "socket", "app_token_env": "xapp-1-A111-inline"}})
    org = socket_company(slack_api="http://127.0.0.1:9/api", mattermost="https://chat.example.com/")
    assert org.surfaces["slack"].socket and org.surfaces["slack"].token_env == "SLACK_APP_TOKEN"
    assert org.surfaces["mattermost"].server == "https://chat.example.com"
    assert websocket_url(org.surfaces["mattermost"].server) == "wss://chat.example.com/api/v4/websocket"
    assert websocket_url("http://127.0.0.1:8065/mm", "c1", 7) == "ws://127.0.0.1:8065/mm/api/v4/websocket?connection_id=c1&sequence_number=7"


async def test_a_socket_surface_whose_token_variable_is_unset_warns_at_start_and_reports_not_configured_without_making_the_node_unready(caplog) -> None:
    org = socket_company(slack_api="http://127.0.0.1:9/api/", mattermost="http://127.0.0.1:9")
    sockets = ("slack", "mattermost")
    assert [m for m in unconfigured_surfaces(org, {}) if m[0] in sockets] == [("slack", "SLACK_APP_TOKEN"), ("mattermost", "MATTERMOST_BOT_TOKEN")]
    assert [m for m in unconfigured_surfaces(org, ENVIRON) if m[0] in sockets] == []
    with captured(caplog, "crewlet.notifications"):
        warn_unconfigured(org, {})
    warned = [r for r in caplog.records if r.getMessage() == "webhook_secret_missing" and getattr(r, "surface", "") in sockets]
    assert [(r.surface, r.variable) for r in warned] == [("slack", "SLACK_APP_TOKEN"), ("mattermost", "MATTERMOST_BOT_TOKEN")]
    assert "socket cannot connect" in warned[0].hint and SLACK_APP_TOKEN not in caplog.text
    async with wired(org) as w, client_on(SlackSocket, w, org, environ={}) as client:
        report = client.status_report()
        assert report["state"] == STATE_NOT_CONFIGURED and report["ok"] is False
        # Reported (``/readyz`` lists it under ``degraded``), but not a dead duty: the node stays ready.
        assert "SLACK_APP_TOKEN" in report["hint"] and client.healthy()


# -- Slack Socket Mode -------------------------------------------------------------------------------------


async def test_a_slack_mention_over_socket_mode_wakes_the_seat_once_and_is_acknowledged_after_it_is_on_the_broker(slack_server: SlackServer) -> None:
    org = socket_company(slack_api=slack_server.api_url)
    async with wired(org) as w, client_on(SlackSocket, w, org) as client:
        await eventually(slack_server.connected, what="the socket open")
        envelope = slack_server.send("events_api", slack_message("<@W111> deploy please", event_id="EvSock1"))
        await eventually(lambda: envelope in slack_server.acks, what="the envelope acknowledged")
        assert slack_server.acks[envelope] is None  # an Events API envelope is acknowledged with no payload
        await eventually(lambda: w.delivery_ids("ada") == ["EvSock1"], what="ada's one wake")
        raw, = w.published(RawWebhook)
        record, = w.published(InboundDelivery)
        assert json.loads(raw.data.raw_bytes()) == slack_message("<@W111> deploy please", event_id="EvSock1")
        assert raw.data.route == record.data.route == "socket:slack" and raw.data.delivery_id == "EvSock1"
        assert store_label(record) == "webhook:message" and w.wakes["ada"][0].trace_id == raw.trace_id
        report = client.status_report()
        assert report["state"] == STATE_CONNECTED and report["ok"] and report["delivered"] == 1
        assert report["last_frame_at"] and report["last_error"] == ""


async def test_the_slack_server_dropping_the_socket_is_reconnected_and_nothing_is_lost_or_doubled(slack_server: SlackServer) -> None:
    org = socket_company(slack_api=slack_server.api_url)
    async with wired(org) as w, client_on(SlackSocket, w, org):
        await eventually(slack_server.connected, what="the socket open")
        opens = slack_server.opens
        first = slack_server.send("events_api", slack_message("<@W111> one", ts="3.1", event_id="EvDrop1"))
        await eventually(lambda: first in slack_server.acks, what="the first envelope acknowledged")
        slack_server.drop()
        second = slack_server.send("events_api", slack_message("<@W111> two", ts="3.2", event_id="EvDrop2"))
        await eventually(lambda: second in slack_server.acks, timeout_s=20, what="the envelope sent while down acknowledged")
        assert slack_server.opens > opens  # a new apps.connections.open, a new socket
        await eventually(lambda: len(w.wakes["ada"]) >= 2, what="both wakes")
        assert w.delivery_ids("ada") == ["EvDrop1", "EvDrop2"]


async def test_a_redelivered_slack_envelope_is_acknowledged_again_and_wakes_nobody_twice(slack_server: SlackServer) -> None:
    org = socket_company(slack_api=slack_server.api_url)
    payload = slack_message("<@W111> once", ts="4.1", event_id="EvTwice")
    async with wired(org) as w, client_on(SlackSocket, w, org):
        await eventually(slack_server.connected, what="the socket open")
        envelope = slack_server.send("events_api", payload)
        await eventually(lambda: envelope in slack_server.acks, what="acknowledged")
        slack_server.redeliver_acked(envelope, "events_api", payload)
        await eventually(lambda: envelope in slack_server.acks, what="the redelivery acknowledged")
        await eventually(lambda: len(w.published(RawWebhook)) == 2, what="both copies on the broker")
        await eventually(lambda: w.notify.router.routed == 2, what="both copies routed")
        assert w.delivery_ids("ada") == ["EvTwice"]


async def test_a_slack_envelope_is_not_acknowledged_while_the_broker_is_away_and_its_retry_wakes_the_seat_once(slack_server: SlackServer) -> None:
    org = socket_company(slack_api=slack_server.api_url)
    async with wired(org) as w, client_on(SlackSocket, w, org) as client:
        await eventually(slack_server.connected, what="the socket open")
        w.broker.go_away()
        envelope = slack_server.send("events_api", slack_message("<@W111> later", ts="5.1", event_id="EvAway"))
        await eventually(lambda: client.status.not_taken == 1, what="the envelope not taken")
        assert envelope not in slack_server.acks and envelope in slack_server.pending
        w.broker.come_back()
        slack_server.resend(envelope)  # Slack's retry of what it was not acknowledged
        await eventually(lambda: envelope in slack_server.acks, what="the retry acknowledged")
        await eventually(lambda: w.delivery_ids("ada") == ["EvAway"], what="ada's one wake")


async def test_a_slash_command_over_socket_mode_is_acknowledged_with_the_ephemeral_line_and_wakes_the_seat_it_names(slack_server: SlackServer) -> None:
    org = socket_company(slack_api=slack_server.api_url)
    command = {
        "token": "t", "team_id": "T111", "channel_id": "C777", "channel_name": "general", "user_id": "U0GRACE",
        "user_name": "grace", "command": "/ask", "text": "@ada ship it", "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "response_url": "https://hooks.slack.com/commands/1234/5678", "api_app_id": "A111",
    }
    interaction = {
        "type": "block_actions", "trigger_id": "trig-block-1", "user": {"id": "U0GRACE", "name": "grace"},
        "channel": {"id": "C777"}, "container": {"type": "message", "channel_id": "C777", "message_ts": "6.1"},
        "message": {"ts": "6.1", "user": "W111", "text": "Deploy?"}, "actions": [{"action_id": "go", "value": "yes", "text": {"type": "plain_text", "text": "Go"}}],
    }
    async with wired(org) as w, client_on(SlackSocket, w, org):
        await eventually(slack_server.connected, what="the socket open")
        asked = slack_server.send("slash_commands", command, accepts_response_payload=True)
        clicked = slack_server.send("interactive", interaction, accepts_response_payload=True)
        await eventually(lambda: asked in slack_server.acks and clicked in slack_server.acks, what="both acknowledged")
        assert slack_server.acks[asked] == {"response_type": "ephemeral", "text": "Sent to ada."}
        assert slack_server.acks[clicked] is None  # an interaction's acknowledgement is empty, as over HTTP
        await eventually(lambda: sorted(w.delivery_ids("ada")) == sorted([command["trigger_id"], "trig-block-1"]), what="two wakes")


def fixtures_of(source: str) -> list[Path]:
    found = sorted((WEBHOOKS_DIR / source).glob("*.json")) if WEBHOOKS_DIR.is_dir() else []
    return found or [need(None)]


async def test_every_slack_fixture_replayed_over_socket_mode_is_acknowledged_and_published_as_the_webhook_route_would(slack_server: SlackServer) -> None:
    org = socket_company(slack_api=slack_server.api_url)
    files = fixtures_of("slack")
    async with wired(org) as w, client_on(SlackSocket, w, org):
        await eventually(slack_server.connected, what="the socket open")
        sent = {slack_server.send("events_api", json.loads(path.read_bytes())): path for path in files}
        await eventually(lambda: all(e in slack_server.acks for e in sent), what="every fixture acknowledged")
        published = {json.dumps(json.loads(ev.data.raw_bytes()), sort_keys=True): ev for ev in w.published(RawWebhook)}
        parser = PARSERS["slack"]
        handshakes = 0
        for path in files:
            payload = json.loads(path.read_bytes())
            ev = published.get(json.dumps(payload, sort_keys=True))
            if payload.get("type") == "url_verification":
                handshakes += 1
                assert ev is None  # answered at the edge, never published, as over HTTP
                continue
            assert ev is not None, path.name
            assert ev.data.delivery_id == parser.delivery_id(payload, DeliveryMeta()), path.name
            assert ev.data.event_name == parser.event_name(payload, DeliveryMeta()), path.name
        assert len(w.published(InboundDelivery)) == len(files) - handshakes


# -- Mattermost's websocket --------------------------------------------------------------------------------


async def test_a_mattermost_mention_over_the_websocket_wakes_the_seat_once_after_the_authentication_challenge(mattermost_server: MattermostServer) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    async with wired(org) as w, client_on(MattermostSocket, w, org) as client:
        await eventually(lambda: client.status.connected, what="authenticated")
        seq = mattermost_server.post(mm_posted("postmention1", "@ada please look"))
        await eventually(lambda: w.delivery_ids("ada") == ["postmention1"], what="ada's one wake")
        raw, = w.published(RawWebhook)
        record, = w.published(InboundDelivery)
        assert raw.data.raw_bytes() == json.dumps(mattermost_server.events[seq]).encode()  # the frame's exact bytes
        assert store_label(record) == "socket:posted" and raw.data.route == "socket:mattermost"
        await eventually(lambda: client.next_seq == seq + 1, what="the seq read")
        report = client.status_report()
        assert report["ok"] and report["state"] == STATE_CONNECTED and report["delivered"] == 1


async def test_the_mattermost_server_dropping_the_socket_is_resumed_from_the_next_seq_and_nothing_is_lost_or_doubled(mattermost_server: MattermostServer) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    async with wired(org) as w, client_on(MattermostSocket, w, org) as client:
        await eventually(lambda: client.status.connected, what="authenticated")
        mattermost_server.post(mm_posted("postdrop1", "@ada first", channel="c-drop1"))
        await eventually(lambda: len(w.wakes["ada"]) == 1, what="the first wake")
        sessions = len(mattermost_server.sessions)
        mattermost_server.drop()
        missed = mattermost_server.post(mm_posted("postdrop2", "@ada second", channel="c-drop2"))  # while the socket is down
        await eventually(lambda: len(mattermost_server.sessions) > sessions, timeout_s=20, what="a reconnect")
        resumed = mattermost_server.sessions[-1]
        assert resumed["resumed"] and resumed["query"]["connection_id"] == client.connection_id
        assert int(resumed["query"]["sequence_number"]) == missed  # the next seq the client expected
        await eventually(lambda: len(w.wakes["ada"]) >= 2, what="the missed post's wake")
        mattermost_server.resend(missed)  # the same frame again under its own seq: already read
        mattermost_server.post(mm_posted("postdrop3", "@ada third", channel="c-drop3"))
        await eventually(lambda: len(w.wakes["ada"]) >= 3, what="the third wake")
        assert w.delivery_ids("ada") == ["postdrop1", "postdrop2", "postdrop3"]
        assert len(w.published(RawWebhook)) == 3


async def test_the_same_mattermost_post_sent_again_under_a_new_seq_wakes_nobody_twice(mattermost_server: MattermostServer) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    async with wired(org) as w, client_on(MattermostSocket, w, org) as client:
        await eventually(lambda: client.status.connected, what="authenticated")
        frame = mm_posted("posttwice1", "@ada once", channel="c-twice")
        mattermost_server.post(frame)
        again = mattermost_server.post(frame)
        await eventually(lambda: client.next_seq == again + 1, what="both frames read")
        await eventually(lambda: w.notify.router.routed == 2, what="both routed")
        assert w.delivery_ids("ada") == ["posttwice1"]


async def test_a_mattermost_frame_is_not_counted_read_while_the_broker_is_away_and_the_resume_delivers_it_once(mattermost_server: MattermostServer) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    async with wired(org) as w, client_on(MattermostSocket, w, org) as client:
        await eventually(lambda: client.status.connected, what="authenticated")
        w.broker.go_away()
        seq = mattermost_server.post(mm_posted("postaway1", "@ada when you can", channel="c-away"))
        await eventually(lambda: client.status.not_taken >= 1, what="the frame not taken")
        assert client.next_seq == seq  # not read: the resume asks for it again
        w.broker.come_back()
        await eventually(lambda: w.delivery_ids("ada") == ["postaway1"], timeout_s=20, what="ada's one wake")
        assert any(s["resumed"] and int(s["query"]["sequence_number"]) == seq for s in mattermost_server.sessions)


async def test_a_mattermost_server_that_lost_the_connection_starts_a_new_one_and_says_so(mattermost_server: MattermostServer, caplog) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    async with wired(org) as w, client_on(MattermostSocket, w, org) as client:
        await eventually(lambda: client.status.connected, what="authenticated")
        first = client.connection_id
        mattermost_server.forget()
        with captured(caplog, "crewlet.notifications.sockets.mattermost"):
            mattermost_server.drop()
            await eventually(lambda: client.connection_id not in ("", first), timeout_s=20, what="a new connection")
        assert any(r.getMessage() == "mattermost_socket_resume_lost" for r in caplog.records)
        mattermost_server.post(mm_posted("postnew1", "@ada after the restart", channel="c-new"))
        await eventually(lambda: w.delivery_ids("ada") == ["postnew1"], what="the wake on the new connection")


async def test_a_refused_mattermost_bot_token_is_the_surfaces_last_error_and_is_retried(mattermost_server: MattermostServer) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    refused = mattermost_server.refused
    async with wired(org) as w, client_on(MattermostSocket, w, org, environ={"MATTERMOST_BOT_TOKEN": "wrong"}) as client:
        await eventually(lambda: mattermost_server.refused >= refused + 2, what="two refused attempts")
        report = client.status_report()
        assert not report["ok"] and "refused the bot token" in report["last_error"] and "wrong" not in json.dumps(report)


async def test_every_mattermost_fixture_replayed_over_the_websocket_is_published_with_its_exact_bytes(mattermost_server: MattermostServer) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    files = fixtures_of("mattermost")
    async with wired(org) as w, client_on(MattermostSocket, w, org) as client:
        await eventually(lambda: client.status.connected, what="authenticated")
        seqs = [mattermost_server.post(json.loads(path.read_bytes())) for path in files]
        await eventually(lambda: client.next_seq == seqs[-1] + 1, what="every fixture read")
        await eventually(lambda: len(w.published(InboundDelivery)) == len(files), what="every fixture recorded")
        raws = [ev.data.raw_bytes() for ev in w.published(RawWebhook)]
        assert raws == [json.dumps(mattermost_server.events[s]).encode() for s in seqs]
        parser = PARSERS["mattermost"]
        for ev, path in zip(w.published(RawWebhook), files):
            assert ev.data.delivery_id == parser.delivery_id(json.loads(path.read_bytes()), DeliveryMeta()), path.name


# -- once per fleet ---------------------------------------------------------------------------------------


async def test_only_the_node_holding_the_surfaces_duty_lease_opens_its_socket_and_another_takes_over_when_it_lets_go(mattermost_server: MattermostServer) -> None:
    from crewlet.base.db import in_store
    from crewlet.fleet import leases
    from crewlet.fleet.member import FleetMember

    org = socket_company(mattermost=mattermost_server.url)
    a, b = FleetMember("node-a", ttl_s=30.0), FleetMember("node-b", ttl_s=30.0)
    async with wired(org) as w:
        assert w.notify.edge is not None
        surface = org.surfaces["mattermost"]
        first = MattermostSocket(surface, w.notify.edge, environ=ENVIRON, timings=FAST, hold_duty=a.hold_duty)
        second = MattermostSocket(surface, w.notify.edge, environ=ENVIRON, timings=FAST, hold_duty=b.hold_duty)
        await first.start()
        await eventually(lambda: first.status.connected, what="node-a connected")
        await eventually(lambda: mattermost_server.open == 1, what="only node-a's socket open")  # earlier tests' closed
        mattermost_server.most_open = 1
        await second.start()
        try:
            await eventually(lambda: second.status.standby, what="node-b standing by")
            report = second.status_report()
            assert report["state"] == "standby" and report["ok"] and not second.status.connected
            assert mattermost_server.open == 1
            await first.stop()
            await in_store(leases.release)(leases.DUTY, [first.name], "node-a")  # what node-a's clean stop does
            await eventually(lambda: second.status.connected, what="node-b took the socket over")
            assert mattermost_server.most_open == 1  # one socket at a time, throughout
            mattermost_server.post(mm_posted("postduty1", "@ada after the hand-over", channel="c-duty"))
            await eventually(lambda: w.delivery_ids("ada") == ["postduty1"], what="the wake through node-b")
        finally:
            await second.stop()
            await first.stop()


async def test_a_mattermost_frame_over_the_body_limit_is_refused_and_read_past_and_the_next_one_arrives(mattermost_server: MattermostServer) -> None:
    org = socket_company(mattermost=mattermost_server.url)
    async with wired(org, max_body=4096) as w, client_on(MattermostSocket, w, org) as client:
        await eventually(lambda: client.status.connected, what="authenticated")
        big = mattermost_server.post(mm_posted("postbig1", "@ada " + "x" * 8000, channel="c-big"))
        mattermost_server.post(mm_posted("postsmall1", "@ada small", channel="c-small"))
        await eventually(lambda: w.delivery_ids("ada") == ["postsmall1"], what="the next frame's wake")
        assert client.next_seq is not None and client.next_seq > big + 1 and client.status.delivered == 1


async def test_a_refused_slack_app_token_is_the_surfaces_last_error_and_is_retried(slack_server: SlackServer) -> None:
    org = socket_company(slack_api=slack_server.api_url)
    async with wired(org) as w, client_on(SlackSocket, w, org, environ={"SLACK_APP_TOKEN": "xapp-wrong"}) as client:
        await eventually(lambda: client.backoff.attempts >= 2, what="two refused attempts")
        report = client.status_report()
        assert not report["ok"] and report["last_error"] == "apps.connections.open failed: invalid_auth"
        assert report["state"] == "connecting" and "xapp-wrong" not in json.dumps(report)
