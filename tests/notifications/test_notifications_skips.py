"""What the notify router refuses, on the memory twin and the test database: every skip with its fixed phrase, and the rate valve.

A delivery that wakes nobody is recorded as a ``notification_skipped`` whose
reason is one of the fixed phrases (``SKIP_REASONS``), each produced here; the
rate valve is off by default, shares its counters between nodes and fails
open when the store is unreachable. The routing helpers are
tests/notifications/test_notifications_routing.py's.
"""
from __future__ import annotations

import dataclasses
import logging

from django.db import DatabaseError

from crewlet.events import Event
from crewlet.events.types import SKIP_REASONS, NotificationSkipped, TaskAssigned
from crewlet.queue import topics
from notifications.service import NotifyRouter, RateValve, RouteResult
from notifications_support import company, fixture_bytes, holder, raw_delivery, slack_message
from seats_support import memory_queues
from test_notifications_routing import NOW, STORE, Routed, only_wake, routing

pytestmark = STORE


# -- every skip, with its fixed phrase -----------------------------------------------------------------


def _skip(r: Routed, result: RouteResult, reason: str) -> NotificationSkipped:
    assert result.reasons == [reason], (result.reasons, result.woken, result.filtered)
    recorded = r.skips()[-1]
    assert recorded.id == result.skips[0].id and recorded.data.reason == reason
    assert set(recorded.payload) >= {"handle", "notification_source"}
    return recorded.data


async def test_an_unreadable_payload_is_skipped_as_unreadable_delivery_payload() -> None:
    async with routing() as r:
        skip = _skip(r, await r.route("slack", b"{not json", delivery_id="x"), "unreadable delivery payload")
        assert skip.detail.startswith("not JSON")
        not_a_delivery = await r.router.route(Event(type="task_assigned", source="slack", data=TaskAssigned()))
        assert not_a_delivery.reasons == ["unreadable delivery payload"]


async def test_a_source_the_company_no_longer_has_is_skipped_as_disconnected() -> None:
    org = company()
    async with routing(dataclasses.replace(org, surfaces={k: v for k, v in org.surfaces.items() if k != "slack"})) as r:
        _skip(r, await r.route("slack", fixture_bytes("slack", "event_callback-app_mention.json")), "this source was disconnected")


async def test_a_source_nothing_parses_is_skipped_as_no_parser() -> None:
    async with routing() as r:
        skip = _skip(r, await r.route("zulip", {"message": "hi"}), "no parser for this source")
        assert "zulip" in skip.detail and r.skips()[-1].payload["notification_source"] == "zulip"


async def test_a_payload_its_parser_refuses_is_skipped_as_parse_failed_with_the_error_as_detail() -> None:
    async with routing() as r:
        skip = _skip(r, await r.route("slack", {"type": "event_callback", "event_id": "Ev-x"}), "parse failed")
        assert skip.detail == "event_callback carries no event object"


async def test_a_mention_of_nobody_in_the_company_is_skipped_as_no_seat_under_the_deliverys_trace() -> None:
    async with routing() as r:
        inbound = raw_delivery("slack", slack_message("<@U404> hello"))
        skip = _skip(r, await r.router.route(inbound), "no seat matches this recipient")
        assert skip.recipient == "U404" and skip.detail == "mention U404" and skip.seat == ""
        assert r.skips()[-1].trace_id == inbound.trace_id and r.skips()[-1].parent_span_id


async def test_a_human_recipient_is_an_info_level_skip_not_a_warning(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="crewlet.notifications")
    async with routing() as r:
        skip = _skip(r, await r.route("slack", slack_message("<@U0GRACE> fyi")), "human seat")
        assert skip.seat == "grace" and r.skips()[-1].payload["handle"] == "grace"
        levels = [rec.levelno for rec in caplog.records if rec.message == "notification_skipped"]
        assert levels == [logging.INFO]


async def test_a_recipient_that_caused_the_event_is_refused_by_the_routing_gate() -> None:
    async with routing() as r:
        result = await r.route("github", fixture_bytes("github", "issue_comment-created.json"), event_name="issue_comment")
        skip = _skip(r, result, "self-action: the recipient caused this event")
        assert skip.seat == "linus" and "Codertocat" in skip.detail


