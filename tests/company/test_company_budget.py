"""``budget`` at the top level and under ``seats[]``: read at load, refused in one line naming the field; its calendar windows."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from crewlet.company.budget import NO_BUDGET, Budget, window_of
from crewlet.company.fields import CompanyError
from crewlet.company.parse import parse_company

BASE: dict[str, Any] = {"org": "acme", "seats": [{"handle": "ada", "kind": "agent"}, {"handle": "grace", "kind": "human"}]}


def refused(**overrides: Any) -> str:
    with pytest.raises(CompanyError) as info:
        parse_company({**BASE, **overrides})
    return str(info.value)


def test_the_company_and_a_seat_each_name_their_own_ceilings_and_none_is_no_ceiling() -> None:
    org = parse_company({
        **BASE, "budget": {"tokens_per_day": 1000, "tokens_per_month": 20000},
        "seats": [{"handle": "ada", "kind": "agent", "budget": {"tokens_per_month": 500}}, {"handle": "bob", "kind": "agent"}],
    })
    assert org.budget == Budget(tokens_per_day=1000, tokens_per_month=20000)
    ada, bob = org.seats
    assert (ada.budget, ada.budget.capped, bob.budget, bob.budget.capped) == (Budget(0, 500), True, NO_BUDGET, False)
    assert parse_company(BASE).budget == NO_BUDGET


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"budget": {"tokens_per_day": -1}}, "budget.tokens_per_day=-1: must be a whole number of tokens from 0 (no ceiling) to 1_000_000_000_000"),
        ({"budget": {"tokens_per_day": 1.5}}, "budget.tokens_per_day=1.5: must be a whole number"),
        ({"budget": {"tokens_per_day": True}}, "budget.tokens_per_day=True: must be a whole number"),
        ({"budget": {"tokens_per_month": 10**13}}, "budget.tokens_per_month=10000000000000: must be a whole number"),
        ({"budget": {"tokens_per_week": 5}}, "budget.tokens_per_week"),
        ({"budget": "lots"}, "budget='lots': must be a mapping"),
        ({"budget": {"tokens_per_day": 50, "tokens_per_month": 10}}, "budget.tokens_per_day=50: must not exceed budget.tokens_per_month (10)"),
        (
            {"seats": [{"handle": "grace", "kind": "human", "budget": {"tokens_per_day": 5}}]},
            "seats[0].budget={'tokens_per_day': 5}: applies only to an agent seat",
        ),
        ({"seats": [{"handle": "ada", "kind": "agent", "budget": {"tokens_per_day": -2}}]}, "seats[0].budget.tokens_per_day=-2"),
    ],
)
def test_a_bad_budget_is_refused_naming_the_field_the_value_and_what_is_allowed(overrides: dict[str, Any], message: str) -> None:
    assert message in refused(**overrides)


def test_a_window_is_the_calendar_day_or_month_in_the_companys_zone_daylight_saving_included() -> None:
    late = datetime(2025, 3, 30, 21, 30, tzinfo=timezone.utc)  # 23:30 in Berlin on the day clocks went forward
    day = window_of("day", late, "Europe/Berlin")
    assert (day.label, day.starts_at.isoformat(), day.resets_at.isoformat()) == (
        "2025-03-30", "2025-03-29T23:00:00+00:00", "2025-03-30T22:00:00+00:00",  # a 23-hour day
    )
    new_year = window_of("month", datetime(2025, 12, 31, 23, 30, tzinfo=timezone.utc), "Europe/Berlin")
    assert (new_year.label, new_year.resets_at.isoformat()) == ("2026-01", "2026-01-31T23:00:00+00:00")
    utc = window_of("day", late, "UTC")
    assert (utc.label, utc.resets_at.isoformat()) == ("2025-03-30", "2025-03-31T00:00:00+00:00")
