"""The SQL every answer is built from: the table, exact-microsecond timestamps, a WHERE clause and its parameters.

Raw SQL that PostgreSQL and SQLite both run, over ``eventstore_event``: the
answers need row-value comparisons and integer timestamp arithmetic that the
ORM does not spell on both.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Optional, Sequence

from django.db import connections

from crewlet.events import NOT_FED
from eventstore.questions.model import Custody, Filters, NodeScope
from eventstore.rows import CUSTODY_COLUMN, TABLE

#: A row this store keeps for good, or one of a custody batch it has settled as its own; and one it has not settled.
SETTLED = f"{CUSTODY_COLUMN} = ''"
UNSETTLED = f"{CUSTODY_COLUMN} > ''"


def us_sql(vendor: str, expr: str = "ts") -> str:
    """SQL for a timestamp expression as exact microseconds since the epoch.

    Reads return timestamps this way rather than as datetimes: it is exact, it
    is what the cursor and the bars are made of, and it skips a per-row
    timestamp parse in the database driver.
    """
    if vendor == "postgresql":
        return f"(EXTRACT(EPOCH FROM {expr}) * 1000000)::bigint"
    if vendor == "sqlite":
        # Django keeps an SQLite datetime as 'YYYY-MM-DD HH:MM:SS[.ffffff]' (UTC).
        # The whole seconds from the text's first 19 characters: strftime rounds a
        # fraction of .9995 s or more up to the next second, and the fraction is added apart.
        return f"(CAST(strftime('%%s', substr({expr}, 1, 19)) AS INTEGER) * 1000000 + CAST(substr({expr}, 21, 6) AS INTEGER))"
    raise NotImplementedError(f"event store reads on {vendor}")


def marks(values: Sequence[Any]) -> str:
    """One ``%s`` a value, comma-separated: an ``IN`` list's placeholders."""
    return ", ".join(["%s"] * len(values))


class Where:
    """A WHERE clause being built, with its parameters in order.

    Given a fleet read's :class:`~eventstore.questions.model.Custody`, it reads
    the settled rows only and records itself among the read's reaches, or,
    for a read of ``only`` these ids, exactly those rows.
    """

    def __init__(self, connection: Any, custody: Optional[Custody] = None) -> None:
        self.connection = connection
        self.clauses: list[str] = []
        self.params: list[Any] = []
        if custody is not None:
            if custody.only:
                self.among("id", custody.only)
            else:
                self.add(SETTLED)
                custody.reaches.append(self)

    @classmethod
    def of(cls, scope: NodeScope) -> "Where":
        """A WHERE over ``scope``'s store, read as its custody says."""
        return cls(connections[scope.using], scope.custody)

    def ts(self, value: datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def add(self, clause: str, *params: Any) -> None:
        self.clauses.append(clause)
        self.params.extend(params)

    def among(self, column: str, values: Sequence[Any]) -> None:
        """``column`` is one of ``values``: one array parameter on PostgreSQL, a list of them elsewhere.

        A long ``IN`` list is a different statement for every length, and a
        prepared one's generic plan may scan the table testing each row
        against every value; ``= ANY(array)`` is one statement, planned as an
        index lookup.
        """
        if self.connection.vendor == "postgresql":
            self.add(f"{column} = ANY(%s)", list(values))
        else:
            self.add(f"{column} IN ({marks(values)})", *values)

    def history(self, at: datetime, scope: NodeScope, floor: Optional[datetime] = None) -> None:
        """The asker's history: ``[max(at - retention, floor), at]``."""
        lower = at - timedelta(hours=scope.retention_hours)
        if floor is not None and floor > lower:
            lower = floor
        self.add("ts >= %s", self.ts(lower))
        self.add("ts <= %s", self.ts(at))

    def filters(self, f: Filters) -> None:
        if f.categories:
            self.add(f"category IN ({marks(f.categories)})", *f.categories)
        for column in ("type", "node", "trace_id"):
            value = getattr(f, column)
            if value:
                self.add(f"{column} = %s", value)
        for column in ("seat", "conversation_key", "partition_key"):
            value = getattr(f, column)
            if value:
                # The redundant "> ''" is the partial index's own predicate, so the planner can use it.
                self.add(f"{column} = %s AND {column} > ''", value)
        if f.since is not None:
            self.add("ts >= %s", self.ts(f.since))
        if f.until is not None:
            self.add("ts < %s", self.ts(f.until))
        if f.feed_only and NOT_FED:
            kept_out = sorted(NOT_FED)
            self.add(f"type NOT IN ({marks(kept_out)})", *kept_out)

    def before(self, ts_column: str, key_column: str, ts: datetime, key: str) -> None:
        """Strictly before (ts, key) in (ts, key) order: the cursor's cut."""
        self.add(f"({ts_column}, {key_column}) < (%s, %s)", self.ts(ts), key)

    @property
    def where(self) -> str:
        return " AND ".join(self.clauses) if self.clauses else "TRUE"


def unsettled_rows(scope: NodeScope) -> list[tuple[str, str]]:
    """(id, custody batch) of the unsettled rows any WHERE of this read would have reached (its settled rows aside), by id.

    One statement over every reach, each without its settled clause (which
    carries no parameter), so a read that reached no unsettled row costs one
    lookup of the custody index.
    """
    custody = scope.custody
    if custody is None or custody.only or not custody.reaches:
        return []
    clauses: list[str] = []
    params: list[Any] = []
    for reach in custody.reaches:
        rest = [clause for clause in reach.clauses if clause != SETTLED]
        clauses.append(f"({' AND '.join(rest) if rest else 'TRUE'})")
        params.extend(reach.params)
    sql = f"SELECT DISTINCT id, {CUSTODY_COLUMN} FROM {TABLE} WHERE {UNSETTLED} AND ({' OR '.join(clauses)}) ORDER BY id"
    return [(str(row[0]), str(row[1])) for row in fetch(scope, sql, params)]


def fetch(scope: NodeScope, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connections[scope.using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
