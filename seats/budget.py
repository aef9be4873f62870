"""Token budgets that pause and ask: the count, the check before each model call, the hold, the meters.

Every model call a turn makes is charged, as the vendor billed it
(:func:`billed_tokens`), to four calendar windows in the coordination store
(:class:`~seats.budget_models.TokenUsage`): the seat's day and month and the
company's day and month, read in the company's ``timezone``
(:func:`crewlet.company.budget.window_of`). Counted always, capped or not, so
a ceiling added mid-day starts from what the day already spent, and counted
on the store every node shares, so the company's day is one number across
the fleet.

Before each round's model call a seat with a ceiling over it — its own
``budget`` or the company's — is checked: a window whose spend has reached
its ceiling refuses the call. The call that crosses a ceiling is not cut
short, so a window can close above its ceiling by what the calls in flight
at that moment spent. A refused call ends the turn with ``budget_exhausted``
(the refusing window: the exhausted one that resets last, which is what
decides when work can resume) and puts the seat under a budget **hold**: its
inbox fetches nothing, so its mail waits on the broker, in order, with its
deliveries intact (nothing is dead-lettered). The refused turn's own
trigger goes back to the head of the inbox (a defer), unless the turn had
already written (then it is abandoned like any turn that broke after a
write).

A hold lifts when the seat's windows no longer refuse: its refusing window
reset (a new day or month is a new count), or a config revision raised or
removed the ceiling. :meth:`BudgetKeeper.review` asks that at every
meters tick and at every applied revision, so a raise runs the held mail
at once and a reset within one tick. A node that takes a seat asks the
store before attaching its inbox (:meth:`BudgetKeeper.screen`), so a held
seat stays held when it moves.

``budget_meters`` reports every capped window with its state, on the tick and
at once when a window first turns work away on this node. A coordination
store that cannot be read for the check is logged and the call goes ahead:
an outage of the store is not a reason to stop every seat's work.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Awaitable, Callable, Iterable, Optional

from django.db import DatabaseError, transaction
from django.db.models import F, Q

from crewlet.base.db import in_store
from crewlet.base.logfmt import short_reason
from crewlet.company.budget import NO_BUDGET, PERIODS, SCOPE_COMPANY, SCOPE_SEAT, Budget, window_of
from crewlet.company.conf import BUDGET_METERS_EVERY_S
from crewlet.company.org import CompanyHolder, Organization, Seat
from crewlet.events import format_timestamp
from crewlet.events.types import (
    METER_EXHAUSTED,
    METER_OPEN,
    METERS_ON_REFUSAL,
    METERS_ON_TICK,
    BudgetExhausted,
    BudgetMeters,
)
from seats.budget_models import TokenUsage
from seats.provider_base import Completion

log = logging.getLogger("crewlet.seats.budget")

#: How often each node reports the meters and looks at its held seats again (``node.budget_meters_every_s``).
METERS_EVERY_S = BUDGET_METERS_EVERY_S
#: How many windows that turned work away a node remembers (so each is reported at once only the first time).
TURNED_AWAY_KEEP = 1024
#: How long a window's row is kept: past the longest window (a month) by far, for the spend screens.
USAGE_KEEP_S = 400 * 86400.0


@dataclass(frozen=True)
class Meter:
    """One window's count beside its ceiling (0: none) — what ``budget_meters`` lists and ``budget_exhausted`` names."""

    scope: str
    seat: str
    period: str
    window: str
    resets_at: datetime
    spend: int
    ceiling: int

    @property
    def exhausted(self) -> bool:
        return bool(self.ceiling) and self.spend >= self.ceiling

    @property
    def key(self) -> tuple[str, str, str]:
        return scope_key(self.scope, self.seat), self.period, self.window

    def wire(self) -> dict[str, Any]:
        """Its ``budget_meters.windows[]`` entry (:data:`~crewlet.events.types.METER_KEYS`)."""
        return {
            "scope": self.scope,
            "seat": self.seat,
            "period": self.period,
            "window": self.window,
            "resets_at": format_timestamp(self.resets_at),
            "spend": self.spend,
            "ceiling": self.ceiling,
            "state": METER_EXHAUSTED if self.exhausted else METER_OPEN,
        }

    def reason(self) -> str:
        """A refusal in words: the seat's ``last_error``."""
        whose = "the company's" if self.scope == SCOPE_COMPANY else f"seat {self.seat}'s"
        return (
            f"{whose} {self.period} budget for {self.window} is spent ({self.spend} of {self.ceiling} tokens); "
            f"it resets at {format_timestamp(self.resets_at)}"
        )

    def exhausted_body(self, tags: Any) -> BudgetExhausted:
        """``budget_exhausted`` for a turn (``tags``: its seat and turn), naming this window."""
        return BudgetExhausted(
            **tags, scope=self.scope, period=self.period, window=self.window,
            resets_at=format_timestamp(self.resets_at), spend=self.spend, ceiling=self.ceiling,
        )


