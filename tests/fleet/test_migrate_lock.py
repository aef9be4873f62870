"""Nodes of a fleet starting at once against one empty PostgreSQL coordination store take turns at ``migrate``.

Real processes on a real, freshly created database: three ``manage.py migrate``
started together, as three ``up`` processes started together run it.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from tests.process_support import REPO_ROOT
from tests.up_support import pg_client_env, up_env

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.slow]

NODES = 3


def connect(dbname: str = "postgres") -> Any:
    """An autocommit connection to ``dbname`` on the suite's server (the maintenance database: CREATE/DROP DATABASE)."""
    return psycopg.connect(
        dbname=dbname,
        host=os.environ.get("CREWLET_PG_HOST", "/var/run/postgresql"),
        port=os.environ.get("CREWLET_PG_PORT") or None,
        user=os.environ.get("CREWLET_PG_USER") or None,
        password=os.environ.get("CREWLET_PG_PASSWORD") or None,
        autocommit=True,
    )


@pytest.fixture
def empty_store() -> Iterator[tuple[str, list[str]]]:
    """A new, empty coordination database and one empty event store per node; dropped afterwards."""
    prefix = f"{os.environ.get('CREWLET_PG_DBNAME') or 'crewlet'}_race_{secrets.token_hex(3)}"
    names = [prefix, *(f"{prefix}_events_n{i + 1}" for i in range(NODES))]
    with connect() as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield names[0], names[1:]
    finally:
        with connect() as admin:
            for name in names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_three_nodes_migrating_one_empty_postgres_store_at_once_all_succeed_and_apply_each_migration_once(
    tmp_path: Path, empty_store: tuple[str, list[str]]
) -> None:
    shared, events = empty_store
    procs = []
    for i, events_db in enumerate(events):
        env = up_env(
            CREWLET_DATABASE="postgres", CREWLET_PG_DBNAME=shared, CREWLET_PG_EVENTS_DBNAME=events_db,
            CREWLET_VAR_DIR=str(tmp_path / f"n{i + 1}"), **pg_client_env(),
        )
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    outcomes = [(p.wait(timeout=300), p.stdout.read() if p.stdout else "") for p in procs]
    assert [rc for rc, _ in outcomes] == [0] * NODES, "\n\n".join(out[-3000:] for _, out in outcomes)
    with connect(shared) as conn:
        rows = conn.execute("SELECT app, name, count(*) FROM django_migrations GROUP BY app, name").fetchall()
    assert rows and all(count == 1 for _, _, count in rows)
    assert ("crewlet", "0001_initial", 1) in rows
