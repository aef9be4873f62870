"""Retention: rows older than ``stream.event_retention_hours`` are deleted by a periodic duty.

The same bound ages CREWLET_EVENTS on the broker, so the store's history and
the stream's agree about how far back "the last 30 days" goes. Reads floor at
the same horizon from the asker's instant (eventstore.questions), so a row the
sweep has not reached yet is never shown past its time either.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Awaitable, Callable, Optional

from crewlet.company.conf import EngineSettings
from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.engine.services import Periodic

log = logging.getLogger("crewlet.eventstore.retention")

#: How often the duty sweeps. Hourly: a row outlives its bound by at most this.
RETENTION_INTERVAL_S = 3600.0
#: The duty's name (its failures log as ``eventstore_retention_failed``).
RETENTION = "eventstore_retention"
#: Rows deleted per statement, so one sweep after a long outage never holds a long lock.
DELETE_BATCH = 10_000


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def delete_older_than(hours: float, now: datetime, *, using: str = EVENTS_ALIAS, batch: int = DELETE_BATCH) -> int:
    """Delete rows whose timestamp is before ``now - hours``; returns how many went.

    A row exactly at the cutoff is kept: it is not older than the bound, and
    the reads count it (their floor is inclusive too).
    """
    from eventstore.models import EventRow

    cutoff = now - timedelta(hours=hours)
    rows = EventRow.objects.using(using)
    total = 0
    while True:
        ids = list(rows.filter(ts__lt=cutoff).order_by("ts", "id").values_list("id", flat=True)[:batch])
        if not ids:
            break
        deleted, _ = rows.filter(id__in=ids).delete()
        total += deleted
        if len(ids) < batch:
            break
    if total:
        log.info("eventstore_rows_retired", extra={"rows": total, "cutoff": cutoff.isoformat(), "hours": hours})
    return total


def _sweep_and_close(hours: float, now: datetime, *, using: str) -> int:
    """One sweep on a pool thread, then that thread's connection closed: an hourly duty keeps none open."""
    from django.db import connections

    try:
        return delete_older_than(hours, now, using=using)
    finally:
        connections[using].close()


def retention_periodic(
    settings: EngineSettings,
    interval_s: float = RETENTION_INTERVAL_S,
    *,
    now: Callable[[], datetime] = _utcnow,
    pause: Optional[Callable[[float], Awaitable[None]]] = None,
    using: str = EVENTS_ALIAS,
) -> Periodic:
    """The duty: sweep at start, then every ``interval_s``.

    A sweep that fails is logged (``eventstore_retention_failed``) and retried
    next time: a database hiccup must not stop the engine, and the rows it
    missed are still older next hour.
    """
    from asgiref.sync import sync_to_async

    hours = settings.stream.event_retention_hours
    sweep = sync_to_async(_sweep_and_close, thread_sensitive=False)

    async def once() -> None:
        await sweep(hours, now(), using=using)

    return Periodic(RETENTION, interval_s, once, logger=log, pause=pause)

