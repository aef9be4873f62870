"""The coordination-store verbs routing needs, sync and awaitable.

Every function here is a short statement against ``default``; the ``a*``
twins run it off the event loop (``sync_to_async``, thread-sensitive) and
close a connection the database dropped so the next call reconnects — the
engine is a long-running process with no request cycle to do it.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Optional, TypeVar

from django.db import connections, router
from django.utils import timezone

from crewlet.db import in_store as shared_in_store

from notifications.models import RateCounter, SeenDelivery, ThreadFollow

log = logging.getLogger("crewlet.notifications.store")

T = TypeVar("T")

#: How long a dedupe key is remembered: far past any vendor's retry schedule
#: (Slack retries for minutes, GitHub and Atlassian for hours at most).
SEEN_KEEP_S = 7 * 86400.0
#: How long a rate window row is kept after it closed.
RATE_KEEP_S = 3600.0
#: A thread nobody was woken in for this long is no longer followed.
FOLLOW_KEEP_S = 90 * 86400.0
KEY_MAX = 400


in_store = shared_in_store  # re-exported: callers import it from here


def claim(key: str, event_id: str) -> bool:
    """Claim a dedupe key for ``event_id``; False when ANOTHER event claimed it first.

    True both when the key is new and when this same event claimed it before:
    the latter is a broker redelivery of a delivery whose routing died half
    way, and it must be routed again rather than dropped.
    """
    row, created = SeenDelivery.objects.get_or_create(key=key[:KEY_MAX], defaults={"event_id": event_id[:64]})
    return created or row.event_id == event_id[:64]


def followers(conversation: str) -> list[str]:
    """The handles of every seat following ``conversation``."""
    if not conversation:
        return []
    return list(
        ThreadFollow.objects.filter(conversation=conversation[:512]).order_by("seat").values_list("seat", flat=True)
    )


def follow(seat: str, conversation: str, source: str = "", *, now: Optional[datetime] = None) -> None:
    """Record that ``seat`` was woken in ``conversation`` (idempotent; refreshes the clock)."""
    if not conversation:
        return
    at = now or timezone.now()
    ThreadFollow.objects.update_or_create(
        seat=seat, conversation=conversation[:512], defaults={"source": source, "last_woken_at": at}
    )


def rate_hit(seat: str, window_start: int) -> int:
    """Count one wake for ``seat`` in the window; returns the window's count including it.

    One atomic upsert (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``, on
    PostgreSQL and on SQLite >= 3.35), so two nodes counting at once land on
    the same row and neither loses the other's hit.
    """
    table = RateCounter._meta.db_table
    alias = router.db_for_write(RateCounter) or "default"
    sql = (
        f"INSERT INTO {table} (seat, window_start, count) VALUES (%s, %s, 1) "
        f"ON CONFLICT (seat, window_start) DO UPDATE SET count = {table}.count + 1 RETURNING count"
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [seat, int(window_start)])
        row = cursor.fetchone()
    return int(row[0]) if row else 1


def prune(*, now: Optional[datetime] = None) -> dict[str, int]:
    """Forget old dedupe keys, closed rate windows and cold follows; returns rows deleted per table."""
    at = now or timezone.now()
    seen, _ = SeenDelivery.objects.filter(seen_at__lt=at - timedelta(seconds=SEEN_KEEP_S)).delete()
    rate, _ = RateCounter.objects.filter(window_start__lt=int(at.timestamp() - RATE_KEEP_S)).delete()
    follows, _ = ThreadFollow.objects.filter(last_woken_at__lt=at - timedelta(seconds=FOLLOW_KEEP_S)).delete()
    return {"seen": seen, "rate": rate, "follows": follows}


aclaim = in_store(claim)
afollowers = in_store(followers)
afollow = in_store(follow)
arate_hit = in_store(rate_hit)
aprune = in_store(prune)

__all__ = [
    "FOLLOW_KEEP_S",
    "RATE_KEEP_S",
    "SEEN_KEEP_S",
    "aclaim",
    "afollow",
    "afollowers",
    "aprune",
    "arate_hit",
    "claim",
    "follow",
    "followers",
    "in_store",
    "prune",
    "rate_hit",
]
