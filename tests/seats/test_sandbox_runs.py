"""A coding run's row: a reply recorded once and into the ledger, an ending decided once, a hand-back that is one message."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from seats.delivery_models import LedgerEntry
from seats.ledger import trigger_identity
from seats.sandbox import runs
from seats.sandbox.answers import K_HANDED_BACK_FROM, handed_back
from seats_support import wake

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "events"])

AT = datetime(2026, 12, 5, 9, 0, tzinfo=timezone.utc)


def opened() -> runs.Run:
    return runs.open_run(run_id="run-00000000000000b2", seat="ada", task="build", work_key="c1", launch={}, turn_id="t", node="n1")


def test_a_reply_is_recorded_only_on_a_parked_run_and_its_original_is_in_the_ledger_as_the_runs() -> None:
    run = opened()
    reply = wake("ada", "use main", conversation="c1", delivery_id="D-77")
    identity = trigger_identity(reply)
    assert not runs.answered(run.run_id, {"text": "use main"}, reply.id, identity)  # running: it asked nothing
    assert not LedgerEntry.objects.filter(seat="ada").exists()
    assert runs.parked(run.run_id, "which branch?", AT)
    assert runs.answered(run.run_id, {"text": "use main", "event": reply.to_dict()}, reply.id, identity)
    assert not runs.answered(run.run_id, {"text": "again"}, "other", "other")  # one reply per question
    [entry] = LedgerEntry.objects.filter(seat="ada")
    assert (entry.trigger, entry.turn_id, entry.event_id) == (identity, runs.ledger_turn(run.run_id), reply.id)
    row = runs.get(run.run_id)
    assert row is not None and (row.status, row.holds, row.answer["event"]["id"]) == ("answered", True, reply.id)


def test_a_reply_a_run_took_already_is_taken_by_no_other_run() -> None:
    first, second = opened(), runs.open_run(
        run_id="run-00000000000000b4", seat="ada", task="lint", work_key="c1", launch={}, turn_id="t2", node="n1",
    )
    reply = wake("ada", "use main", conversation="c1", delivery_id="D-80")
    for run in (first, second):
        assert runs.parked(run.run_id, "which branch?", AT)
    assert runs.answered(first.run_id, {"text": "use main"}, reply.id, trigger_identity(reply))
    assert not runs.answered(second.run_id, {"text": "use main"}, reply.id, trigger_identity(reply))  # its redelivery
    assert [(r.run_id, r.status) for r in sorted(filter(None, map(runs.get, (first.run_id, second.run_id))), key=lambda r: r.run_id)] == [
        (first.run_id, "answered"), (second.run_id, "parked"),
    ]


def test_an_ending_is_decided_once_and_a_reply_no_job_took_goes_to_the_outbox_with_it() -> None:
    run = opened()
    reply = wake("ada", "use main", conversation="c1", delivery_id="D-78")
    runs.parked(run.run_id, "which branch?", AT)
    runs.answered(run.run_id, {"text": "use main", "event": reply.to_dict()}, reply.id, trigger_identity(reply))
    first = runs.ended(run.run_id, runs.OUTCOME_EXITED, {"exit_code": 1}, AT)
    second = runs.ended(run.run_id, runs.OUTCOME_FAILED, {"error": "late"}, AT + timedelta(seconds=5))
    assert (second.outcome, second.ending_id, second.ended_at) == (runs.OUTCOME_EXITED, first.ending_id, AT)
    assert first.outbox is not None and first.outbox["id"] == reply.id and first.holds  # held until its seat is told
    runs.woken(run.run_id)
    runs.outbox_sent(run.run_id)
    settled = runs.get(run.run_id)
    assert settled is not None and (settled.holds, settled.outbox) == (False, None)


def test_a_handed_back_reply_is_one_message_however_often_it_is_sent_and_carries_no_identity_of_the_original() -> None:
    reply = wake("ada", "use main", conversation="c1", delivery_id="D-79")
    reply.payload["message_id"] = "1718000000.000009"
    one, again = handed_back(reply.to_dict(), "run-00000000000000b3"), handed_back(reply.to_dict(), "run-00000000000000b3")
    assert one.id == again.id != reply.id
    assert one.field("body") == "use main" and one.payload[K_HANDED_BACK_FROM] == "run-00000000000000b3"
    assert trigger_identity(one) == f"event:{one.id}" != trigger_identity(reply)
