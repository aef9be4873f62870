"""The event store writer: a publish listener that writes one row per stored event, inline.

Design (Publish Listeners): the store is written at publish time on the node
that published, not by a subscription — so no consumer group can let two nodes
write one row or lose one in a rebalance, and each node's store holds exactly
what that node published. The listener is handed the event as the queue
stamped it, so the row carries the node the wire copy does. The publish awaits
the listener, so when ``publish`` returns the row is committed.

Group commit: a publish that finds no write in flight writes its row at once;
rows published while a write is in flight (a busy node's turns and webhook
requests publish concurrently) queue, and the next write commits all of them
in one transaction (at most MAX_BATCH rows), each publisher released when the
transaction holding its row has committed. A lone publisher pays one
statement as before; concurrent ones stop paying a commit each.

Idempotent on the event id (``INSERT ... ON CONFLICT (id) DO NOTHING``): an
event republished under its own id — a run's ending repeated by the node that
finishes it, a parked delivery handed back — stays one row.

The queue awaits listeners on the event loop, which must never block on a
database. On PostgreSQL the writer therefore keeps its own asyncio psycopg
connection (server-side binding, the insert prepared after a few uses) and
awaits the insert on the loop itself: no thread hand-off per event, and no
queueing behind every other ``sync_to_async`` caller in the process. Elsewhere
(SQLite, solo) it runs the insert on a thread of its own with Django's
connection.

A row the store refuses for what it holds (it would fail however often it
were tried) is set aside, counted (``refused``, on ``/metrics``) and logged
once, and the rows around it are written: one such row must not hold every
later row behind it. :func:`eventstore.rows.row_for` already writes the
characters PostgreSQL refuses as escapes, so this is the last line.

A row whose insert fails otherwise is kept, not dropped: the event was published and the
broker has it, so its row is owed. It waits in the writer's backlog, and a
retry task writes the backlog oldest first, backing off while the store stays
away; while a backlog waits, new rows join it behind the old ones rather than
each waiting out a dead server. The publish never fails and never waits for
the retry (telemetry must not be able to fail a publish). ``aclose`` gives the
backlog one last bounded try and names how many rows it could not write. A
broken connection is replaced on the next attempt.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence, TypeVar

from django.db import connections, transaction

from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.events import Event
from crewlet.queue.contract import EventQueue
from eventstore.rows import COLUMNS, CUSTODY_COLUMN, TABLE, row_for

log = logging.getLogger("crewlet.eventstore.writer")

#: How the writer's own connection shows in pg_stat_activity.
APPLICATION_NAME = "crewlet-eventstore-writer"
_TS = COLUMNS.index("ts")
T = TypeVar("T")


def insert_sql(table: str = TABLE, *, extra: tuple[str, ...] = ()) -> str:
    """The one statement the writer runs (the benchmark's raw baseline runs it too); ``extra`` columns follow COLUMNS."""
    names = (*COLUMNS, *extra)
    marks = ", ".join(["%s"] * len(names))
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks}) ON CONFLICT (id) DO NOTHING"


class StoreUnavailable(RuntimeError):
    """The writer could not reach its store a moment ago and is not trying again yet."""


def refused(exc: BaseException) -> bool:
    """Whether the store answered and refused what the rows hold, rather than being away.

    Such a row fails the same way however often it is tried, so it must not
    wait at the head of the backlog with every later row behind it. Anything
    else (a connection, a timeout, a missing table) is the store's state and
    passes.
    """
    import psycopg
    from django.db import DataError, IntegrityError

    return isinstance(exc, (UnicodeError, DataError, IntegrityError, psycopg.DataError, psycopg.IntegrityError))


