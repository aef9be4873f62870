"""Replay as a workflow on a real broker: dead letters filtered, previewed from the completion ledger, replayed in bulk.

The letters are buried the way production buries them: a subscriber that
fails spends each wake's whole delivery budget (the backoff shrunk through the
injected Timings), and bytes no event decodes from are buried at once. The
ledger rows are the ones a finished turn writes (:func:`seats.ledger.record`).
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from rest_framework.test import APIClient

from crewlet import events
from crewlet.base.tokens import OperatorToken
from crewlet.events import Trace
from crewlet.events.types import DEAD_LETTER_MAX_DELIVERIES, DEAD_LETTER_UNDECODABLE, ExternalNotification
from crewlet.queue import topics
from crewlet.queue.contract import Delivery, Outcome
from eventstore import actions as ops
from eventstore.console import replay as rp
from eventstore.console.replay_views import TOOL_BULK_REPLAY
from eventstore.models import EventRow
from eventstore_support import bound_as_engine
from seats import ledger
from seats_support import bearer, eventually, in_thread, jetstream_queues, wake

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]


@pytest.fixture
async def engine() -> AsyncIterator[Any]:
    async with jetstream_queues("n1") as [q], bound_as_engine(q):
        yield q


async def bury(q: Any, seat: str, wakes: list[Any]) -> None:
    """Each of ``wakes`` on ``seat``'s inbox, NAK'd by a failing subscriber until the queue dead-letters it."""

    async def failing(delivery: Delivery) -> Outcome:
        return Outcome.NAK

    sub = await q.subscribe(topics.agent_inbox(seat), topics.agent_inbox_group(seat), failing)
    for w in wakes:
        await q.publish(topics.agent_inbox(seat), w)
    ids = {w.id for w in wakes}

    async def buried() -> bool:
        return ids <= {d.event.id for d in await q.dead_letters() if d.reason != DEAD_LETTER_UNDECODABLE}

    await eventually(buried, what=f"{len(wakes)} wakes dead-lettered from {seat}")
    await sub.detach()


async def bury_garbage(q: Any, seat: str) -> None:
    """Bytes no event decodes from, on ``seat``'s inbox: buried on their first delivery."""

    async def never(delivery: Delivery) -> None:
        raise AssertionError("undecodable bytes reach no handler")

    sub = await q.subscribe(topics.agent_inbox(seat), topics.agent_inbox_group(seat), never)
    await q.transport.publish(topics.agent_inbox(seat), b"\xff no event")

    async def buried() -> bool:
        return any(d.reason == DEAD_LETTER_UNDECODABLE for d in await q.dead_letters())

    await eventually(buried, what="the garbage dead-lettered")
    await sub.detach()


def call(fn: Any, *args: Any) -> Any:
    return asyncio.to_thread(in_thread, fn, *args)


def audits() -> list[EventRow]:
    return list(EventRow.objects.using("events").filter(type="operator_acted").order_by("ts"))


