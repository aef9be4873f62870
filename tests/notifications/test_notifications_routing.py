"""The notify router on the memory twin and the test database: recipients, follows, store trips, retries, end to end.

What routing refuses (every skip with its fixed phrase) and the rate valve are
tests/notifications/test_notifications_skips.py's, which routes with the helpers here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import Any, AsyncIterator, Optional

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.test import AsyncClient

from crewlet.events import Event
from crewlet.engine.interfaces import NOTIFY
from engine_support import engine_here
from crewlet.events.types import ExternalNotification
from crewlet.company.org import CompanyHolder, Organization
from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, Delivery, EventQueue, Outcome
from crewlet.queue.memory import MemoryBroker
from notifications.models import SeenDelivery, ThreadFollow
from notifications.parsers import WHY_ASSIGNEE, WHY_DM, WHY_FOLLOWER, WHY_MENTION, WHY_REVIEWER
from notifications.service import NotifyRouter, RateValve, RouteResult
from notifications_support import (
    company,
    fixture,
    fixture_bytes,
    holder,
    raw_delivery,
    slack_message,
)
from seats_support import Recorder, eventually, memory_queues

#: What a test that routes needs: the coordination store, its connections closed after.
STORE = [
    pytest.mark.django_db(transaction=True, databases=["default"]),
    pytest.mark.usefixtures("close_store_connections"),
]
pytestmark = STORE

AGENTS = ("ada", "linus")
NOW = 1_800_000_000.0


@dataclasses.dataclass
class Routed:
    router: NotifyRouter
    queue: EventQueue
    broker: MemoryBroker
    rec: Recorder
    holder: CompanyHolder

    async def route(self, source: str, body: Any, **kw: Any) -> RouteResult:
        return await self.router.route(raw_delivery(source, body, **kw))

    def skips(self) -> list[Event]:
        return [ev for topic, ev in self.rec.seen if topic == topics.event("notification_skipped")]


@contextlib.asynccontextmanager
async def routing(org: Optional[Organization] = None, *, valve: Optional[RateValve] = None) -> AsyncIterator[Routed]:
    async with memory_queues("n1") as (broker, (q,)):
        for handle in AGENTS:
            await q.ensure_subscription(topics.agent_inbox(handle), topics.agent_inbox_group(handle))
        rec = Recorder().attach(q)
        h = holder(org)
        yield Routed(NotifyRouter(q, h, valve=valve or RateValve(clock=lambda: NOW)), q, broker, rec, h)


def only_wake(result: RouteResult, handle: str) -> Event:
    assert result.woken == [handle], (result.woken, result.reasons, result.filtered)
    return result.wakes[0][1]


@sync_to_async
def follows() -> list[tuple[str, str]]:
    return list(ThreadFollow.objects.order_by("seat", "conversation").values_list("seat", "conversation"))


# -- recipients, per source ---------------------------------------------------------------


async def test_a_slack_mention_wakes_the_mentioned_seat_with_the_keys_the_body_and_the_trace() -> None:
    async with routing() as r:
        inbound = raw_delivery("slack", fixture_bytes("slack", "event_callback-app_mention.json"))
        result = await r.router.route(inbound)
        wake = only_wake(result, "ada")
        assert isinstance(wake.data, ExternalNotification)
        assert wake.type == "external_notification" and wake.source == "slack"
        assert wake.payload["partition_key"] == wake.payload["conversation_identity"] == "slack:C111:1595926230.009600"
        assert wake.payload["sender"] == "W222" and wake.payload["body"] == "<@W111> Hi there!"
        assert wake.payload["delivery_id"] == wake.data.delivery_id == "Ev111"
        assert wake.payload["why"] == WHY_MENTION and wake.payload["direct"] is True
        assert (wake.data.seat, wake.data.role, wake.data.agent_id) == ("ada", "engineer", r.holder.current().seat_by_handle("ada").agent_id)
        assert wake.trace_id == inbound.trace_id and wake.parent_span_id and wake.span_id != inbound.span_id
        assert wake.timestamp == inbound.timestamp
        # the wake on ada's inbox, and the same event recorded beside it
        assert [(t, e.id) for t, e in r.rec.seen] == [
            (topics.agent_inbox("ada"), wake.id),
            (topics.event("external_notification"), wake.id),
        ]
        assert await r.queue.backlog(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")) == 1


async def test_a_slack_dm_wakes_the_seat_the_event_is_authorized_for_partitioned_on_the_channel() -> None:
    async with routing() as r:
        top = only_wake(await r.route("slack", fixture_bytes("slack", "event_callback-message-im-toplevel.json")), "ada")
        assert top.payload["why"] == WHY_DM and top.payload["partition_key"] == "slack:D111"
        reply = fixture("slack", "event_callback-message-im-thread-reply.json")
        reply["event_id"], reply["event"]["ts"] = "Ev-reply", "1726133705.000001"  # the fixtures share one ts
        wake = only_wake(await r.route("slack", reply), "ada")
        assert wake.payload["partition_key"] == "slack:D111:1726133698.626339"
        assert wake.payload["conversation_identity"] == "slack:D111"


async def test_a_github_review_request_wakes_the_reviewer_and_the_assignee_who_caused_it_is_a_self_action() -> None:
    async with routing() as r:
        result = await r.route("github", fixture_bytes("github", "pull_request-opened.json"), event_name="pull_request", delivery_id="gh-1")
        wake = only_wake(result, "ada")
        assert wake.payload["why"] == WHY_REVIEWER and wake.payload["partition_key"] == "github:Codertocat/Hello-World#2"
        assert wake.payload["delivery_id"] == "gh-1"
        assert result.reasons == ["self-action: the recipient caused this event"]
        assert result.skips[0].data.seat == "linus"


async def test_a_jira_mention_and_a_jira_assignment_each_wake_their_seat() -> None:
    async with routing() as r:
        comment = fixture("jira", "comment_created.json")
        comment["comment"]["body"] = "[~accountid:acc-ada] could you take this?"
        wake = only_wake(await r.route("jira", comment, delivery_id="j-1"), "ada")
        assert wake.payload["partition_key"] == "jira:ZUL-1" and wake.payload["why"] == WHY_MENTION
        updated = fixture("jira", "jira-issue_updated-status-change.json")
        updated["issue"]["fields"]["assignee"] = {"accountId": "acc-linus", "displayName": "Linus"}
        wake = only_wake(await r.route("jira", updated, delivery_id="j-2"), "linus")
        assert wake.payload["why"] == WHY_ASSIGNEE and wake.payload["digest_body"].startswith("James Williams updated TEST-1")


async def test_a_confluence_page_update_reaches_the_seat_that_follows_the_page() -> None:
    async with routing() as r:
        mention = fixture("confluence", "page_created.json")
        mention["page"]["body"] = {"storage": {"value": '<p><ac:link><ri:user ri:account-id="acc-ada"/></ac:link> please review</p>'}}
        only_wake(await r.route("confluence", mention, delivery_id="c-1"), "ada")
        assert ("ada", "confluence:13139970") in await follows()
        wake = only_wake(await r.route("confluence", fixture_bytes("confluence", "page_updated.json"), delivery_id="c-2"), "ada")
        assert wake.payload["why"] == WHY_FOLLOWER and wake.payload["direct"] is False


async def test_mattermost_wakes_the_dm_member_and_the_mentioned_seat() -> None:
    async with routing() as r:
        dm = only_wake(await r.route("mattermost", fixture_bytes("mattermost", "posted-dm-root.json")), "ada")
        assert dm.payload["partition_key"] == "mattermost:4ckrmjaeeb8mbpodbmo6bknpge" and dm.payload["why"] == WHY_DM
        assert dm.payload["delivery_id"] == "a4aurxyyc3yruntz4zfmdw75nr" and dm.payload["sender"] == "jay"
        wake = only_wake(await r.route("mattermost", fixture_bytes("mattermost", "posted-channel-root-decoded.json")), "linus")
        assert wake.payload["partition_key"] == "mattermost:4fgt3n51f7ftpff91gk1iy1zow:wqpuawcw3iym3pq63s5xi1776r"


async def test_a_mattermost_username_mention_reaches_a_seat_known_by_username() -> None:
    org = company()
    seats = tuple(dataclasses.replace(s, identities={**s.identities, "mattermost": "ada.bot"}) if s.handle == "ada" else s for s in org.seats)
    async with routing(dataclasses.replace(org, seats=seats)) as r:
        payload = fixture("mattermost", "posted-channel-root-decoded.json")
        payload["data"]["post"]["message"] = "hey @Ada.Bot"
        payload["data"]["mentions"] = []
        only_wake(await r.route("mattermost", payload), "ada")


async def test_routing_reads_the_organization_current_at_that_moment() -> None:
    async with routing() as r:
        only_wake(await r.route("slack", slack_message("<@W111> one", event_id="Ev-a")), "ada")
        org = r.holder.current()
        swapped = tuple(
            dataclasses.replace(s, identities={**s.identities, "slack": "U0LINUS" if s.handle == "ada" else "W111"})
            if s.handle in AGENTS
            else s
            for s in org.seats
        )
        r.holder.swap(dataclasses.replace(org, seats=swapped))
        only_wake(await r.route("slack", slack_message("<@W111> two", ts="1718000000.000200", event_id="Ev-b")), "linus")


# -- following threads --------------------------------------------------------------------------


async def test_a_seat_woken_in_a_thread_follows_it_and_a_later_reply_reaches_it_without_a_mention(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="crewlet.notifications")
    async with routing() as r:
        only_wake(await r.route("slack", fixture_bytes("slack", "event_callback-app_mention.json")), "ada")
        assert await follows() == [("ada", "slack:C111:1595926230.009600")]
        reply = slack_message("any update?", channel="C111", ts="1595926300.000100", thread_ts="1595926230.009600", event_id="Ev-r")
        wake = only_wake(await r.route("slack", reply), "ada")
        assert wake.payload["why"] == WHY_FOLLOWER and wake.payload["direct"] is False
        assert wake.payload["partition_key"] == "slack:C111:1595926230.009600"

        other = slack_message("unrelated reply", channel="C111", ts="1595926400.000100", thread_ts="1595000000.000001", event_id="Ev-o")
        result = await r.route("slack", other)
        assert result.woken == [] and result.filtered == ["thread reply not followed"] and result.skips == []
        assert any(rec.message == "slack_event_skipped" and rec.levelno == logging.DEBUG for rec in caplog.records)


async def test_another_agents_post_reaches_followers_only_by_mention() -> None:
    async with routing() as r:
        only_wake(await r.route("slack", fixture_bytes("slack", "event_callback-app_mention.json")), "ada")
        chatter = slack_message("I agree", channel="C111", ts="1595926300.000100", thread_ts="1595926230.009600", user="U0LINUS", event_id="Ev-l")
        assert (await r.route("slack", chatter)).woken == []
        ask = slack_message("<@W111> do you agree?", channel="C111", ts="1595926301.000100", thread_ts="1595926230.009600", user="U0LINUS", event_id="Ev-m")
        only_wake(await r.route("slack", ask), "ada")


# -- store trips: what routing waits for -----------------------------------------------------------------


def store_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the store's awaitable verbs routing calls, in order (each one trip to the store's thread)."""
    from notifications import store

    trips: list[str] = []
    for name in ("aclaim", "aclaim_delivery", "afollowers", "afollow", "arate_hit"):
        real = getattr(store, name)

        async def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            trips.append(_name)
            return await _real(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    return trips


async def test_a_followed_thread_reply_claims_its_delivery_and_reads_the_followers_in_one_store_trip(monkeypatch) -> None:
    async with routing() as r:
        only_wake(await r.route("slack", fixture_bytes("slack", "event_callback-app_mention.json")), "ada")
        trips = store_trips(monkeypatch)
        reply = slack_message("any update?", channel="C111", ts="1595926300.000100", thread_ts="1595926230.009600", event_id="Ev-r1")
        assert only_wake(await r.route("slack", reply), "ada").payload["why"] == WHY_FOLLOWER
        assert trips == ["aclaim_delivery", "aclaim", "afollow"]  # the delivery and its followers, the wake, the follow


async def test_a_mentioned_seats_wake_is_claimed_on_the_deliverys_own_store_trip(monkeypatch) -> None:
    async with routing() as r:
        trips = store_trips(monkeypatch)
        only_wake(await r.route("slack", fixture_bytes("slack", "event_callback-app_mention.json")), "ada")
        assert trips == ["aclaim_delivery", "afollow"]  # the delivery with ada's wake and the thread's followers, then the follow
        copy = fixture("slack", "event_callback-app_mention.json")
        copy["event"]["type"], copy["event_id"] = "message", "Ev-message-copy"  # the same chat message under another event id
        assert (await r.route("slack", copy)).woken == []


async def test_with_the_rate_valve_on_a_wake_is_claimed_only_after_the_valve_admitted_it(monkeypatch) -> None:
    trips = store_trips(monkeypatch)  # before the valve takes its counter
    async with routing(company(rate_limit=1)) as r:
        only_wake(await r.route("slack", slack_message("<@W111> one", ts="3.1", event_id="Ev-v1")), "ada")
        refused = await r.route("slack", slack_message("<@W111> two", ts="3.2", event_id="Ev-v2"))
        assert refused.woken == [] and refused.reasons == ["rate limit exceeded"]
        # the second wake, refused by the valve, claimed nothing
        assert trips == ["aclaim_delivery", "arate_hit", "aclaim", "afollow", "aclaim_delivery", "arate_hit"]


async def test_a_store_that_fails_the_combined_trip_is_asked_for_each_part_alone_and_the_follower_is_still_woken(monkeypatch, caplog) -> None:
    from notifications import store

    async with routing() as r:
        only_wake(await r.route("slack", fixture_bytes("slack", "event_callback-app_mention.json")), "ada")

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise DatabaseError("the store went away for one trip")

        monkeypatch.setattr(store, "aclaim_delivery", refused)
        reply = slack_message("any update?", channel="C111", ts="1595926300.000100", thread_ts="1595926230.009600", event_id="Ev-r2")
        assert only_wake(await r.route("slack", reply), "ada").payload["why"] == WHY_FOLLOWER
        retry = await r.route("slack", reply)  # the same delivery from the vendor again: the claim asked alone held
        assert retry.duplicate and retry.woken == []
        assert any(rec.message == "notification_claim_trip_failed" for rec in caplog.records)


async def test_a_redelivered_event_finds_its_own_claim_and_the_followers_again() -> None:
    async with routing() as r:
        only_wake(await r.route("slack", fixture_bytes("slack", "event_callback-app_mention.json")), "ada")
        inbound = raw_delivery("slack", slack_message("any update?", channel="C111", ts="1595926300.000100", thread_ts="1595926230.009600", event_id="Ev-r3"))
        first = only_wake(await r.router.route(inbound), "ada")
        again = only_wake(await r.router.route(inbound), "ada")  # the routing node died before its ack
        assert again.id == first.id and again.payload["why"] == WHY_FOLLOWER


def test_a_new_dedupe_key_is_claimed_in_one_statement_and_only_a_taken_key_is_read_back() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from notifications import store

    with CaptureQueriesContext(connection) as new:
        assert store.claim("delivery:slack:Ev-once", "event-1")
    with CaptureQueriesContext(connection) as again:
        assert store.claim("delivery:slack:Ev-once", "event-1")  # the same event (a broker redelivery)
    with CaptureQueriesContext(connection) as other:
        assert not store.claim("delivery:slack:Ev-once", "event-2")  # another event: the vendor's retry
    assert (len(new), len(again), len(other)) == (1, 2, 2)
    assert list(SeenDelivery.objects.filter(key="delivery:slack:Ev-once").values_list("event_id", flat=True)) == ["event-1"]


def test_a_follow_is_one_statement_and_a_second_one_refreshes_the_same_row() -> None:
    from datetime import datetime, timezone

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from notifications import store

    first, later = datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 2, 1, tzinfo=timezone.utc)
    with CaptureQueriesContext(connection) as once:
        store.follow("ada", "slack:C1:1.0", "slack", now=first)
    with CaptureQueriesContext(connection) as twice:
        store.follow("ada", "slack:C1:1.0", "mattermost", now=later)
    assert (len(once), len(twice)) == (1, 1)
    row = ThreadFollow.objects.get(seat="ada", conversation="slack:C1:1.0")
    assert (row.source, row.followed_at, row.last_woken_at) == ("mattermost", first, later)
    assert store.followers("slack:C1:1.0") == ["ada"]


