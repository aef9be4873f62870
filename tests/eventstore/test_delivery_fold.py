"""Where a delivery is now, derived from event sequences (eventstore.questions.deliveries.fold_delivery)."""
from __future__ import annotations

from typing import Any

from crewlet.events.types.notification import coalesced_trigger_id
from eventstore.questions import deliveries as d
from eventstore.questions.turns import OUTCOME_OK, OUTCOME_RUNNING, TURN_STARTED

DELIVERY = "gh-delivery-1"


def _row(n: int, type_: str, *, seat: str = "", turn_id: str = "", category: str = "notification", **body: Any) -> dict[str, Any]:
    return {
        "id": f"ev-{n}",
        "ts_us": n,
        "timestamp": f"2026-01-01T00:00:{n:02d}.000000Z",
        "type": type_,
        "category": category,
        "node": "node-a",
        "source": "github",
        "trace_id": "t1",
        "seat": seat,
        "turn_id": turn_id,
        "body": body,
    }


def _accepted() -> dict[str, Any]:
    return _row(1, "webhook:issues", category=d.ACCEPTED_CATEGORY, delivery_id=DELIVERY, event_name="issues")


def _wake(n: int, seat: str) -> dict[str, Any]:
    return _row(n, d.WAKE, seat=seat, delivery_id=DELIVERY, event_name="issues", why="assignee")


def _started(n: int, seat: str, turn_id: str, trigger: str) -> dict[str, Any]:
    return _row(n, TURN_STARTED, seat=seat, turn_id=turn_id, trigger_event_id=trigger)


def _turn(turn_id: str, seat: str, outcome: str) -> dict[str, Any]:
    return {"turn_id": turn_id, "seat": seat, "outcome": outcome, "started": "s", "ended": None, "duration_ms": None, "trace_id": "t1"}


def test_a_wake_behind_a_pause_is_waiting_and_held_by_the_pause() -> None:
    wake = _wake(2, "grace")
    live = {"grace": {"state": "paused", "reason": "maintenance", "paused_by": "ops", "turn_id": None, "queued": 2, "positions": {"ev-0": 1, wake["id"]: 2}}}
    folded = d.fold_delivery(DELIVERY, [_accepted(), wake], [], {}, live)
    assert folded is not None
    assert folded["state"] == d.WAITING
    assert folded["accepted"] == {"event_id": "ev-1", "timestamp": "2026-01-01T00:00:01.000000Z", "node": "node-a"}
    (seat,) = folded["seats"]
    assert seat["seat"] == "grace" and seat["why"] == "assignee"
    assert seat["waiting"]["held_by"] == {"kind": d.HELD_PAUSE, "reason": "maintenance", "by": "ops"}
    assert seat["waiting"]["position"] == 2 and seat["waiting"]["queued"] == 2


def test_a_wake_behind_a_running_turn_names_that_turn() -> None:
    live = {"grace": {"state": "queued", "reason": "", "turn_id": "turn-9", "queued": 1, "positions": {"ev-2": 1}}}
    folded = d.fold_delivery(DELIVERY, [_accepted(), _wake(2, "grace")], [], {}, live)
    assert folded is not None
    waiting = folded["seats"][0]["waiting"]
    assert waiting["behind_turn"] == "turn-9"
    assert waiting["held_by"] == {"kind": d.HELD_TURN, "reason": "", "by": "turn-9"}


def test_a_wake_merged_into_a_digest_is_coalesced_until_the_digest_turn_starts_then_worked() -> None:
    wake = _wake(2, "grace")
    ids = ["ev-0", wake["id"]]
    digest = _row(3, d.COALESCED, seat="grace", event_ids=ids)
    folded = d.fold_delivery(DELIVERY, [_accepted(), wake], [digest], {})
    assert folded is not None
    seat = folded["seats"][0]
    assert seat["state"] == d.COALESCED_STATE
    assert seat["coalesced"]["event_ids"] == ids and seat["coalesced"]["trigger_event_id"] == coalesced_trigger_id(ids)

    started = _started(4, "grace", "turn-1", coalesced_trigger_id(ids))
    running = d.fold_delivery(DELIVERY, [_accepted(), wake], [digest, started], {"turn-1": _turn("turn-1", "grace", OUTCOME_RUNNING)})
    assert running is not None and running["state"] == d.RUNNING
    worked = d.fold_delivery(DELIVERY, [_accepted(), wake], [digest, started], {"turn-1": _turn("turn-1", "grace", OUTCOME_OK)})
    assert worked is not None and worked["state"] == d.WORKED
    assert worked["seats"][0]["turn"]["turn_id"] == "turn-1" and worked["seats"][0]["turn"]["outcome"] == OUTCOME_OK
    assert [e["id"] for e in worked["events"]] == ["ev-1", "ev-2", "ev-3", "ev-4"]


