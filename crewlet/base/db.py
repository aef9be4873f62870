"""Coordination-store calls from the event loop."""
from __future__ import annotations

import functools
import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connections

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The PostgreSQL advisory lock that serialises ``migrate`` across the nodes of a fleet.
MIGRATE_LOCK_KEY = 0x637265776C6D6967  # "crewlmig"


#: What a connection the database dropped (a restart, an idle timeout) raises on its next use.
DROPPED = (OperationalError, InterfaceError)


def in_store(fn: Callable[..., T], *, alias: str = "default") -> Callable[..., Awaitable[T]]:
    """Run a store function off the event loop.

    A connection the database dropped (a restart, an idle timeout) is closed on
    the way out so the next call reconnects instead of failing forever: the
    engine is a long-running process with no request cycle to do it.
    """

    def guarded(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except DROPPED:
            try:
                connections[alias].close()
            except Exception:  # pragma: no cover - best effort
                log.debug("store_connection_close_failed", exc_info=True)
            raise

    functools.update_wrapper(guarded, fn)
    return sync_to_async(guarded, thread_sensitive=True)


def in_transaction() -> bool:
    """Whether this thread holds an open transaction on any of its connections (only they see its writes)."""
    return any(connection.in_atomic_block for connection in connections.all(initialized_only=True))


def read_again_if_dropped(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` (a read); if the database dropped a connection this thread kept, again on a new one.

    A thread that keeps its connections for the process's life (a reader
    pool's) meets a restart as a failure of each one's first use. A read
    changes nothing, so it is asked once more after this thread's connections
    are closed (they reconnect on use); a second failure is the database being
    away, and stands. Inside a transaction the connection is not this code's
    to close (only it sees what the transaction wrote), so the failure stands
    at once. A write is not asked again: use :func:`in_store`, which closes
    the dropped connection and lets the caller decide.
    """
    try:
        return call(*args)
    except DROPPED:
        if in_transaction():
            raise
        log.info("store_read_reconnecting", extra={"read_thread": threading.current_thread().name})
        connections.close_all()
        return call(*args)


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