async def test_a_seat_over_its_rate_is_skipped_as_rate_limit_exceeded() -> None:
    async with routing(company(rate_limit=1)) as r:
        only_wake(await r.route("slack", slack_message("<@W111> one", event_id="Ev-1")), "ada")
        result = await r.route("slack", slack_message("<@W111> two", ts="1718000000.000200", event_id="Ev-2"))
        _skip(r, result, "rate limit exceeded")


async def test_every_skip_reason_is_produced_and_each_is_one_of_the_fixed_phrases() -> None:
    org = company(rate_limit=1)
    produced: set[str] = set()
    async with routing(org) as r:
        for source, body, kw in [
            ("slack", b"nope", {}),
            ("zulip", {"x": 1}, {}),
            ("slack", {"type": "event_callback", "event_id": "Ev-p"}, {}),
            ("slack", slack_message("<@U404>", event_id="Ev-n"), {}),
            ("slack", slack_message("<@U0GRACE>", event_id="Ev-h"), {}),
            ("github", fixture_bytes("github", "issue_comment-created.json"), {"event_name": "issue_comment"}),
            ("slack", slack_message("<@W111> a", ts="1.1", event_id="Ev-r1"), {}),
            ("slack", slack_message("<@W111> b", ts="1.2", event_id="Ev-r2"), {}),
        ]:
            produced |= set((await r.route(source, body, **kw)).reasons)
    async with routing(dataclasses.replace(org, surfaces={})) as r:
        produced |= set((await r.route("jira", fixture_bytes("jira", "comment_created.json"))).reasons)
    assert produced == set(SKIP_REASONS)


# -- the rate valve ----------------------------------------------------------------------------------


def test_a_rate_below_one_per_second_widens_the_window() -> None:
    assert RateValve.window(0.5) == (2, 1)
    assert RateValve.window(0.2) == (5, 1)
    assert RateValve.window(3) == (1, 3)
    assert RateValve.window(2.5) == (1, 2)


async def test_the_rate_valve_is_off_by_default() -> None:
    async with routing(company(rate_limit=0)) as r:
        for i in range(5):
            only_wake(await r.route("slack", slack_message(f"<@W111> {i}", ts=f"1.{i}", event_id=f"Ev-{i}")), "ada")


async def test_the_rate_counters_are_shared_so_a_second_node_sees_the_first_nodes_wakes() -> None:
    async with memory_queues("n1", "n2") as (_, (q1, q2)):
        await q1.ensure_subscription(topics.agent_inbox("ada"), topics.agent_inbox_group("ada"))
        h = holder(company(rate_limit=2))
        n1 = NotifyRouter(q1, h, valve=RateValve(clock=lambda: NOW))
        n2 = NotifyRouter(q2, h, valve=RateValve(clock=lambda: NOW + 0.5))
        assert (await n1.route(raw_delivery("slack", slack_message("<@W111> a", ts="1.1", event_id="A")))).woken == ["ada"]
        assert (await n2.route(raw_delivery("slack", slack_message("<@W111> b", ts="1.2", event_id="B")))).woken == ["ada"]
        third = await n1.route(raw_delivery("slack", slack_message("<@W111> c", ts="1.3", event_id="C")))
        assert third.reasons == ["rate limit exceeded"]
        later = NotifyRouter(q1, h, valve=RateValve(clock=lambda: NOW + 1))
        assert (await later.route(raw_delivery("slack", slack_message("<@W111> d", ts="1.4", event_id="D")))).woken == ["ada"]


async def test_the_rate_valve_fails_open_when_the_store_is_unreachable(caplog) -> None:
    async def broken(seat: str, window: int) -> int:
        raise DatabaseError("connection refused")

    caplog.set_level(logging.WARNING, logger="crewlet.notifications")
    async with routing(company(rate_limit=1), valve=RateValve(broken, clock=lambda: NOW)) as r:
        for i in range(3):
            only_wake(await r.route("slack", slack_message(f"<@W111> {i}", ts=f"2.{i}", event_id=f"Ev-f{i}")), "ada")
        opened = [rec for rec in caplog.records if rec.message == "notification_rate_store_unavailable"]
        assert len(opened) == 3 and all(rec.levelno == logging.WARNING for rec in opened)
