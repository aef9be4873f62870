"""Replay as a workflow through a real ``manage.py up``: filter, preview from the ledger, bulk replay, audit.

``up`` serves the example company (ada answers with the echo provider) on an
embedded broker the test also reaches. ada works one Slack message, so the
completion ledger holds its trigger. Then letters land on CREWLET_DLQ: bytes
no event decodes from, buried by ``up``'s own consume loop, and wakes whose
delivery budget ran out, stored as the queue's settler stores a burial (its
headers, its subject) — one a copy of the message ada already worked, one
ada never saw, one for linus. The preview must say the worked one will be
skipped and the other will run; the bulk replay of ``seat=ada,
reason=max_deliveries`` must take exactly those two, and ``up`` must then do
what the preview said: skip the first (``turn_trigger_skipped``), work the second.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest

from crewlet import events
from crewlet.events import Event, Trace
from crewlet.events.types import DEAD_LETTER_MAX_DELIVERIES, ExternalNotification
from crewlet.events.types.phrases import TRIGGER_ALREADY_WORKED
from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES
from crewlet.queue.transport import dead_letter_headers
from eventstore import actions as ops
from seats_support import FAST, publish_raw, subscribed_on
from waiting_support import wait_for_answer

pytestmark = [pytest.mark.integration]

TOKEN = "dead-letter-replay-up-token-0123456789abcdef"


async def _bury_as_the_settler_does(url: str, seat: str, event: Event) -> None:
    """``event`` on CREWLET_DLQ as a burial after its whole budget stores it: the dead-letter subject and headers."""
    from crewlet.queue.jetstream import JetStreamQueue

    topic, group = topics.agent_inbox(seat), topics.agent_inbox_group(seat)
    q = await JetStreamQueue.connect(url, node="tester", timings=FAST)
    try:
        headers = dead_letter_headers(topic, group, MAX_DELIVERIES, DEAD_LETTER_MAX_DELIVERIES, time.time())
        await q.transport.publish(topics.dlq(topic, group), event.to_json(), headers)
    finally:
        await q.close()


def _wakes(company: Any, text: str) -> list[dict[str, Any]]:
    return [w for w in company.events("external_notification", "ada") if text in str(w.get("body", ""))]


def _turn_in(company: Any, trace_id: str) -> Optional[dict[str, Any]]:
    """ada's completed turn in trace ``trace_id`` (a scheduled stand-up may have run beside it), or None."""
    return next((t for t in company.events("agent_turn_completed", "ada") if t["trace_id"] == trace_id), None)


@pytest.mark.timeout(300)
def test_inside_up_the_preview_says_worked_or_will_run_and_the_bulk_replay_takes_only_the_filtered_letters(
    tmp_path: Path,
) -> None:
    from tests.browser_support import company_on_broker, slack_message
    from tests.up_support import dashboard_page

    with company_on_broker(tmp_path, CREWLET_OPERATOR_TOKEN=TOKEN) as (loop, broker, company):
        status, _ = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "work me once"))
        assert status in (200, 202)
        (wire,) = wait_for_answer(lambda: _wakes(company, "work me once"), lambda rows: len(rows) == 1, "the Slack wake")
        worked = Event.from_dict(wire)
        done_turn = wait_for_answer(lambda: _turn_in(company, worked.trace_id), bool, "ada's turn on it")
        fresh = events.new(ExternalNotification(seat="ada", sender="grace", body="never seen"), Trace.root(), source="slack")
        other = events.new(ExternalNotification(seat="linus", sender="grace", body="for linus"), Trace.root(), source="slack")
        for seat, event in (("ada", worked), ("ada", fresh), ("linus", other)):
            loop.run(_bury_as_the_settler_does(broker.url, seat, event))
        wait_for_answer(lambda: loop.run(subscribed_on(broker.url, topics.agent_inbox("ada"))), bool, "up reading ada's inbox")
        loop.run(publish_raw(broker.url, topics.agent_inbox("ada"), b"\xff no event"))  # up buries it itself
        wait_for_answer(lambda: company.call("/api/dead-letters?reason=undecodable")[1].get("dead_letters"), bool, "up's burial")

        status, listed = company.call("/api/dead-letters?seat=ada")
        assert status == 200 and len(listed["dead_letters"]) == 3, listed
        status, refused = company.call("/api/dead-letters?reason=bored")
        assert status == 400 and refused["param"] == "reason" and "max_deliveries" in refused["reason"], refused

        status, preview = company.call("/api/dead-letters/preview?seat=ada")
        assert status == 200, preview
        will = {row["event_id"] or row["reason"]: row for row in preview["dead_letters"]}
        assert will[worked.id]["will"] == "skip" and will[worked.id]["triggers"][0]["worked_by"] == done_turn["turn_id"]
        assert will[fresh.id]["will"] == "run" and will[fresh.id]["triggers"][0]["worked_by"] == ""
        assert will["undecodable"]["will"] == "bury_again"

        page = dashboard_page(company, "/dead-letters/?seat=ada")
        assert page.count('data-will="skip"') == 1 and page.count('data-will="run"') == 1, page[-3000:]
        assert 'id="replay-shown"' in page

        body = {"filter": {"seat": "ada", "reason": "max_deliveries"}, "request_id": "bulk-up"}
        status, answer = company.call("/operator/dead-letters/replay", "POST", body)
        assert status == 200, answer
        assert sorted(r["event_id"] for r in answer["replayed"]) == sorted([worked.id, fresh.id]) and not answer["not_replayed"]
        status, left = company.call("/api/dead-letters")
        assert sorted(r["event_id"] or r["reason"] for r in left["dead_letters"]) == sorted([other.id, "undecodable"])

        # up does what the preview said: the worked trigger is skipped, the fresh one is worked.
        (skip,) = wait_for_answer(lambda: company.events("turn_trigger_skipped", "ada"), lambda rows: len(rows) == 1, "the skip")
        assert (skip["trigger_event_id"], skip["reason"]) == (worked.id, TRIGGER_ALREADY_WORKED), skip
        wait_for_answer(lambda: _turn_in(company, fresh.trace_id), bool, "the fresh wake worked")

        rows = wait_for_answer(
            lambda: company.call("/api/events?type=operator_acted")[1]["events"], lambda r: len(r) == 2, "one audit per letter"
        )
        assert all(r["tool"] == ops.TOOL_DEAD_LETTER_REPLAY for r in rows), rows