# -- chat parser filtering is debug, never recorded ----------------------------------------------------


async def test_a_seats_own_post_a_deleted_post_and_a_system_post_are_logged_at_debug_and_not_recorded(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="crewlet.notifications")
    async with routing() as r:
        own = slack_message("<@W111> note to self", user="W111", event_id="Ev-own")
        assert (await r.route("slack", own)).filtered == ["own post"]
        assert (await r.route("slack", fixture_bytes("slack", "event_callback-message-message_deleted.json"))).filtered == ["deleted post"]
        system = fixture("mattermost", "posted-channel-root-decoded.json")
        system["data"]["post"]["type"] = "system_join_channel"
        assert (await r.route("mattermost", system)).filtered[0].startswith("system post")
        assert r.rec.seen == []
        names = {(rec.message, rec.levelno) for rec in caplog.records}
        assert ("slack_event_skipped", logging.DEBUG) in names and ("mattermost_post_skipped", logging.DEBUG) in names
        assert "notification_skipped" not in {rec.message for rec in caplog.records}


async def test_a_channel_message_nobody_is_addressed_in_wakes_nobody_and_records_nothing() -> None:
    async with routing() as r:
        result = await r.route("slack", fixture_bytes("slack", "event_callback-message-channel-toplevel-real-ids.json"))
        assert result.woken == [] and result.filtered == ["not addressed to a seat"] and r.rec.seen == []


