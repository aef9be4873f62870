"""A company too large for ``stream.max_consumers`` is refused by ``manage.py up`` before anything starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_support import REPO_ROOT
from tests.up_support import READY_LINE, up_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: Two agent seats and a person: room for four mailboxes is needed, three are allowed.
COMPANY = "org: acme\nproviders: {llm: [{kind: echo}]}\nseats: [{handle: ada, kind: agent}, {handle: linus, kind: agent}, {handle: grace, kind: human}]\n"


def test_up_refuses_a_company_whose_seats_mailboxes_exceed_stream_max_consumers_naming_the_limit_and_the_seats(
    tmp_path: Path,
) -> None:
    (tmp_path / "acme.yaml").write_text(COMPANY)
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "data"), CREWLET_STREAM_MAX_CONSUMERS="3")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "up", "--addr", "127.0.0.1:0", "--company", str(tmp_path / "acme.yaml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "the company does not fit: stream.max_consumers=3: a company of 2 agent seats needs room for 4 durable "
        "consumers on CREWLET_AGENT (each seat's inbox and control mailbox); raise stream.max_consumers "
        "(CREWLET_STREAM_MAX_CONSUMERS) to at least 4, or run fewer agent seats"
    ) in out
    assert READY_LINE not in out and "nats-server" not in out
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").glob("jetstream/**/CREWLET_AGENT"))
