"""The fault suite's figures: each case records what it sent and what became of it.

At the end of the run the figures are printed as one table (``-s`` not needed:
it is the terminal summary) and written to ``var/ci/reliability.json``, the
source of the table in docs/RELIABILITY.md: tests/figures_support.py does both,
once, for a serial run and for one spread over pytest-xdist workers.
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest
from figures_support import FIGURES_KEY  # the name tests/conftest.py's pytest_plugins loads it under: one key

from tests.faults.fault_postgres import PrivatePostgres


class Figures:
    """One case's figures, added to the run's list when the case records them."""

    def __init__(self, store: list[dict[str, Any]], case: str) -> None:
        self._store = store
        self.case = case

    def record(self, **figures: Any) -> dict[str, Any]:
        row = {"case": self.case, **figures}
        self._store.append(row)
        return row


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    store = request.config.stash.setdefault(FIGURES_KEY, [])
    yield Figures(store, request.node.name)


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of the case's own (tests/faults/fault_postgres.py), removed after it."""
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()
