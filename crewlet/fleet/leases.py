"""Leases as compare-and-set on rows with ``expires_at``: acquire, renew, release.

Each verb is ONE conditional statement, so the database serialises racing
nodes and exactly one wins: an UPDATE that only matches a row that is free
(no holder, or expired) or already the caller's, and an INSERT for a name
never leased before, whose primary key refuses the second inserter. The same
statements are correct on PostgreSQL (a concurrent UPDATE re-checks its
condition on the row it waited for) and SQLite (one writer at a time).

Time is the database's own (``Now()``) unless a caller passes ``now`` (a
test's fixed instant): nodes on different machines then never compare their
own clocks. A holder keeps a stricter deadline of its own — ``ttl_s`` from
when it SENT the renewal (:class:`LeaseClock`) — which can only be earlier
than the row's, so it stops working before anyone else may start.

These functions block; call them from the event loop through
:func:`crewlet.base.db.in_store`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any, Iterable, Optional, Union

from django.db import IntegrityError, models, transaction
from django.db.models import Case, ExpressionWrapper, F, Q, When
from django.db.models.functions import Now

from crewlet.models import DutyLease, Lease, NodeLease, SeatLease

#: The three kinds of lease (wire-free names: they select a table).
NODE = "node"
SEAT = "seat"
DUTY = "duty"

_MODELS: dict[str, type[Lease]] = {NODE: NodeLease, SEAT: SeatLease, DUTY: DutyLease}

Instant = Union[datetime, Any]  # a datetime, or the database's Now() expression


def model_of(kind: str) -> type[Lease]:
    """The table of lease ``kind`` (node, seat, duty)."""
    try:
        return _MODELS[kind]
    except KeyError:
        raise ValueError(f"unknown lease kind {kind!r}; known: {', '.join(_MODELS)}") from None


def _now(now: Optional[datetime]) -> Instant:
    return now if now is not None else Now()


def _until(ttl_s: float, now: Optional[datetime]) -> Instant:
    if now is not None:
        return now + timedelta(seconds=ttl_s)
    return ExpressionWrapper(Now() + timedelta(seconds=ttl_s), output_field=models.DateTimeField())


def _take(rows: Any, holder: str, ttl_s: float, now: Optional[datetime], **fields: Any) -> int:
    """The one conditional UPDATE behind every acquire: of ``rows``, take those free, expired or ``holder``'s own."""
    return int(rows.filter(Q(holder=holder) | Q(holder="") | Q(expires_at__lte=_now(now))).update(
        holder=holder,
        expires_at=_until(ttl_s, now),
        epoch=Case(When(holder=holder, then=F("epoch")), default=F("epoch") + 1),
        acquired_at=Case(When(holder=holder, then=F("acquired_at")), default=_now(now)),
        **fields,
    ))


def acquire(kind: str, name: str, holder: str, ttl_s: float, *, now: Optional[datetime] = None, **fields: Any) -> bool:
    """Take lease ``name`` for ``holder`` for ``ttl_s``; True when it is now ``holder``'s.

    Succeeds when the lease is free, expired or already ``holder``'s (then it
    is renewed). ``fields`` are written with it (a node lease's labels,
    protocol and store).
    """
    if not holder:
        raise ValueError("a lease needs a holder")
    model = model_of(kind)
    if _take(model.objects.filter(name=name), holder, ttl_s, now, **fields):
        return True
    try:
        with transaction.atomic(using="default"):
            model.objects.create(
                name=name, holder=holder, expires_at=_until(ttl_s, now), acquired_at=_now(now), epoch=1, **fields
            )
    except IntegrityError:
        return False  # another node holds it, or inserted it a moment before us
    return True


#: Names one statement of :func:`acquire_many` names at most (SQLite's bound on a statement's parameters).
_MANY_CHUNK = 500
#: ``expires_at`` of a row :func:`acquire_many` inserts free, before its UPDATE takes it: long past.
_NEVER_HELD = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)


def acquire_many(kind: str, names: Iterable[str], holder: str, ttl_s: float, *, now: Optional[datetime] = None) -> set[str]:
    """:func:`acquire` of every one of ``names`` in one transaction; returns those that are now ``holder``'s.

    A node taking its share of a company of thousands of seats would
    otherwise pay a statement and a commit per seat (on SQLite, a sync of the
    file each) before its last seat runs. Each lease is decided by the same
    condition as :func:`acquire`'s: a name never leased gets a free row (an
    insert another node's insert of the same name wins silently), then one
    UPDATE takes every row that is free, expired or already ``holder``'s,
    and the rows read back as ``holder``'s are the ones taken.
    """
    if not holder:
        raise ValueError("a lease needs a holder")
    wanted = list(dict.fromkeys(names))
    model = model_of(kind)
    taken: set[str] = set()
    for start in range(0, len(wanted), _MANY_CHUNK):
        chunk = wanted[start:start + _MANY_CHUNK]
        with transaction.atomic(using="default"):
            known = set(model.objects.filter(name__in=chunk).values_list("name", flat=True))
            model.objects.bulk_create(
                [model(name=n, holder="", expires_at=_NEVER_HELD, acquired_at=_NEVER_HELD) for n in chunk if n not in known],
                ignore_conflicts=True,
            )
            _take(model.objects.filter(name__in=chunk), holder, ttl_s, now)
            taken |= set(
                model.objects.filter(name__in=chunk, holder=holder, expires_at__gt=_now(now)).values_list("name", flat=True)
            )
    return taken


