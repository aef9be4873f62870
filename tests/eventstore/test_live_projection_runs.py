"""A coding run on the live projection: the seat reads held (reason ``sandbox``) while a run works for it, its mail queued."""
from __future__ import annotations

from crewlet.events.types import (
    AgentSpawned,
    AgentTurnCompleted,
    AgentTurnStarted,
    ExternalNotification,
    SandboxClarificationRequested,
    SandboxRunAnswered,
    SandboxRunCompleted,
    SandboxRunStarted,
)
from eventstore.projection import LiveProjection
from seats_support import company
from tests.eventstore.test_live_projection import apply


def state(live: LiveProjection) -> tuple[str, str, int]:
    row = live.seat("ada")
    assert row is not None
    return row["state"], row["reason"], row["queued"]


def test_a_seat_reads_held_by_its_run_queues_its_mail_lets_go_while_the_run_asks_and_after_it_ends() -> None:
    live = LiveProjection(company=company)
    apply(live, AgentSpawned(seat="ada", reason="claimed"))
    apply(live, AgentTurnStarted(seat="ada", turn_id="t1"))
    apply(live, SandboxRunStarted(seat="ada", run_id="run-1", task="build"))
    assert state(live)[0] == "running"  # the launching turn still runs
    apply(live, AgentTurnCompleted(seat="ada", turn_id="t1"))
    assert state(live) == ("held", "sandbox", 0)
    apply(live, ExternalNotification(seat="ada", sender="grace", body="while you build"))
    assert state(live) == ("held", "sandbox", 1)  # it waits on the broker behind the run
    apply(live, SandboxClarificationRequested(seat="ada", run_id="run-1", question="which branch?"))
    assert state(live) == ("idle", "", 1)  # parked: the run holds nothing
    apply(live, SandboxRunAnswered(seat="ada", run_id="run-1", outcome="not_awaiting", route="operator"))
    assert state(live)[0] == "idle"  # an answer that resumed nothing holds nothing
    apply(live, SandboxRunAnswered(seat="ada", run_id="run-1", outcome="resumed", route="chat"))
    assert state(live) == ("held", "sandbox", 1)
    apply(live, SandboxRunCompleted(seat="ada", run_id="run-1", outcome="succeeded"))
    assert state(live) == ("idle", "", 1)
