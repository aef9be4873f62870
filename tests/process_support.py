"""Helpers for tests that run the project as a process: where the repository is, a child's output, its process tree.

A test that starts ``manage.py up`` (or any child) reads the child's merged
output as it arrives with :class:`ProcessOutput`, finds what the child
spawned (the embedded ``nats-server``) with :func:`descendants`, and checks
that nothing outlived it with :func:`is_running`, so its cleanup kills only
what it started.
"""
from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Iterable

import pytest

#: The repository's root (manage.py, README.md, var/).
REPO_ROOT = Path(__file__).resolve().parent.parent
#: The id of a backend parameter whose case starts a real nats-server.
PROCESS_BACKEND = "jetstream"
#: Fixtures that start a process (``up``: a ``manage.py up`` a module's tests share).
PROCESS_FIXTURES = frozenset({"up"})


def mark_process_backends(items: Iterable[pytest.Item]) -> None:
    """Mark ``integration`` every case parametrised onto a backend that runs a process, or using a fixture that does.

    A file whose every test starts a process says so in its ``pytestmark``; a
    test parametrised over the backends starts one only for the JetStream
    case, and a module's shared ``up`` is started by whichever of its tests
    runs first, so the mark is given per case here and ``-m "not
    integration"`` keeps the in-memory twin's cases in the fast lane.
    """
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec is not None and PROCESS_BACKEND in callspec.id.split("-")
        if backend or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


class ProcessOutput:
    """Collects a child's merged stdout/stderr on a thread so the test can wait on lines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, needle: str, timeout_s: float) -> str:
        """The first line containing ``needle``; fails with the output so far if none comes in ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    raise AssertionError(f"{needle!r} not seen in time; output:\n" + "\n".join(self.lines))
                self._cond.wait(min(remaining, 0.5))

    def text(self) -> str:
        """Everything the child wrote, once its output has closed (or after 10 s)."""
        self._thread.join(timeout=10)
        return "\n".join(self.lines)


def proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, comm, state) for every process we can see."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        table[int(entry.name)] = (int(ppid), comm, state)
    return table


def descendants(root: int) -> dict[int, str]:
    """pid -> comm of every process below ``root`` (children, their children, ...)."""
    table = proc_table()
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, comm, _) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = comm
                frontier.append(pid)
    return found


def is_running(pid: int) -> bool:
    """Alive and not a zombie (a reaped-later zombie holds no port or memory)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def is_stopped(pid: int) -> bool:
    """Every thread of ``pid`` stopped by a signal: a SIGSTOP has taken effect (``kill`` returns before it has)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(t / "stat").read_text() for t in tasks]
    except OSError:
        return False
    return bool(states) and all(stat[stat.rindex(")") + 2] in "Tt" for stat in states)


__all__ = ["REPO_ROOT", "ProcessOutput", "descendants", "is_running", "is_stopped", "proc_table"]
