"""Three nodes' event stores for the fleet-read tests: one PostgreSQL database each, beside the test databases.

Each store is its own database (``<events test database>_<node>``), reached
through its own connection alias, so a node answers from exactly the rows it
holds, as a fleet's nodes do. The databases are made once per module and
dropped after it; every test starts them empty.
"""
from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Optional, Sequence

import pytest
from django.conf import settings
from django.db import connections

from crewlet.queue.contract import EventQueue
from eventstore.fanout import FleetReads
from eventstore.models import EventRow
from eventstore.questions import NodeScope

NODES: tuple[str, ...] = ("a", "b", "c")


def alias_of(node: str) -> str:
    return f"fleet_{node}"


ALIASES: tuple[str, ...] = tuple(alias_of(n) for n in NODES)


def _drop(name: str) -> None:
    with connections["events"].cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def node_databases(nodes: Sequence[str] = NODES, *, tables: bool = True) -> Iterator[dict[str, str]]:
    """A database per node beside the events test database, reached as :func:`alias_of` the node: {node: database name}.

    Each gets the store's table when ``tables``; without, it is left empty for
    a ``manage.py up`` to migrate as its own events database.
    """
    base = dict(connections["events"].settings_dict)
    names = {node: f"{base['NAME']}_{node}" for node in nodes}
    try:
        for node, name in names.items():
            _drop(name)
            with connections["events"].cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
            register(node, name)
            if tables:
                with connections[alias_of(node)].schema_editor() as editor:
                    editor.create_model(EventRow)
        yield names
    finally:
        for node, name in names.items():
            forget(node)
            _drop(name)


def register(node: str, name: str) -> str:
    """A connection alias for ``node``'s database ``name``."""
    alias = alias_of(node)
    config = {**connections["events"].settings_dict, "NAME": name}
    settings.DATABASES[alias] = config
    connections.settings[alias] = config
    return alias


def forget(node: str) -> None:
    alias = alias_of(node)
    if alias in connections.settings:
        connections[alias].close()
        del connections.settings[alias]
        settings.DATABASES.pop(alias, None)


def empty(*nodes: str) -> None:
    for node in nodes or NODES:
        with connections[alias_of(node)].cursor() as cursor:
            cursor.execute("DELETE FROM eventstore_event")


@contextlib.asynccontextmanager
async def readers(
    queues: Sequence[EventQueue],
    *,
    budget_s: float = 2.0,
    roster: Optional[Callable[[], Sequence[str]]] = None,
    **options: Any,
) -> AsyncIterator[list[FleetReads]]:
    """Each queue's node serving its own store and asking the others; the roster is every queue's node."""
    ids = [q.node for q in queues]
    made = [
        FleetReads(
            NodeScope(node_id=q.node, retention_hours=720.0, using=alias_of(q.node)),
            roster=roster or (lambda: ids),
            queue=q,
            budget_s=budget_s,
            **options,
        )
        for q in queues
    ]
    started: list[FleetReads] = []
    try:
        for reader in made:
            await reader.start()
            started.append(reader)
        yield made
    finally:
        for reader in started:
            await reader.stop()


#: A module's marks for tests on every node's store: PostgreSQL, processes, each store's connection closed after.
STORE_MARKS = [
    pytest.mark.postgres,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, databases=["default", "events", *ALIASES]),
    pytest.mark.usefixtures("close_store_connections"),
]


@pytest.fixture(scope="module")
def stores(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, str]]:
    """Every node's database for the module (a test module imports this fixture and :func:`empty_stores`)."""
    from tests.conftest import on_postgres

    if not on_postgres():
        pytest.skip("each node's store is a PostgreSQL database of its own")
    with django_db_blocker.unblock():
        with node_databases() as names:
            yield names


@pytest.fixture(autouse=True)
def empty_stores(stores: dict[str, str]) -> None:
    """Every test starts with every node's store empty."""
    empty()


Serve = Callable[[bytes], Awaitable[bytes]]
