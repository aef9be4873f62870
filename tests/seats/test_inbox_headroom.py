"""A delivery a failing store keeps handing back is parked near its budget, never dead-lettered untried — on both backends.

The coordination store is away for longer than a message's whole delivery
budget (a real ``OperationalError``: a connection to a database that does not
exist). Each delivery that meets it is deferred and costs one delivery; once
the message is within five of the dead-letter it is parked instead — its event
republished to the inbox with a whole budget, the old delivery acked — and,
once the store is back, its turn runs exactly once. The same test runs on the
in-memory twin and on a real nats-server.
"""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

import pytest

from crewlet.events.types import ExternalNotification
from crewlet import events
from crewlet.events.tracing import Trace
from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, EventQueue
from seats import inbox as inbox_module
from seats.coalescer import coalesce
from seats.park import PARK_HEADROOM
from seats_support import drained, eventually, jetstream_queues, memory_queues, recording_with_mailboxes, running, store_away_for

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

#: Screenings the store fails: more than one message's whole budget.
OUTAGES = MAX_DELIVERIES + 5


@contextlib.asynccontextmanager
async def client(backend: str) -> AsyncIterator[EventQueue]:
    if backend == "memory":
        async with memory_queues() as (_, [q]):
            yield q
    else:
        async with jetstream_queues() as [q]:
            yield q


@pytest.mark.parametrize("backend", ["memory", pytest.param("jetstream", marks=pytest.mark.integration)])
async def test_a_store_outage_longer_than_the_budget_parks_the_message_near_it_and_its_turn_runs_once_when_the_store_is_back(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outages = [OUTAGES]
    monkeypatch.setattr(inbox_module, "ascreen", store_away_for(outages))
    async with client(backend) as q:
        rec, org = await recording_with_mailboxes(q)
        wake = events.new(
            ExternalNotification(seat="ada", sender="sam", body="when is the deploy?"),
            Trace.root(),
            source="slack",
            extras={"sender": "sam", "body": "when is the deploy?", "partition_key": "slack:D0A", "message_id": "D0A:1"},
        )
        await q.publish(topics.agent_inbox("ada"), wake)
        async with running(q, org, merge=coalesce, store_retry_s=0.01) as rt:
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"), what="the turn once the store is back")
            await drained(q, "ada")
            stats = rt.loops["ada"].stats
            seen = [remaining for event_id, remaining in stats.deliveries if event_id == wake.id]
        assert await q.dead_letters() == []

    first = MAX_DELIVERIES - 1
    parked_at = list(range(first, PARK_HEADROOM - 1, -1))  # deferred down to five left, parked on that one
    after = OUTAGES - len(parked_at)  # the copy: a whole budget, deferred while the outage lasts, then worked
    assert seen == parked_at + list(range(first, first - after - 1, -1))
    assert (stats.parked, stats.deferred, stats.failed) == (1, OUTAGES - 1, 0)
    [started] = rec.of("agent_turn_started", seat="ada")
    [done] = rec.of("agent_turn_completed", seat="ada")
    assert started.data.trigger_event_id == wake.id and done.data.failed is False