class _PostgresSink:
    """Inserts on the event loop over the writer's own ``psycopg.AsyncConnection``.

    A publish awaits its listener, so the writer bounds how long it can hold
    one: connecting gives up after CONNECT_TIMEOUT_S, a statement after
    STATEMENT_TIMEOUT_MS, and after a failed connect the writer does not try
    again for RETRY_AFTER_S — events in that window fail at once (the queue
    logs them) instead of each waiting out a dead server.
    """

    CONNECT_TIMEOUT_S = 5
    STATEMENT_TIMEOUT_MS = 5000
    RETRY_AFTER_S = 5.0

    def __init__(self, using: str) -> None:
        params = dict(connections[using].get_connection_params())
        params.pop("cursor_factory", None)  # Django's sync cursor class; the async default binds server-side
        params.pop("context", None)  # Django's loaders; the writer reads nothing back
        params["prepare_threshold"] = params.get("prepare_threshold") or 5
        params["application_name"] = APPLICATION_NAME
        params.setdefault("connect_timeout", self.CONNECT_TIMEOUT_S)
        params["options"] = f"{params.get('options', '')} -c statement_timeout={self.STATEMENT_TIMEOUT_MS}".strip()
        self._params = params
        self._conn: Any = None
        self._retry_at = 0.0
        self._sql = insert_sql()

    async def _connect(self) -> Any:
        import psycopg

        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at:
            raise StoreUnavailable("the event store was unreachable a moment ago; not retrying yet")
        try:
            return await psycopg.AsyncConnection.connect(autocommit=True, **self._params)
        except Exception:
            self._retry_at = loop.time() + self.RETRY_AFTER_S
            raise

    async def insert(self, rows: Sequence[Sequence[Any]]) -> None:
        """Commit ``rows``: one statement for one row, one transaction of a pipelined batch for more."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = await self._connect()
        try:
            if len(rows) == 1:
                await conn.execute(self._sql, rows[0])
            else:
                async with conn.transaction():
                    async with conn.cursor() as cursor:
                        await cursor.executemany(self._sql, rows)
        except Exception:
            if conn.closed or conn.broken:
                self._conn = None  # the next event connects afresh
                await conn.close()
            raise

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def insert_rows(rows: Sequence[Sequence[Any]], using: str = EVENTS_ALIAS, *, custody_batch: str = "") -> None:
    """Commit ``rows`` in one transaction with Django's connection (blocking); ``custody_batch`` marks each row as
    that unsettled batch's (eventstore.custody)."""
    connection = connections[using]
    extra = (custody_batch,) if custody_batch else ()
    params = []
    for row in rows:
        values = list(row)
        # SQLite stores a naive UTC string; PostgreSQL takes the aware datetime as is.
        values[_TS] = connection.ops.adapt_datetimefield_value(values[_TS])
        params.append([*values, *extra])
    sql = insert_sql(extra=(CUSTODY_COLUMN,) if custody_batch else ())
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.executemany(sql, params)


