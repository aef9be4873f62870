"""Helpers the event store and /api/ tests share: events at chosen instants, rows written the writer's way."""
from __future__ import annotations

import itertools
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator, Iterable, Optional

import pytest
from django.db import connections

import eventstore
from crewlet.events import Event, new, registered_type
from crewlet.queue import topics
from crewlet.events.tracing import Trace
from eventstore.questions import NodeScope
from eventstore.rows import row_for
from eventstore.writer import insert_sql
from engine_support import engine_here

#: The asker's instant most tests read at: a microsecond that is on no bucket boundary.
AT = datetime(2025, 3, 10, 12, 30, 0, 500, tzinfo=timezone.utc)
US = timedelta(microseconds=1)
NODE = "n1"

_ids = itertools.count(1)


def trace(n: int = 1) -> Trace:
    return Trace(f"{n:032x}", f"{n:016x}")


def make_event(
    etype: str,
    ts: datetime,
    *,
    event_id: Optional[str] = None,
    span: Optional[Trace] = None,
    node: str = NODE,
    extras: Optional[dict[str, Any]] = None,
    **fields: Any,
) -> Event:
    """A registered event of ``etype`` at ``ts``, with ``fields`` on its typed body."""
    cls = registered_type(etype)
    assert cls is not None, etype
    event = new(cls(**fields), span or trace(), extras=extras, event_id=event_id or f"ev-{next(_ids):08d}", timestamp=ts)
    event.node = node
    return event


@asynccontextmanager
async def bound_as_engine(q: Any) -> AsyncIterator[Any]:
    """``q`` bound as this process's engine queue, its publishes written to the event store, as ``up`` wires it."""
    writer = eventstore.attach(q)
    try:
        with engine_here(q):
            yield q
    finally:
        await writer.aclose()


def store(*events: Event, topic: Optional[str] = None, using: str = "events") -> list[Event]:
    """Write rows exactly as the publish listener derives them, on the test's own connection (to ``using``'s store)."""
    connection = connections[using]
    sql = insert_sql()
    with connection.cursor() as cursor:
        for event in events:
            row = row_for(topic or topics.event(event.type), event)
            assert row is not None, f"{event.type} is not stored"
            params = list(row)
            params[1] = connection.ops.adapt_datetimefield_value(params[1])
            cursor.execute(sql, params)
    return list(events)


def ids(rows: Iterable[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


@pytest.fixture
def scope(monkeypatch: pytest.MonkeyPatch) -> NodeScope:
    """The API answers as node n1, alone in its fleet, 720 h of history, at AT."""
    from eventstore import api, here
    from eventstore.fanout import FleetReads

    node = NodeScope(node_id=NODE, retention_hours=720.0)
    monkeypatch.setattr(here, "node_scope", lambda: node)
    # Read per question, as the engine's is: a test that narrows node_scope narrows what the fleet answers from.
    monkeypatch.setattr(api, "fleet", lambda: FleetReads(here.node_scope(), roster=lambda: [NODE]))
    monkeypatch.setattr(here, "clock", lambda: AT)
    return node


@pytest.fixture
def operator(db: Any) -> str:
    """A minted operator token."""
    from crewlet.base.tokens import OperatorToken

    _, token = OperatorToken.mint("tests")
    return token


@pytest.fixture
def api_client(operator: str) -> Any:
    """An API client carrying the minted operator token (pytest-django's ``client`` stays Django's own)."""
    from rest_framework.test import APIClient

    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {operator}")
    return c