def scope_key(scope: str, seat: str) -> str:
    """The counter's ``scope`` column: ``company``, or ``seat:<handle>``."""
    return SCOPE_COMPANY if scope == SCOPE_COMPANY else f"{SCOPE_SEAT}:{seat}"


def billed_tokens(answer: Completion) -> int:
    """What one model call is charged: its input and output tokens as the vendor reported them."""
    return max(int(answer.input_tokens), 0) + max(int(answer.output_tokens), 0)


def _windows(org: Organization, seat: Optional[Seat], now: datetime, handle: str = "") -> list[tuple[str, str, Budget, str, Any]]:
    """(scope, seat, budget, period, window) for the company's windows and, given one, ``seat``'s (or ``handle``'s)."""
    owners = [(SCOPE_COMPANY, "", org.budget)]
    if seat is not None or handle:
        owners.append((SCOPE_SEAT, seat.handle, seat.budget) if seat is not None else (SCOPE_SEAT, handle, NO_BUDGET))
    return [(scope, handle, budget, p, window_of(p, now, org.timezone)) for scope, handle, budget in owners for p in PERIODS]


def _counts(keys: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str, str], int]:
    wanted = list(keys)
    if not wanted:
        return {}
    match = Q()
    for scope, period, window in wanted:
        match |= Q(scope=scope, period=period, window=window)
    return {(r.scope, r.period, r.window): r.tokens for r in TokenUsage.objects.filter(match)}


def charge(org: Organization, handle: str, tokens: int, now: datetime) -> None:
    """Add ``tokens`` to the seat's and the company's current day and month: one increment each, in one transaction."""
    if tokens <= 0:
        return
    keys = [(scope_key(scope, who), period, w.label) for scope, who, _b, period, w in _windows(org, None, now, handle)]
    with transaction.atomic():
        TokenUsage.objects.bulk_create(
            [TokenUsage(scope=s, period=p, window=w, tokens=0, updated_at=now) for s, p, w in keys], ignore_conflicts=True
        )
        match = Q()
        for s, p, w in keys:
            match |= Q(scope=s, period=p, window=w)
        TokenUsage.objects.filter(match).update(tokens=F("tokens") + tokens, updated_at=now)


def meters(org: Organization, now: datetime, seat: Optional[Seat] = None) -> list[Meter]:
    """Every capped window (the company's and each agent seat's, or ``seat``'s and the company's) with its spend."""
    seats = [seat] if seat is not None else list(org.agent_seats())
    rows = [w for s in seats for w in _windows(org, s, now) if w[0] == SCOPE_SEAT] + _windows(org, None, now)
    capped = [(scope, who, budget.ceiling(period), period, w) for scope, who, budget, period, w in rows if budget.ceiling(period)]
    counts = _counts((scope_key(scope, who), period, w.label) for scope, who, _c, period, w in capped)
    return [
        Meter(scope, who, period, w.label, w.resets_at, counts.get((scope_key(scope, who), period, w.label), 0), ceiling)
        for scope, who, ceiling, period, w in capped
    ]


def refusal(org: Organization, seat: Seat, now: datetime) -> Optional[Meter]:
    """The window that refuses ``seat``'s next call — of the exhausted ones, the one that resets last — or None."""
    if not (org.budget.capped or seat.budget.capped):
        return None
    spent = [m for m in meters(org, now, seat) if m.exhausted]
    return max(spent, key=lambda m: m.resets_at) if spent else None


def prune(*, now: datetime, older_than_s: float = USAGE_KEEP_S) -> int:
    deleted, _ = TokenUsage.objects.filter(updated_at__lt=now - timedelta(seconds=older_than_s)).delete()
    return deleted