class StoreThread:
    """Blocking calls on one store, made on a thread of their own with Django's connection to it.

    The loop never blocks on the store, and a slow store holds up only its own
    thread, not the process's shared one (which the leases and claims are
    written on). The writer's sink off PostgreSQL and the custody keeper use it.
    """

    def __init__(self, using: str, name: str) -> None:
        self.using = using
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the store's thread; a connection it broke is replaced on the next call."""

        def call() -> T:
            try:
                return fn(*args)
            except Exception:
                # A long-running engine has no request cycle to replace a broken
                # connection; do it here so the next call gets a fresh one.
                connections[self.using].close_if_unusable_or_obsolete()
                raise

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def insert(self, rows: Sequence[Sequence[Any]]) -> None:
        await self.run(insert_rows, rows, self.using)

    def _close(self) -> None:
        connections[self.using].close()  # looked up here: a connection belongs to its thread

    async def aclose(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        finally:
            self._executor.shutdown(wait=False)


#: The first wait before a failed row is tried again; doubled per failure up to RETRY_MAX_S.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 5.0
#: How long ``aclose`` keeps trying to write a backlog before it gives up on it.
CLOSE_FLUSH_S = 10.0
#: Rows the backlog holds at most. Past it the oldest is dropped, with an error
#: naming it: a store away for hours must not take the engine's memory with it.
BACKLOG_MAX = 100_000
#: Rows one group commit writes at most.
MAX_BATCH = 500


class EventWriter:
    """The publish listener: ``await writer(topic, event)`` writes the event's row, if it has one.

    ``threaded`` forces the thread sink (True) or the PostgreSQL loop sink
    (False); by default PostgreSQL gets the loop sink and everything else the
    thread. ``retry_first_s`` / ``retry_max_s`` space the retries of a backlog
    and ``close_flush_s`` bounds the last try at close (tests shrink them).
    """

    def __init__(
        self,
        using: str = EVENTS_ALIAS,
        *,
        threaded: Optional[bool] = None,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
        close_flush_s: float = CLOSE_FLUSH_S,
        backlog_max: int = BACKLOG_MAX,
    ) -> None:
        self.using = using
        if threaded is None:
            threaded = connections[using].vendor != "postgresql"
        self._sink: Optional[_PostgresSink | StoreThread] = (
            StoreThread(using, "eventstore-writer") if threaded else _PostgresSink(using)
        )
        self.retry_first_s = float(retry_first_s)
        self.retry_max_s = max(float(retry_max_s), self.retry_first_s)
        self.close_flush_s = float(close_flush_s)
        self.backlog_max = max(int(backlog_max), 1)
        #: (event id, row) of every row owed to the store, oldest first.
        self._backlog: collections.deque[tuple[str, Sequence[Any]]] = collections.deque()
        self._retrying: Optional[asyncio.Task[None]] = None
        #: (event id, row, its publisher's future) queued behind the write in flight.
        self._queued: list[tuple[str, Sequence[Any], asyncio.Future[None]]] = []
        self._writing = False
        self._draining: Optional[asyncio.Task[None]] = None
        self._refused = 0

    @property
    def threaded(self) -> bool:
        return isinstance(self._sink, StoreThread)

    @property
    def backlog(self) -> int:
        """Rows published and not yet written (the store was away when they came)."""
        return len(self._backlog)

    @property
    def refused(self) -> int:
        """Rows the store refused for what they hold, set aside so the rows behind them were written."""
        return self._refused

    def lag_s(self, now: datetime) -> float:
        """How old the oldest row still owed is, by its event's time (0 when nothing is owed): the writer's lag."""
        if not self._backlog:
            return 0.0
        ts = self._backlog[0][1][_TS]
        if not isinstance(ts, datetime):
            return 0.0
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=timezone.utc)
        return max((now - ts).total_seconds(), 0.0)

    async def __call__(self, topic: str, event: Event) -> None:
        row = row_for(topic, event)
        if row is None:
            return
        sink = self._sink
        if sink is None:
            log.error("eventstore_writer_closed", extra={"event_id": event.id, "type": event.type})
            return
        if self._backlog:  # behind the rows already waiting, and without waiting out a store that is away
            self._keep(event.id, row)
            return
        if self._writing:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queued.append((event.id, row, done))
            await asyncio.shield(done)  # a cancelled publisher's row is still written
            return
        self._writing = True
        try:
            await self._commit(sink, [(event.id, row)])
        finally:
            if self._queued:
                self._draining = asyncio.get_running_loop().create_task(self._drain(sink), name="eventstore-writer-batch")
            else:
                self._writing = False

    async def _commit(self, sink: _PostgresSink | StoreThread, batch: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Write ``batch`` in one transaction; on failure its rows join the backlog (the publish never fails)."""
        if self._backlog:
            for event_id, row in batch:
                self._keep(event_id, row)
            return
        try:
            await sink.insert([row for _, row in batch])
        except Exception as exc:
            if refused(exc):
                rest = await self._write_each(sink, batch)
                if not rest:
                    return
                batch, exc = rest
            log.warning(
                "eventstore_row_deferred",
                extra={"event_id": batch[0][0], "rows": len(batch), "error": type(exc).__name__},
            )
            for event_id, row in batch:
                self._keep(event_id, row)

    async def _write_each(
        self, sink: _PostgresSink | StoreThread, batch: Sequence[tuple[str, Sequence[Any]]]
    ) -> Optional[tuple[Sequence[tuple[str, Sequence[Any]]], Exception]]:
        """Write a refused batch's rows one at a time, setting aside each row the store refuses on its own.

        Returns None once every row was written or set aside; otherwise the
        rows from the first that failed for another reason (the store went
        away meanwhile), with that failure, for the caller to keep.
        """
        for i, (event_id, row) in enumerate(batch):
            try:
                await sink.insert([row])
            except Exception as exc:
                if not refused(exc):
                    return batch[i:], exc
                self._set_aside(event_id, row, exc)
        return None

    def _set_aside(self, event_id: str, row: Sequence[Any], exc: BaseException) -> None:
        self._refused += 1
        log.error(
            "eventstore_row_refused",
            extra={"event_id": event_id, "type": row[COLUMNS.index("type")], "error": type(exc).__name__, "refused": self._refused},
        )

    async def _drain(self, sink: _PostgresSink | StoreThread) -> None:
        """Commit the queued rows, MAX_BATCH at a time, releasing each batch's publishers as it commits."""
        try:
            while self._queued:
                batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
                try:
                    await self._commit(sink, [(event_id, row) for event_id, row, _ in batch])
                finally:
                    for _, _, done in batch:
                        if not done.done():
                            done.set_result(None)
        finally:
            self._writing = False

    def _keep(self, event_id: str, row: Sequence[Any]) -> None:
        if len(self._backlog) >= self.backlog_max:
            dropped, _ = self._backlog.popleft()
            log.error("eventstore_row_dropped", extra={"event_id": dropped, "backlog": len(self._backlog)})
        self._backlog.append((event_id, row))
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.get_running_loop().create_task(self._retry(), name="eventstore-writer-retry")

    async def _write_backlog(self) -> None:
        """Write the backlog oldest first; raise on the first row that fails (it stays at the head)."""
        sink = self._sink
        if sink is None:
            raise StoreUnavailable("the writer is closed")
        while self._backlog:
            batch = list(itertools.islice(self._backlog, MAX_BATCH))
            try:
                await sink.insert([row for _, row in batch])
            except Exception as exc:
                if not refused(exc):
                    raise
                rest = await self._write_each(sink, batch)
                for _ in range(len(batch) - (len(rest[0]) if rest else 0)):
                    self._backlog.popleft()
                if rest:
                    raise rest[1]
                continue
            for _ in batch:
                self._backlog.popleft()

    async def _retry(self) -> None:
        wait_s = self.retry_first_s
        while self._backlog and self._sink is not None:
            await asyncio.sleep(wait_s)
            try:
                await self._write_backlog()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("eventstore_backlog_waiting", extra={"rows": len(self._backlog), "error": type(exc).__name__})
                wait_s = min(wait_s * 2, self.retry_max_s)
            else:
                log.info("eventstore_backlog_written")

    async def aclose(self) -> None:
        """Write what is owed (bounded by ``close_flush_s``), then close the connection.

        Later events are logged, as errors, and skipped: nothing publishes
        stored events once the engine has stopped its services.
        """
        draining, self._draining = self._draining, None
        if draining is not None:
            await asyncio.gather(draining, return_exceptions=True)  # the rows queued behind a write in flight
        retrying, self._retrying = self._retrying, None
        if retrying is not None:
            retrying.cancel()
            await asyncio.gather(retrying, return_exceptions=True)
        if self._backlog and self._sink is not None:
            deadline = asyncio.get_running_loop().time() + self.close_flush_s
            wait_s = self.retry_first_s
            while self._backlog:
                try:
                    await self._write_backlog()
                except Exception:
                    if asyncio.get_running_loop().time() + wait_s > deadline:
                        break
                    await asyncio.sleep(wait_s)
                    wait_s = min(wait_s * 2, self.retry_max_s)
            if self._backlog:
                log.error(
                    "eventstore_rows_unwritten",
                    extra={"rows": len(self._backlog), "first_event_id": self._backlog[0][0]},
                )
        sink, self._sink = self._sink, None
        if sink is not None:
            await sink.aclose()


def attach(
    queue: EventQueue, *, using: str = EVENTS_ALIAS, threaded: Optional[bool] = None, **options: Any
) -> EventWriter:
    """Register the writer as ``queue``'s publish listener; returns it (``aclose()`` on shutdown).

    ``options`` are :class:`EventWriter`'s retry settings.
    """
    writer = EventWriter(using=using, threaded=threaded, **options)
    queue.add_publish_listener(writer)
    log.info("eventstore_writer_attached", extra={"node": queue.node, "backend": queue.name, "threaded": writer.threaded})
    return writer
