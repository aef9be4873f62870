"""The coordination-store verbs routing needs, sync and awaitable.

Every function here is a short statement against ``default``; the ``a*``
twins run it off the event loop (``sync_to_async``, thread-sensitive) and
close a connection the database dropped so the next call reconnects — the
engine is a long-running process with no request cycle to do it.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import NamedTuple, Optional, Sequence, TypeVar

from django.db import connections, router
from django.utils import timezone

from crewlet.base.db import in_store

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


def claim(key: str, event_id: str) -> bool:
    """Claim a dedupe key for ``event_id``; False when ANOTHER event claimed it first.

    True both when the key is new and when this same event claimed it before:
    the latter is a broker redelivery of a delivery whose routing died half
    way, and it must be routed again rather than dropped. A new key is one
    atomic statement (``INSERT ... ON CONFLICT DO NOTHING RETURNING``, one
    commit): two nodes claiming at once cannot both win, and routing, which
    waits for the claim, pays one statement rather than a read, a
    transaction and an insert. Only a key already taken is read back.
    """
    key, event_id = key[:KEY_MAX], event_id[:64]
    alias = router.db_for_write(SeenDelivery) or "default"
    connection = connections[alias]
    table, column = SeenDelivery._meta.db_table, connection.ops.quote_name("key")
    seen_at = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({column}, event_id, seen_at) VALUES (%s, %s, %s) "
            f"ON CONFLICT ({column}) DO NOTHING RETURNING event_id",
            [key, event_id, seen_at],
        )
        if cursor.fetchone() is not None:
            return True
        cursor.execute(f"SELECT event_id FROM {table} WHERE {column} = %s", [key])
        row = cursor.fetchone()
    return row is None or row[0] == event_id


def followers(conversation: str) -> list[str]:
    """The handles of every seat following ``conversation``."""
    if not conversation:
        return []
    return list(
        ThreadFollow.objects.filter(conversation=conversation[:512]).order_by("seat").values_list("seat", flat=True)
    )


class DeliveryClaim(NamedTuple):
    """What :func:`claim_delivery` found: the delivery's claim, its conversation's followers (None: not read), and each wake key's claim."""

    claimed: bool
    followers: Optional[list[str]]
    wakes: dict[str, bool]


def claim_delivery(key: str, event_id: str, conversation: str, wake_keys: Sequence[str] = ()) -> DeliveryClaim:
    """:func:`claim` the delivery; when it is this event's, claim ``wake_keys`` too and read ``conversation``'s followers.

    Routing needs all of them before it wakes anyone, one after the other;
    made as one call they cost one trip to the store's thread instead of one
    per claim and one for the followers. A lost delivery claim claims and
    reads nothing more: that delivery wakes nobody.
    """
    if not claim(key, event_id):
        return DeliveryClaim(False, None, {})
    wakes = {wake: claim(wake, event_id) for wake in wake_keys}
    return DeliveryClaim(True, followers(conversation), wakes)


def follow(seat: str, conversation: str, source: str = "", *, now: Optional[datetime] = None) -> None:
    """Record that ``seat`` was woken in ``conversation`` (idempotent; refreshes the clock).

    One atomic upsert (``INSERT ... ON CONFLICT DO UPDATE``): a first follow
    and a refresh are each one statement and one commit, and two nodes
    recording the same follow at once land on the same row.
    """
    if not conversation:
        return
    alias = router.db_for_write(ThreadFollow) or "default"
    connection = connections[alias]
    at = connection.ops.adapt_datetimefield_value(now or timezone.now())
    table = ThreadFollow._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (seat, conversation, source, followed_at, last_woken_at) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (seat, conversation) DO UPDATE SET source = excluded.source, last_woken_at = excluded.last_woken_at",
            [seat, conversation[:512], source, at, at],
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
aclaim_delivery = in_store(claim_delivery)
afollowers = in_store(followers)
afollow = in_store(follow)
arate_hit = in_store(rate_hit)
aprune = in_store(prune)

__all__ = [
    "FOLLOW_KEEP_S",
    "RATE_KEEP_S",
    "SEEN_KEEP_S",
    "aclaim",
    "DeliveryClaim",
    "aclaim_delivery",
    "afollow",
    "afollowers",
    "aprune",
    "arate_hit",
    "claim",
    "claim_delivery",
    "follow",
    "followers",
    "prune",
    "rate_hit",
]