def test_a_trigger_the_ledger_had_worked_reads_skipped_with_its_reason() -> None:
    wake = _wake(2, "grace")
    skip = _row(3, d.TRIGGER_SKIPPED, seat="grace", trigger_event_id=wake["id"], reason="already worked", detail="ledger")
    folded = d.fold_delivery(DELIVERY, [_accepted(), wake], [skip], {})
    assert folded is not None and folded["state"] == d.SKIPPED
    assert folded["seats"][0]["skip"] == {"event_id": "ev-3", "reason": "already worked", "detail": "ledger"}


def test_a_delivery_no_seat_took_reads_skipped_with_each_recipients_reason() -> None:
    skip = _row(2, d.NOTIFICATION_SKIPPED, delivery_id=DELIVERY, reason="no seat", detail="unknown login", recipient="@ghost")
    folded = d.fold_delivery(DELIVERY, [_accepted(), skip], [], {})
    assert folded is not None and folded["state"] == d.SKIPPED and folded["seats"] == []
    assert folded["skipped"][0]["reason"] == "no seat" and folded["skipped"][0]["recipient"] == "@ghost"


def test_a_wake_on_the_dead_letter_stream_reads_dead_lettered() -> None:
    wake = _wake(2, "grace")
    dead = {wake["id"]: {"ref": "7", "topic": "agent.grace.inbox", "deliveries": 25}}
    folded = d.fold_delivery(DELIVERY, [_accepted(), wake], [], {}, {}, dead)
    assert folded is not None and folded["state"] == d.DEAD_LETTERED
    assert folded["seats"][0]["dead_letter"]["deliveries"] == 25


def test_the_least_settled_seat_decides_the_delivery_state_and_no_row_is_no_delivery() -> None:
    a, b = _wake(2, "ada"), _wake(3, "grace")
    started = _started(4, "ada", "turn-1", a["id"])
    folded = d.fold_delivery(DELIVERY, [_accepted(), a, b], [started], {"turn-1": _turn("turn-1", "ada", OUTCOME_OK)})
    assert folded is not None
    assert [(s["seat"], s["state"]) for s in folded["seats"]] == [("ada", d.WORKED), ("grace", d.WAITING)]
    assert folded["state"] == d.WAITING
    accepted_only = d.fold_delivery(DELIVERY, [_accepted()], [], {})
    assert accepted_only is not None and accepted_only["state"] == d.ACCEPTED
    assert d.fold_delivery(DELIVERY, [], [], {}) is None


def _retry(n: int, seat: str, original: str, delivery: int) -> dict[str, Any]:
    return _row(n, d.RETRY, seat=seat, original_id=original, delivery=delivery, max_deliveries=25, retry_at=f"2026-01-01T00:01:{n:02d}.000000Z")


def test_a_wake_whose_turn_failed_waits_for_its_retry_with_the_delivery_it_spent_then_runs_again_or_is_dead_lettered() -> None:
    wake = _wake(2, "ada")
    failed = {"turn-1": _turn("turn-1", "ada", "failed")}
    tried = [_started(3, "ada", "turn-1", wake["id"]), _retry(4, "ada", wake["id"], 1)]
    folded = d.fold_delivery(DELIVERY, [_accepted(), wake], tried, failed)
    assert folded is not None and folded["state"] == d.WAITING
    (seat,) = folded["seats"]
    assert seat["waiting"]["retry"] == {"event_id": "ev-4", "delivery": 1, "max_deliveries": 25, "retry_at": "2026-01-01T00:01:04.000000Z"}
    assert seat["turn"]["turn_id"] == "turn-1" and seat["turn"]["outcome"] == "failed"  # the attempt that failed

    again = [*tried, _started(5, "ada", "turn-2", wake["id"])]
    turns = {**failed, "turn-2": _turn("turn-2", "ada", OUTCOME_RUNNING)}
    running = d.fold_delivery(DELIVERY, [_accepted(), wake], again, turns)
    assert running is not None and running["seats"][0]["state"] == d.RUNNING and running["seats"][0]["waiting"] is None

    dead = {wake["id"]: {"ref": "9", "topic": "agent.ada.inbox", "deliveries": 25}}
    buried = d.fold_delivery(DELIVERY, [_accepted(), wake], tried, failed, {}, dead)
    assert buried is not None and buried["seats"][0]["state"] == d.DEAD_LETTERED
    assert buried["seats"][0]["turn"]["turn_id"] == "turn-1"  # its last attempt, beside the letter


def test_a_retry_of_another_seats_copy_of_the_wake_does_not_move_this_seat() -> None:
    wake = _wake(2, "ada")
    started = _started(3, "ada", "turn-1", wake["id"])
    other = _retry(4, "grace", wake["id"], 3)
    folded = d.fold_delivery(DELIVERY, [_accepted(), wake], [started, other], {"turn-1": _turn("turn-1", "ada", OUTCOME_OK)})
    assert folded is not None and folded["seats"][0]["state"] == d.WORKED
