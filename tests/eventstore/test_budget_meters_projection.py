"""The live projection reads ``budget_meters``: a seat the budget refused reads stopped while a spent window holds it."""
from __future__ import annotations

from typing import Any

from crewlet import events
from crewlet.events.tracing import Trace
from crewlet.events.types import AgentSpawned, AgentTurnCompleted, BudgetExhausted, BudgetMeters
from crewlet.queue import topics
from eventstore.projection import LiveProjection
from seats_support import company


def window(scope: str, seat: str, spend: int, ceiling: int, label: str = "2025-06-01") -> dict[str, Any]:
    return {
        "scope": scope, "seat": seat, "period": "day", "window": label, "resets_at": "2025-06-01T22:00:00.000000Z",
        "spend": spend, "ceiling": ceiling, "state": "exhausted" if spend >= ceiling else "open",
    }


def apply(live: LiveProjection, body: Any) -> Any:
    event = events.new(body, Trace.root())
    return live.apply(topics.event(event.type), event)


def test_a_refused_seat_reads_stopped_while_its_window_is_spent_and_idle_once_a_report_shows_it_open() -> None:
    org = company()
    live = LiveProjection(company=lambda: org)
    apply(live, AgentSpawned(seat="ada"))
    apply(live, BudgetExhausted(seat="ada", turn_id="t1", scope="seat", period="day", window="2025-06-01", spend=12, ceiling=10))
    apply(live, AgentTurnCompleted(seat="ada", turn_id="t1", failed=True, error="seat ada's day budget for 2025-06-01 is spent"))
    ada = live.seat("ada")
    assert (ada["state"], ada["reason"]) == ("stopped", "budget") and "day budget" in ada["last_error"]  # no report yet

    apply(live, BudgetMeters(windows=[window("seat", "ada", 12, 10), window("company", "", 12, 100)], trigger="refusal"))
    assert live.seat("ada")["state"] == "stopped"
    budgets = live.snapshot()["budgets"]
    assert [(w["scope"], w["state"]) for w in budgets["windows"]] == [("seat", "exhausted"), ("company", "open")]
    [held] = budgets["held"]
    assert held["seat"] == "ada" and [w["raise"] for w in held["windows"]] == ["seats[ada].budget.tokens_per_day"]

    apply(live, BudgetMeters(windows=[window("seat", "ada", 12, 1000), window("company", "", 12, 100)], trigger="tick"))
    assert (live.seat("ada")["state"], live.snapshot()["budgets"]["held"]) == ("idle", [])


def test_a_spent_company_window_holds_every_agent_seat_and_names_the_company_key_that_releases_them() -> None:
    live = LiveProjection(company=company)
    apply(live, BudgetMeters(windows=[window("company", "", 50, 50), {"scope": "odd"}], trigger="tick"))
    held = live.snapshot()["budgets"]["held"]
    assert [h["seat"] for h in held] == ["ada", "linus"]  # grace is a person
    assert {w["raise"] for h in held for w in h["windows"]} == {"budget.tokens_per_day"}
    assert len(live.snapshot()["budgets"]["windows"]) == 1  # an entry this build cannot read is left out


def test_the_overview_lists_every_window_and_each_held_seat_with_what_would_release_it() -> None:
    from django.template.loader import render_to_string

    live = LiveProjection(company=company)
    apply(live, BudgetMeters(windows=[window("seat", "ada", 12, 10), window("company", "", 12, 100)], trigger="tick"))
    html = render_to_string("dashboard/overview.html", {"org": company(), "live": live.snapshot(), "counters": [], "page": "overview"})
    assert '<tr data-budget="seat:ada:day">' in html and '<tr data-budget="company::day">' in html
    assert '<li data-held="ada">' in html and "<code>seats[ada].budget.tokens_per_day</code> above 12" in html
    assert 'data-held="linus"' not in html
