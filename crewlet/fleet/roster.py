"""The live roster: the nodes whose presence (node lease) has not expired.

A node renews its presence at a third of ``fleet.lease_ttl_s``, so a node
missing from here has either stopped cleanly (it deleted nothing, it released
its lease) or not renewed for a whole TTL.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

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


def live_nodes(*, now: Optional[datetime] = None) -> list[NodeInfo]:
    """Every node with an unexpired presence, sorted by id (blocking: a coordination-store read)."""
    rows = NodeLease.objects.filter(expires_at__gt=now if now is not None else Now()).exclude(holder="").order_by("name")
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


__all__ = ["NodeInfo", "live_nodes"]