acharge = in_store(charge)
ameters = in_store(meters)
arefusal = in_store(refusal)
aprune = in_store(prune)


class BudgetKeeper:
    """One node's side of the budgets: the check and the charge a turn makes, the seats it holds, the meters it reports.

    ``clock`` is the instant the windows are read at (tests move it across a
    midnight); ``emit`` publishes (the seat runtime's telemetry emitter).
    ``held`` is this node's holds: seat -> the window that refused it.
    """

    def __init__(self, holder: CompanyHolder, *, clock: Callable[[], datetime], emit: Callable[[Any], Awaitable[None]]) -> None:
        self.holder = holder
        self.clock = clock
        self.emit = emit
        self.held: dict[str, Meter] = {}
        self._turned_away: set[tuple[str, str, str]] = set()

    def holding(self, handle: str) -> bool:
        return handle in self.held

    async def refuse(self, seat: Seat) -> Optional[Meter]:
        """Before a model call: the window that refuses it (the seat is then held), or None to go ahead."""
        org = self.holder.current()
        try:
            found = await arefusal(org, seat, self.clock())
        except DatabaseError as exc:
            log.error("budget_check_failed", extra={"seat": seat.handle, "error": short_reason(exc)})
            return None
        if found is None:
            return None
        self.held[seat.handle] = found
        log.warning("budget_refused", extra={"seat": seat.handle, "scope": found.scope, "period": found.period, "window": found.window})
        if found.key not in self._turned_away:  # the first time this window turns work away here: report at once
            if len(self._turned_away) >= TURNED_AWAY_KEEP:
                self._turned_away.clear()  # past windows: at worst one more immediate report
            self._turned_away.add(found.key)
            await self.publish(METERS_ON_REFUSAL)
        return found

    async def charge(self, seat: Seat, answer: Completion) -> None:
        """After a model call: what it billed, on the fleet's counters; a store that cannot take it is logged, not fatal."""
        try:
            await acharge(self.holder.current(), seat.handle, billed_tokens(answer), self.clock())
        except DatabaseError as exc:
            log.error("budget_charge_failed", extra={"seat": seat.handle, "tokens": billed_tokens(answer), "error": short_reason(exc)})

    async def screen(self, handle: str) -> bool:
        """Whether a seat this node is about to attach is held by a spent window (its hold is then this node's too)."""
        seat = self.holder.current().seat_by_handle(handle)
        if seat is None:
            return False
        try:
            found = await arefusal(self.holder.current(), seat, self.clock())
        except DatabaseError:
            return False
        if found is not None:
            self.held[handle] = found
        return found is not None

    async def review(self) -> list[str]:
        """Lift the holds whose seats no window refuses any more (a reset, a raised ceiling); the seats released."""
        released = []
        org = self.holder.current()
        for handle in list(self.held):
            seat = org.seat_by_handle(handle)
            try:
                still = await arefusal(org, seat, self.clock()) if seat is not None else None
            except DatabaseError as exc:
                log.warning("budget_review_failed", extra={"seat": handle, "error": short_reason(exc)})
                continue
            if still is None:
                del self.held[handle]
                released.append(handle)
                log.info("budget_hold_lifted", extra={"seat": handle})
            else:
                self.held[handle] = still
        return released

    async def publish(self, trigger: str = METERS_ON_TICK) -> None:
        """``budget_meters``: every capped window of the company with its state (nothing when nothing is capped)."""
        org = self.holder.current()
        if not (org.budget.capped or any(s.budget.capped for s in org.agent_seats())):
            return
        try:
            found = await ameters(org, self.clock())
        except DatabaseError as exc:
            log.warning("budget_meters_unavailable", extra={"error": short_reason(exc)})
            return
        await self.emit(BudgetMeters(windows=[m.wire() for m in found], trigger=trigger))

    async def prune(self) -> int:
        return await aprune(now=self.clock())


__all__ = [
    "BudgetKeeper",
    "METERS_EVERY_S",
    "Meter",
    "USAGE_KEEP_S",
    "acharge",
    "ameters",
    "arefusal",
    "billed_tokens",
    "charge",
    "meters",
    "refusal",
    "scope_key",
]
