"""The fault suite's figures table: collected from every test process, printed and written once at the end of the run.

tests/faults/conftest.py's ``figures`` fixture adds each case's row to the
run's list (``config.stash[FIGURES_KEY]``). Run serially, that list is the
whole table. Run with pytest-xdist (``-n``), each worker sends its rows to
the controller as it finishes, and the controller — which runs no test and
never loads tests/faults/conftest.py — prints and writes them, so
``var/ci/reliability.json`` is written once, with every case's row, whatever
worker ran it. Registered by tests/conftest.py's ``pytest_plugins``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.process_support import REPO_ROOT

FIGURES_KEY = pytest.StashKey[list]()
REPORT = REPO_ROOT / "var" / "ci" / "reliability.json"
COLUMNS = ("case", "sent", "accepted", "lost", "duplicated", "delayed", "max_delay_s", "recovery_s", "bound_s", "note")
#: Where a worker's rows travel to the controller (pytest-xdist's ``workeroutput``).
WORKER_OUTPUT_KEY = "crewlet_fault_figures"


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[WORKER_OUTPUT_KEY] = json.dumps(session.config.stash.get(FIGURES_KEY, []), default=str)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    rows = json.loads(getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY, "[]"))
    node.config.stash.setdefault(FIGURES_KEY, []).extend(rows)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # a worker's rows are the controller's to print
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
