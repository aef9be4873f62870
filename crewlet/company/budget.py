"""Token budgets: the company file's ``budget`` (top level and ``seats[].budget``) and the calendar windows it caps.

A budget is a ceiling of tokens per calendar **day** and per calendar
**month**, read in the company's ``timezone`` (so a company in Berlin gets
a fresh day at Berlin's midnight, not UTC's). A window is named by its label
(``2025-06-01`` for a day, ``2025-06`` for a month) and ends at
``resets_at``, the next local midnight or first of the month; a new window is
a new count, so nothing has to be reset. 0, or a key left out, is no
ceiling. What is counted, where, and what a refused call does is
:mod:`seats.budget`; this module is only the file's keys and the calendar.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any, Optional, Sequence, TypeVar
from zoneinfo import ZoneInfo

from pydantic import ValidationInfo, model_validator

from crewlet.company.fields import CompanyError
from crewlet.company.shape import FileModel, read_section, where, words

#: The company-file key, at the top level and under ``seats[]``.
BUDGET_KEY = "budget"
TOKENS_PER_DAY = "tokens_per_day"
TOKENS_PER_MONTH = "tokens_per_month"
BUDGET_KEYS = (TOKENS_PER_DAY, TOKENS_PER_MONTH)
#: The largest ceiling taken: a trillion tokens is past any real spend, and keeps every count in a 64-bit column.
MAX_TOKENS = 10**12

#: The calendar periods a budget caps (``budget_exhausted.period``).
PERIOD_DAY = "day"
PERIOD_MONTH = "month"
PERIODS = (PERIOD_DAY, PERIOD_MONTH)
#: Whose window it is (``budget_exhausted.scope``): the whole company's, or one seat's.
SCOPE_COMPANY = "company"
SCOPE_SEAT = "seat"


@dataclass(frozen=True)
class Budget:
    """Ceilings in tokens (input + output, as billed) per calendar day and month; 0 = no ceiling."""

    tokens_per_day: int = 0
    tokens_per_month: int = 0

    def ceiling(self, period: str) -> int:
        return self.tokens_per_day if period == PERIOD_DAY else self.tokens_per_month

    @property
    def capped(self) -> bool:
        return bool(self.tokens_per_day or self.tokens_per_month)


NO_BUDGET = Budget()


@dataclass(frozen=True)
class Window:
    """One calendar window of ``period`` in a zone: its label, and when it ends (UTC)."""

    period: str
    label: str
    starts_at: datetime
    resets_at: datetime


def window_of(period: str, at: datetime, zone: str) -> Window:
    """The ``period`` window holding the instant ``at``, read in ``zone`` (an IANA name the company file validated)."""
    local = at.astimezone(ZoneInfo(zone))
    day = local.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)
    if period == PERIOD_DAY:
        start, label = day, day.strftime("%Y-%m-%d")
        following = (day + timedelta(days=1, hours=3)).replace(hour=0)  # wall-clock arithmetic; 3h clears any DST shift
    elif period == PERIOD_MONTH:
        start, label = day.replace(day=1), day.strftime("%Y-%m")
        following = (start + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown budget period {period!r}; one of {', '.join(PERIODS)}")
    # Attach the zone afresh: the offset at the boundary is the boundary's own (a DST change mid-window).
    tz = ZoneInfo(zone)
    start = start.replace(tzinfo=None).replace(tzinfo=tz)
    following = following.replace(tzinfo=None).replace(tzinfo=tz)
    return Window(period, label, start.astimezone(dt_timezone.utc), following.astimezone(dt_timezone.utc))


#: What a ceiling takes, said for a value of any wrong type or past the range alike.
TOKENS_RULE = f"must be a whole number of tokens from 0 (no ceiling) to {MAX_TOKENS:_}"


class BudgetFile(FileModel):
    """A ``budget`` section's shape: two ceilings, the day's no larger than the month's when both are set."""

    tokens_per_day: int = words(0, TOKENS_RULE, ge=0, le=MAX_TOKENS)
    tokens_per_month: int = words(0, TOKENS_RULE, ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _day_within_month(self, info: ValidationInfo) -> BudgetFile:
        day, month = self.tokens_per_day, self.tokens_per_month
        if day and month and day > month:
            name, source = where(info)
            raise CompanyError(f"{name}.{TOKENS_PER_DAY}", day, f"must not exceed {name}.{TOKENS_PER_MONTH} ({month})", source)
        return self


def parse_budget(value: Any, name: str, source: Optional[str]) -> Budget:
    """``{tokens_per_day, tokens_per_month}``: whole numbers from 0 (no ceiling) to :data:`MAX_TOKENS`."""
    if value is None:
        return NO_BUDGET
    body = read_section(BudgetFile, value, name, source)
    return Budget(tokens_per_day=body.tokens_per_day, tokens_per_month=body.tokens_per_month)


S = TypeVar("S")


def seat_budgets(seats_raw: Any, seats: Sequence[S], source: Optional[str]) -> list[S]:
    """Each seat with its own ``budget`` (agent seats only: a person runs no turns), over what the seat step read."""
    out: list[S] = []
    raw = seats_raw if isinstance(seats_raw, list) else []
    for i, seat in enumerate(seats):
        entry = raw[i] if i < len(raw) and isinstance(raw[i], dict) else {}
        if entry.get(BUDGET_KEY) is None:
            out.append(seat)
            continue
        name = f"seats[{i}].{BUDGET_KEY}"
        if not getattr(seat, "is_agent", False):
            raise CompanyError(name, entry[BUDGET_KEY], "applies only to an agent seat (a person runs no turns)", source)
        out.append(dataclasses.replace(seat, budget=parse_budget(entry[BUDGET_KEY], name, source)))  # type: ignore[type-var]  # a Seat dataclass
    return out


__all__ = [
    "BUDGET_KEY",
    "BUDGET_KEYS",
    "Budget",
    "MAX_TOKENS",
    "NO_BUDGET",
    "PERIODS",
    "PERIOD_DAY",
    "PERIOD_MONTH",
    "SCOPE_COMPANY",
    "SCOPE_SEAT",
    "TOKENS_PER_DAY",
    "TOKENS_PER_MONTH",
    "Window",
    "parse_budget",
    "seat_budgets",
    "window_of",
]
