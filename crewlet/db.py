"""Coordination-store calls from the event loop."""
from __future__ import annotations

import functools
import logging
import time
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connections

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The PostgreSQL advisory lock that serialises ``migrate`` across the nodes of a fleet.
MIGRATE_LOCK_KEY = 0x637265776C6D6967  # "crewlmig"


def in_store(fn: Callable[..., T], *, alias: str = "default") -> Callable[..., Awaitable[T]]:
    """Run a store function off the event loop.

    A connection the database dropped (a restart, an idle timeout) is closed on
    the way out so the next call reconnects instead of failing forever: the
    engine is a long-running process with no request cycle to do it.
    """

    def guarded(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except (OperationalError, InterfaceError):
            try:
                connections[alias].close()
            except Exception:  # pragma: no cover - best effort
                log.debug("store_connection_close_failed", exc_info=True)
            raise

    functools.update_wrapper(guarded, fn)
    return sync_to_async(guarded, thread_sensitive=True)


@contextmanager
def migration_lock(alias: str = "default") -> Iterator[None]:
    """Hold the fleet's migration lock while the body runs (PostgreSQL); nothing on SQLite.

    Nodes of a fleet share one PostgreSQL coordination store, and three of
    them started together would otherwise apply the same migrations at the
    same moment: one creates a table, the others fail on it, or on the row
    of ``django_migrations`` the first just wrote. A session-level advisory
    lock on the shared database makes them take turns; the second finds the
    work done and applies nothing. The lock goes with the session, so a
    node killed mid-migration does not leave it held. SQLite needs none: its
    databases are one node's own files, never shared by a fleet.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        yield
        return
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
    log.info("migrate_lock_acquired", extra={"database": alias, "waited_s": round(time.monotonic() - started, 3)})
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK_KEY])
