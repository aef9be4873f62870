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

#: The suite's fixtures, available to every test: seats_support (runtime_on_memory,
#: close_store_connections, which a module opts into) and eventstore_support (scope,
#: operator, api_client).
pytest_plugins = ["seats_support", "eventstore_support"]

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


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres") and not on_postgres():
        skip_or_fail("needs PostgreSQL: run through bin/test (sets CREWLET_DATABASE=postgres)")