# -- retries ------------------------------------------------------------------------------------------


async def test_a_vendor_retry_of_the_same_delivery_never_produces_a_second_wake() -> None:
    async with routing() as r:
        body = fixture_bytes("slack", "event_callback-app_mention.json")
        only_wake(await r.route("slack", body), "ada")
        retry = await r.route("slack", body)  # the edge published it again: a new inbound event, same event_id
        assert retry.duplicate and retry.woken == [] and retry.skips == []
        assert await r.queue.backlog(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")) == 1
        assert await sync_to_async(SeenDelivery.objects.filter(key="delivery:slack:Ev111").count)() == 1


async def test_a_broker_redelivery_of_the_same_delivery_republishes_the_same_wake() -> None:
    async with routing() as r:
        inbound = raw_delivery("slack", fixture_bytes("slack", "event_callback-app_mention.json"))
        first = only_wake(await r.router.route(inbound), "ada")
        again = only_wake(await r.router.route(inbound), "ada")  # the routing node died before its ack
        assert again.id == first.id  # the inbox's same-id dedupe and the ledger collapse it


async def test_one_chat_message_delivered_twice_under_two_event_ids_wakes_a_seat_once() -> None:
    async with routing() as r:
        mention = fixture("slack", "event_callback-app_mention.json")
        as_message = json.loads(json.dumps(mention))
        as_message["event"]["type"] = "message"
        as_message["event_id"] = "Ev-message-copy"
        only_wake(await r.route("slack", mention), "ada")
        assert (await r.route("slack", as_message)).woken == []


async def test_a_wake_that_cannot_be_published_fails_the_delivery_for_redelivery() -> None:
    async with routing() as r:
        inbound = raw_delivery("slack", fixture_bytes("slack", "event_callback-app_mention.json"))
        r.broker.go_away()
        delivery = Delivery(event=inbound, topic=topics.NOTIFICATIONS_INBOUND, remaining=MAX_DELIVERIES - 1)
        assert await r.router._handle(delivery) == Outcome.NAK
        r.broker.come_back()
        assert await r.router._handle(delivery) == Outcome.ACK
        assert await r.queue.backlog(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")) == 1


# -- end to end on the real broker ------------------------------------------------------------------------


@pytest.mark.integration
async def test_a_fixture_posted_to_the_edge_wakes_the_seat_on_its_inbox_over_the_real_broker() -> None:
    from crewlet.queue.contract import Delivery as QDelivery
    from notifications.runtime import NotifyService
    from seats_support import drained, jetstream_queues

    async with jetstream_queues("n1") as (q,):
        inbox, group = topics.agent_inbox("ada"), topics.agent_inbox_group("ada")
        await q.ensure_subscription(inbox, group)
        notify = NotifyService(q, holder())
        await notify.start()
        got: list[Event] = []

        async def collect(d: QDelivery) -> None:
            got.append(d.event)

        sub = await q.subscribe(inbox, group, collect)
        try:
            with engine_here(q, services={NOTIFY: notify}):
                body = fixture_bytes("slack", "event_callback-message-im-toplevel.json")
                resp = await AsyncClient().post("/webhooks/slack", data=body, content_type="application/json")
                assert resp.status_code == 202, resp.content
                await eventually(lambda: len(got) == 1, what="ada's wake on her inbox")
                wake = got[0]
                assert wake.type == "external_notification" and wake.data.seat == "ada"
                assert wake.payload["partition_key"] == wake.payload["conversation_identity"] == "slack:D111"
                assert wake.payload["delivery_id"] == "Ev111" and wake.payload["sender"] == "W222"
                assert wake.trace_id == resp.json()["trace_id"]

                # Slack retries the same delivery; a later, different message proves the retry was routed (and dropped).
                assert (await AsyncClient().post("/webhooks/slack", data=body, content_type="application/json")).status_code == 202
                later = fixture("slack", "event_callback-message-im-toplevel.json")
                later["event_id"], later["event"]["ts"], later["event"]["text"] = "Ev222", "1726133799.000001", "second"
                resp2 = await AsyncClient().post("/webhooks/slack", data=json.dumps(later), content_type="application/json")
                assert resp2.status_code == 202
                await eventually(lambda: len(got) == 2, what="the second message's wake")
                assert [w.payload["delivery_id"] for w in got] == ["Ev111", "Ev222"]
        finally:
            await sub.detach()
            await notify.stop()


@pytest.mark.integration
async def test_a_burst_posted_to_the_edge_becomes_one_digest_trigger_on_the_real_broker() -> None:
    """N DM messages routed while nothing drains ada's inbox drain as one partition and run as ONE trigger."""
    from crewlet.queue.contract import BatchOptions, Partition
    from seats.coalescer import dispatch
    from notifications.runtime import NotifyService
    from seats.coalescer import partition_key_of
    from seats_support import drained, jetstream_queues

    async with jetstream_queues("n1") as (q,):
        inbox, group = topics.agent_inbox("ada"), topics.agent_inbox_group("ada")
        await q.ensure_subscription(inbox, group)
        rec = Recorder().attach(q)
        notify = NotifyService(q, holder())
        await notify.start()
        try:
            with engine_here(q, services={NOTIFY: notify}):
                texts = ["can you look at the build?", "+1", "+1", "it is red since noon"]
                for i, text in enumerate(texts):
                    msg = fixture("slack", "event_callback-message-im-toplevel.json")
                    msg["event_id"], msg["event"]["ts"], msg["event"]["text"] = f"Ev-burst-{i}", f"1726133800.00000{i}", text
                    resp = await AsyncClient().post("/webhooks/slack", data=json.dumps(msg), content_type="application/json")
                    assert resp.status_code == 202

                async def all_routed() -> bool:
                    return await q.backlog(inbox, group) == len(texts)

                await eventually(all_routed, what="every message routed to ada's inbox")
                runs: list[Event] = []

                async def run(ev: Event) -> None:
                    runs.append(ev)

                async def handler(partition: Partition) -> None:
                    await dispatch(q, "ada", partition.events, run)

                sub = await q.subscribe_batch(inbox, group, BatchOptions(partition_key=partition_key_of, max_batch=20), handler)
                try:
                    await eventually(lambda: len(runs) == 1, what="one merged turn")
                    await drained(q, "ada")
                finally:
                    await sub.detach()
                merged = runs[0]
                assert merged.payload["coalesced_count"] == 4 and merged.payload["partition_key"] == "slack:D111"
                assert merged.payload["body"].endswith("it is red since noon")
                assert merged.payload["duplicates_collapsed"] == 1  # the same sender's repeated "+1"
                assert [m["body"] for m in merged.data.messages] == texts
                coalesced = rec.of("notifications_coalesced")
                assert len(coalesced) == 1 and coalesced[0].data.partition_key == "slack:D111"
                assert merged.trace_id == rec.of("external_notification")[0].trace_id  # the FIRST constituent's trace
        finally:
            await notify.stop()
