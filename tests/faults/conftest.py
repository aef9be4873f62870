"""The fault suite's figures: each case records what it sent and what became of it.

At the end of the run the figures are printed as one table (``-s`` not needed:
it is the terminal summary) and written to ``var/ci/reliability.json``, the
source of the table in docs/RELIABILITY.md.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.faults.fault_postgres import PrivatePostgres
from tests.process_support import REPO_ROOT

FIGURES_KEY = pytest.StashKey[list]()
REPORT = REPO_ROOT / "var" / "ci" / "reliability.json"
COLUMNS = ("case", "sent", "accepted", "lost", "duplicated", "delayed", "max_delay_s", "recovery_s", "bound_s", "note")


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


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    rows = config.stash.get(FIGURES_KEY, [])
    if not rows:
        return
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": rows}, indent=2, default=str))
    terminalreporter.section("fault suite figures")
    terminalreporter.write_line("| " + " | ".join(COLUMNS) + " |")
    terminalreporter.write_line("|" + "---|" * len(COLUMNS))
    for row in rows:
        terminalreporter.write_line("| " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |")
    terminalreporter.write_line(f"(written to {Path(REPORT).relative_to(REPO_ROOT)})")