async def test_filters_preview_and_bulk_replay_take_the_matching_letters_and_only_them(engine: Any) -> None:
    worked_wake, fresh_wake = wake("ada", "already answered", delivery_id="d-1"), wake("ada", "never answered")
    jira = events.new(ExternalNotification(seat="bob", sender="sam", body="from jira"), Trace.root(), source="jira")
    await bury(engine, "ada", [worked_wake, fresh_wake])
    await bury(engine, "bob", [jira])
    await bury_garbage(engine, "ada")
    # ada's turn worked the first wake before its delivery failed: the ledger row a finished turn writes.
    await sync_to_async(ledger.record)("ada", "turn-1", [(ledger.trigger_identity(worked_wake), worked_wake.id)])
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)

    async def listed(query: str) -> list[str]:
        response = await call(c.get, f"/api/dead-letters?{query}")
        assert response.status_code == 200, response.content
        return sorted(row["event_id"] or row["reason"] for row in response.json()["dead_letters"])

    assert await listed("seat=ada") == sorted([worked_wake.id, fresh_wake.id, DEAD_LETTER_UNDECODABLE])
    assert await listed("seat=ada&reason=max_deliveries") == sorted([worked_wake.id, fresh_wake.id])
    assert await listed("reason=undecodable") == [DEAD_LETTER_UNDECODABLE]
    assert await listed("source=jira") == [jira.id]
    assert await listed("older_than=1h") == []
    assert len(await listed("newer_than=1h")) == 4
    assert len(await listed("")) == 4, "unfiltered, the list is what it was"

    for query, param in [
        ("reason=nope", "reason"),
        ("seat=no%20such%20seat", "seat"),
        ("older_than=soon", "older_than"),
        ("older_than=2h&newer_than=1h", "older_than"),
        ("colour=red", "colour"),
        ("source=", "source"),
    ]:
        refused = await call(c.get, f"/api/dead-letters/preview?{query}")
        assert refused.status_code == 400, (query, refused.content)
        assert refused.json()["param"] == param and refused.json()["reason"], refused.json()

    preview = await call(c.get, "/api/dead-letters/preview?seat=ada")
    assert preview.status_code == 200, preview.content
    body = preview.json()
    assert (body["matched"], body["scanned"]) == (3, 4)
    by_event = {row["event_id"] or row["reason"]: row for row in body["dead_letters"]}
    assert by_event[worked_wake.id]["will"] == rp.WILL_SKIP
    (trigger,) = by_event[worked_wake.id]["triggers"]
    assert trigger == {
        "trigger": ledger.trigger_identity(worked_wake), "worked_by": "turn-1", "in_thread": False, "will": rp.WILL_SKIP
    }
    assert by_event[fresh_wake.id]["will"] == rp.WILL_RUN
    assert [t["worked_by"] for t in by_event[fresh_wake.id]["triggers"]] == [""]
    assert by_event[DEAD_LETTER_UNDECODABLE]["will"] == rp.WILL_BURY_AGAIN
    assert by_event[worked_wake.id]["reason"] == DEAD_LETTER_MAX_DELIVERIES
    assert await sync_to_async(audits)() == [], "a preview is a read: nothing audited"

    bad = await call(c.post, "/operator/dead-letters/replay", {"filter": {"reason": "bored"}}, "json")
    assert bad.status_code == 400 and bad.json()["param"] == "filter.reason", bad.content
    assert (await call(c.post, "/operator/dead-letters/replay", {"refs": ["1"]}, "json")).json()["param"] == "filter"

    answer = await call(
        c.post, "/operator/dead-letters/replay",
        {"filter": {"seat": "ada", "reason": "max_deliveries"}, "request_id": "bulk-1"}, "json",
    )
    assert answer.status_code == 200, answer.content
    done = answer.json()
    assert done["request_id"] == "bulk-1" and done["matched"] == 2 and done["not_replayed"] == []
    assert {(r["event_id"], r["will"]) for r in done["replayed"]} == {(worked_wake.id, rp.WILL_SKIP), (fresh_wake.id, rp.WILL_RUN)}
    left = await engine.dead_letters()
    assert sorted(d.reason for d in left) == [DEAD_LETTER_MAX_DELIVERIES, DEAD_LETTER_UNDECODABLE]
    assert [d.event.id for d in left if d.reason == DEAD_LETTER_MAX_DELIVERIES] == [jira.id], "only the filtered ones"

    # refs narrow the filter to what a preview listed.
    (bob_letter,) = [d for d in left if d.reason == DEAD_LETTER_MAX_DELIVERIES]
    narrowed = await call(c.post, "/operator/dead-letters/replay", {"filter": {}, "refs": [bob_letter.ref]}, "json")
    assert narrowed.status_code == 200 and [r["event_id"] for r in narrowed.json()["replayed"]] == [jira.id]
    assert [d.reason for d in await engine.dead_letters()] == [DEAD_LETTER_UNDECODABLE]

    def rows() -> list[EventRow]:
        return audits()

    await eventually(lambda: sync_to_async(lambda: len(rows()) == 5)(), what="five operator_acted rows")
    every = await sync_to_async(rows)()
    refusals = [r for r in every if r.tool == TOOL_BULK_REPLAY]
    assert len(refusals) == 2 and all('"refusal":"bad_args"' in r.body for r in refusals)
    replays = [r for r in every if r.tool == ops.TOOL_DEAD_LETTER_REPLAY]
    assert len(replays) == 3 and all('"outcome":"replayed"' in r.body for r in replays)
    assert sum('"request_id":"bulk-1"' in r.body for r in replays) == 2, "one row per letter, under the bulk's request id"
    assert all(r.actor == "ops-console" for r in every)


def test_a_filter_is_parsed_whole_or_refused_naming_the_key() -> None:
    wanted = rp.parse_filter({"seat": "ada", "reason": "undecodable", "older_than": "15m", "newer_than": "7d"})
    assert (wanted.seat, wanted.reason, wanted.older_than_s, wanted.newer_than_s) == ("ada", "undecodable", 900.0, 604800.0)
    assert rp.parse_filter({}).empty
    cases: list[tuple[dict[str, Any], str]] = [({"source": "x" * 65}, "source"), ({"newer_than": "1w"}, "newer_than"), ({"seat": 3}, "seat")]
    for values, param in cases:
        with pytest.raises(rp.BadFilter) as refused:
            rp.parse_filter(values, where="filter.")
        assert refused.value.param == f"filter.{param}"


def test_with_no_engine_the_preview_and_the_bulk_replay_are_503() -> None:
    _, token = OperatorToken.mint("ops-console")
    c: APIClient = bearer(token)
    assert c.get("/api/dead-letters/preview?seat=ada").status_code == 503
    assert c.post("/operator/dead-letters/replay", {"filter": {}}, format="json").status_code == 503


def test_the_dead_letters_page_refuses_a_bad_filter_with_a_400_naming_it() -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    page = Client()
    page.force_login(get_user_model().objects.create_user("grace-admin", password="pw", is_staff=True))
    refused = page.get("/dead-letters/?reason=bored&seat=ada")
    assert refused.status_code == 400
    assert "Filter refused — reason:" in refused.content.decode() and 'value="ada"' in refused.content.decode()
