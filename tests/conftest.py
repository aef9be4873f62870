"""Shared test helpers: where ../shared is, and skips that become failures under CI.

A missing prerequisite (the shared fixtures, PostgreSQL) is a skip on a
developer's machine, so a partial checkout still runs what it can, and a
failure under ``CI=true``, so CI can never pass by skipping what it was meant
to check.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

from tests.process_support import mark_process_backends

#: The suite's fixtures, available to every test: seats_support (runtime_on_memory,
#: close_store_connections, which a module opts into) and eventstore_support (scope,
#: operator, api_client); figures_support prints and writes the fault suite's figures.
pytest_plugins = ["seats_support", "eventstore_support", "figures_support"]

REPO_ROOT = Path(__file__).resolve().parent.parent
#: ../shared beside the repository (CI lays a copy there); CREWLET_SHARED_DIR overrides.
SHARED_DIR = Path(os.environ.get("CREWLET_SHARED_DIR") or REPO_ROOT.parent / "shared")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def skip_or_fail(reason: str) -> NoReturn:
    """Skip locally; fail under CI=true, where a missing prerequisite is a broken setup."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing prerequisite fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def on_postgres() -> bool:
    from django.db import connections

    return all(connections[alias].vendor == "postgresql" for alias in connections)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED_DIR.is_dir():
        skip_or_fail(f"shared directory not found at {SHARED_DIR} (expected ../shared beside the repository)")
    return SHARED_DIR


@pytest.fixture(scope="session")
def fixtures_dir(shared_dir: Path) -> Path:
    """../shared/fixtures: recorded webhook bodies, traceparent cases (see its README.md)."""
    path = shared_dir / "fixtures"
    if not path.is_dir():
        skip_or_fail(f"shared fixtures not found at {path}")
    return path


#: The PostgreSQL names a pass is given, and bin/test's defaults when it is given none.
DATABASE_NAME_VARIABLES = (("CREWLET_PG_DBNAME", "crewlet"), ("CREWLET_PG_EVENTS_DBNAME", "crewlet_events"))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's PostgreSQL names are the pass's names plus its id (``suite`` -> ``suite_gw0``).

    pytest-django gives each worker's test databases that suffix already
    (``test_suite_gw0``); a test that derives names of its own from
    ``CREWLET_PG_DBNAME`` (a fleet's coordination store, a node's events
    database) reads the worker's, so two workers never create, use or drop
    the same database. A serial run keeps the names it was given.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        for variable, default in DATABASE_NAME_VARIABLES:
            os.environ[variable] = f"{os.environ.get(variable) or default}_{worker}"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres") and not on_postgres():
        skip_or_fail("needs PostgreSQL: run through bin/test (sets CREWLET_DATABASE=postgres)")


#: Fixtures through which a test reaches the pass's databases (pytest-django's
#: ``django_db_blocker`` is in every test's closure; it counts when a test asks for it).
DATABASE_FIXTURES = frozenset({"db", "transactional_db"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database-tests-only", action="store_true",
        help="run only the tests that use the pass's database (a django_db mark or a database fixture); "
        ".ci/run's SQLite pass, after a full pass on PostgreSQL",
    )


def uses_the_database(item: pytest.Item) -> bool:
    """Whether the test reaches the database this pass configured (PostgreSQL or SQLite).

    The rest behave the same in either pass: they touch no database, or only
    the SQLite files of the ``manage.py up`` process they start, which never
    inherits the pass's ``CREWLET_DATABASE``.
    """
    if item.get_closest_marker("django_db") or DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    info = getattr(item, "_fixtureinfo", None)
    return "django_db_blocker" in (info.argnames if info is not None else ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_process_backends(items)
    if not config.getoption("--database-tests-only"):
        return
    kept = [item for item in items if uses_the_database(item)]
    dropped = [item for item in items if not uses_the_database(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
