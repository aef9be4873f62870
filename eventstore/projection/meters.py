"""The token budgets as the live projection shows them: the latest ``budget_meters`` report, and whom it holds.

Every node publishes the fleet's shared counters on a tick and at once when
a window first turns work away (:mod:`seats.budget`); the counts are the
coordination store's, so whichever node's report came last is the company's,
and it supersedes the one before. A seat reads ``stopped``/``budget`` from
the windows themselves: refused by the budget (``budget_exhausted``) and
still under a window this report calls exhausted — the company's or its
own. A window that reset or whose ceiling was raised releases it on the
next report, without waiting for a turn.
"""
from __future__ import annotations

from typing import Any, Optional

from crewlet.company.budget import BUDGET_KEY, PERIOD_DAY, SCOPE_COMPANY, TOKENS_PER_DAY, TOKENS_PER_MONTH
from crewlet.company.org import Organization
from crewlet.events import Event, format_timestamp
from crewlet.events.types import METER_EXHAUSTED, METER_KEYS

#: The snapshot's key for the budgets, and its parts.
K_BUDGETS = "budgets"


def _window(raw: Any) -> Optional[dict[str, Any]]:
    """One reported window with exactly the meter keys, or None for an entry this build cannot read."""
    if not isinstance(raw, dict) or not all(k in raw for k in METER_KEYS):
        return None
    return {k: raw[k] for k in METER_KEYS}


def ceiling_key(window: dict[str, Any]) -> str:
    """The company-file key that raises ``window``'s ceiling: ``budget.tokens_per_day``, ``seats[ada].budget...``."""
    leaf = TOKENS_PER_DAY if window["period"] == PERIOD_DAY else TOKENS_PER_MONTH
    owner = BUDGET_KEY if window["scope"] == SCOPE_COMPANY else f"seats[{window['seat']}].{BUDGET_KEY}"
    return f"{owner}.{leaf}"


class Meters:
    """The latest report's windows (none until one arrives), read under the projection's lock."""

    def __init__(self) -> None:
        self.windows: list[dict[str, Any]] = []
        self.reported_at = ""
        self.reported = False

    def update(self, event: Event) -> None:
        raw = event.field("windows")
        self.windows = [w for w in (_window(r) for r in (raw if isinstance(raw, list) else [])) if w is not None]
        self.reported_at = format_timestamp(event.timestamp)
        self.reported = True

    def holding(self, handle: str) -> list[dict[str, Any]]:
        """The exhausted windows that refuse ``handle``'s calls: the company's and its own."""
        return [
            w for w in self.windows
            if w["state"] == METER_EXHAUSTED and (w["scope"] == SCOPE_COMPANY or w["seat"] == handle)
        ]

    def still_stopped(self, handle: str) -> bool:
        """Whether a seat the budget refused still reads ``stopped``: until a report shows no spent window over it."""
        return not self.reported or bool(self.holding(handle))

    def view(self, org: Organization) -> dict[str, Any]:
        """``{"windows": [...], "held": [{"seat", "windows": [... + "raise"]}], "reported_at"}`` for a page."""
        held = []
        for seat in org.agent_seats():
            spent = self.holding(seat.handle)
            if spent:
                held.append({"seat": seat.handle, "windows": [{**w, "raise": ceiling_key(w)} for w in spent]})
        return {"windows": [dict(w) for w in self.windows], "held": held, "reported_at": self.reported_at}


__all__ = ["K_BUDGETS", "Meters", "ceiling_key"]
