"""PostgreSQL restarted under load: `up` on its own private server loses and doubles nothing.

The server is this test's own (initdb + pg_ctl from the installed PostgreSQL,
its own port and socket directory in a temporary directory), so restarting it
disturbs no other test run on the machine's shared cluster.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import skip_or_fail
from tests.faults.conftest import Figures
from tests.faults.fault_support import Sender, Up, company_yaml, free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.postgres]

TURN_S = 0.3
BOUND_S = 45.0


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


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


def test_postgres_restarted_under_load_loses_and_doubles_no_accepted_delivery(
    tmp_path: Path, figures: Figures, postgres: PrivatePostgres
) -> None:
    company = company_yaml(providers=f"[{{kind: echo, delay_s: {TURN_S}}}]", max_concurrent=2)
    up = Up(tmp_path, company=company, env=postgres.env())
    try:
        up.start()
        sender = Sender(up)
        thread = threading.Thread(target=sender.send_new, args=(30,), kwargs={"retries": 120}, daemon=True)
        thread.start()
        wait_until(lambda: len(sender.accepted) >= 10, timeout_s=60, what="10 deliveries accepted before the restart")
        began = time.monotonic()
        postgres.restart()
        wait_until(lambda: up.api("/api/events", {"limit": 1}), timeout_s=60, what="the API reads the store again")
        recovery_s = time.monotonic() - began
        thread.join(timeout=240)
        assert not thread.is_alive()
        outcome = sender.wait_all_ran(timeout_s=BOUND_S + 30)
        accepted = sender.accepted
        lost = [d.key for d in accepted if outcome.runs(d.key) == 0]
        doubled = [d.key for d in accepted if outcome.runs(d.key) > 1]
        delays = [outcome.finished_at[d.key] - (d.accepted_at or 0.0) for d in accepted if d.key in outcome.finished_at]
        figures.record(
            sent=len(sender.deliveries), accepted=len(accepted), lost=len(lost), duplicated=len(doubled),
            delayed=sum(1 for x in delays if x > BOUND_S), max_delay_s=max(delays, default=0.0),
            recovery_s=recovery_s, bound_s=BOUND_S, note="private PostgreSQL, pg_ctl restart -m fast; delay from acceptance",
        )
        assert len(accepted) == len(sender.deliveries), [d.statuses for d in sender.deliveries if 202 not in d.statuses]
        assert not lost and not doubled, (lost, doubled)
    finally:
        up.cleanup()