def renew(kind: str, names: Iterable[str], holder: str, ttl_s: float, *, now: Optional[datetime] = None) -> set[str]:
    """Extend every one of ``names`` that ``holder`` still holds; returns those it still holds.

    Strict: a lease that expired is not renewed even if nobody took it yet
    (its holder has already stopped trusting it; it may take it again with
    :func:`acquire`).
    """
    wanted = list(names)
    if not wanted:
        return set()
    model = model_of(kind)
    still = model.objects.filter(name__in=wanted, holder=holder, expires_at__gt=_now(now))
    still.update(expires_at=_until(ttl_s, now))
    return set(
        model.objects.filter(name__in=wanted, holder=holder, expires_at__gt=_now(now)).values_list("name", flat=True)
    )


def release(kind: str, names: Iterable[str], holder: str, *, now: Optional[datetime] = None) -> int:
    """Give up ``holder``'s leases among ``names`` at once (another node may take them now); how many it held."""
    wanted = list(names)
    if not wanted:
        return 0
    return model_of(kind).objects.filter(name__in=wanted, holder=holder).update(holder="", expires_at=_now(now))


def release_held(kind: str, names: Iterable[str], holder: str, *, now: Optional[datetime] = None) -> set[str]:
    """:func:`release` in one transaction, returning which of ``names`` ``holder`` held (what a log names)."""
    wanted = list(names)
    if not wanted:
        return set()
    with transaction.atomic(using="default"):
        held = set(model_of(kind).objects.filter(name__in=wanted, holder=holder).values_list("name", flat=True))
        release(kind, sorted(held), holder, now=now)
    return held


def holders(kind: str, *, names: Optional[Iterable[str]] = None, now: Optional[datetime] = None) -> dict[str, str]:
    """The live (unexpired, held) leases of ``kind``: name -> holder, optionally among ``names``."""
    rows = model_of(kind).objects.filter(expires_at__gt=_now(now)).exclude(holder="")
    if names is not None:
        rows = rows.filter(name__in=list(names))
    return dict(rows.values_list("name", "holder"))


def holder_of(kind: str, name: str, *, now: Optional[datetime] = None) -> str:
    """Who holds lease ``name`` right now ("" when nobody does)."""
    return holders(kind, names=[name], now=now).get(name, "")


def prune(kind: str, *, older_than_s: float, now: Optional[datetime] = None) -> int:
    """Delete leases of ``kind`` that expired more than ``older_than_s`` ago (retention of the coordination tables)."""
    model = model_of(kind)
    if now is not None:
        cutoff: Instant = now - timedelta(seconds=older_than_s)
    else:
        cutoff = ExpressionWrapper(Now() - timedelta(seconds=older_than_s), output_field=models.DateTimeField())
    deleted, _ = model.objects.filter(expires_at__lte=cutoff).delete()
    return deleted


def prune_all(*, older_than_s: float, now: Optional[datetime] = None) -> int:
    """:func:`prune` every kind: departed nodes, removed seats and old duties leave no row behind for ever."""
    return sum(prune(kind, older_than_s=older_than_s, now=now) for kind in _MODELS)


@dataclass
class LeaseClock:
    """A holder's own view of how long its leases are good: ``ttl_s`` from when it last SENT a renewal.

    The row's ``expires_at`` is set by the database after the request
    arrives, so this deadline is never later than the row's: a holder that
    stops at its own deadline has stopped before any other node may start.
    """

    ttl_s: float
    clock: Any = field(default=time.monotonic)
    _deadline: float = 0.0

    def sending(self) -> float:
        """The instant a renewal is sent (pass it to :meth:`renewed` when it succeeded)."""
        return float(self.clock())

    def renewed(self, sent_at: float) -> None:
        self._deadline = max(self._deadline, sent_at + self.ttl_s)

    def valid(self) -> bool:
        return self.clock() < self._deadline

    def remaining_s(self) -> float:
        return max(0.0, self._deadline - float(self.clock()))


__all__ = [
    "DUTY",
    "NODE",
    "SEAT",
    "LeaseClock",
    "acquire",
    "acquire_many",
    "holder_of",
    "holders",
    "model_of",
    "prune",
    "prune_all",
    "release",
    "release_held",
    "renew",
]
