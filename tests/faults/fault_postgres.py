"""A PostgreSQL server of a fault case's own: initdb + pg_ctl from the installed PostgreSQL, its own port and socket directory.

Restarting it, or filling it with odd rows, disturbs no other test run on the
machine's shared cluster. The ``postgres`` fixture (tests/faults/conftest.py) starts one;
``env()`` points `up` at it.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import skip_or_fail
from tests.faults.fault_support import free_port


class PrivatePostgres:
    """A throwaway PostgreSQL cluster run as the postgres OS user, reachable only by its socket."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            skip_or_fail("PostgreSQL binaries not found under /usr/lib/postgresql (bin/test installs them)")
        self.bindir = Path(found[-1]).parent
        self.root = Path(tempfile.mkdtemp(prefix="crewlet-faults-pg-"))
        os.chmod(self.root, 0o755)
        self.data = self.root / "data"
        self.socket_dir = str(self.root)
        self.port = free_port()
        shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *argv: str) -> str:
        cmd = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)
        assert result.returncode == 0, f"{' '.join(argv)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def pg_ctl(self, *argv: str) -> str:
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses='' -c fsync=off"
        return self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", *argv)

    def start(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.pg_ctl("start")
        for name in ("crewlet", "crewlet_events"):
            self._run(str(self.bindir / "createdb"), "-h", self.socket_dir, "-p", str(self.port), "-U", "postgres", name)

    def restart(self) -> None:
        self.pg_ctl("-m", "fast", "restart")

    def close(self) -> None:
        try:
            self.pg_ctl("-m", "immediate", "stop")
        except AssertionError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def env(self) -> dict[str, str]:
        return {
            "CREWLET_DATABASE": "postgres",
            "CREWLET_PG_HOST": self.socket_dir,
            "CREWLET_PG_PORT": str(self.port),
            "CREWLET_PG_USER": "postgres",
            "CREWLET_PG_DBNAME": "crewlet",
            "CREWLET_PG_EVENTS_DBNAME": "crewlet_events",
        }

