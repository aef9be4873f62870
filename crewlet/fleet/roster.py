"""The live roster: the nodes whose presence (node lease) has not expired.

A node renews its presence at a third of ``fleet.lease_ttl_s``, so a node
missing from here has either stopped cleanly (it deleted nothing, it released
its lease) or not renewed for a whole TTL.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from django.db import connections, router
from django.db.models import QuerySet
from django.db.models.functions import Now

from crewlet.models import NodeLease


@dataclass(frozen=True)
class NodeInfo:
    """One live node as its presence describes it."""

    id: str
    labels: tuple[str, ...]
    protocol: int
    store: str
    expires_at: datetime


def _live(now: Optional[datetime] = None) -> "QuerySet[NodeLease]":
    """The unexpired presences, by id: as of ``now``, else as of the database's own clock when it runs."""
    return NodeLease.objects.filter(expires_at__gt=now if now is not None else Now()).exclude(holder="").order_by("name")


def live_nodes(*, now: Optional[datetime] = None) -> list[NodeInfo]:
    """Every node with an unexpired presence, sorted by id (blocking: a coordination-store read)."""
    rows = _live(now)
    return [
        NodeInfo(
            id=row.name,
            labels=tuple(str(label) for label in (row.labels or ())),
            protocol=row.protocol,
            store=row.store,
            expires_at=row.expires_at,
        )
        for row in rows
    ]


@functools.lru_cache(maxsize=None)
def _live_ids_sql(alias: str, stores_only: bool = False) -> tuple[str, tuple[Any, ...]]:
    """The SQL (and its constant parameters) of the live ids on ``alias``, compiled by the ORM once per alias
    (``stores_only``: of the nodes whose presence names an event store).

    The statement holds no instant of its own: "now" is the database's clock
    (``Now()``) when the statement runs, so the compiled text is the same for
    every call and only its execution is repeated.
    """
    rows = _live().exclude(store="") if stores_only else _live()
    sql, params = rows.values_list("name", flat=True).query.get_compiler(alias).as_sql()
    return sql, tuple(params)


def live_node_ids(*, stores_only: bool = False) -> list[str]:
    """The ids of every node with an unexpired presence, sorted (blocking: one coordination-store read per call).

    Every history read asks it (on the fleet reader's thread) before it scatters, so it
    runs the statement :func:`live_nodes` runs (ids only) without building,
    compiling and instantiating a queryset per call: the same rows, read fresh
    from the store each time, so a node that joined or left is seen by the very
    next read. ``stores_only`` leaves out the nodes whose presence names no
    event store (stateless nodes): the ones a history read asks.
    """
    alias = router.db_for_read(NodeLease) or "default"
    sql, params = _live_ids_sql(alias, stores_only)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return [str(row[0]) for row in cursor.fetchall()]


__all__ = ["NodeInfo", "live_node_ids", "live_nodes"]
