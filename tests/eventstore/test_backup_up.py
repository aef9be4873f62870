"""Backup and restore through real ``manage.py up`` processes on SQLite and the embedded broker.

ada is paused, so the two DMs grace sends wait in her inbox (mailbox depth 2)
beside the history the node stored. ``manage.py backup`` asks the running
node (``POST /backup``) for a copy; bad directories are refused before
anything is written. The node is stopped, its data directory wiped, ``manage.py
restore`` puts the copy back, and a new ``up`` on the same directory finds the
same mail waiting and the same history.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.process_support import REPO_ROOT
from tests.up_support import UpProcess, http_call, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "backup-up-operator-token-0123456789abcdef"
COMPANY = (
    "org: acme\nproviders:\n  llm:\n    - {kind: openai, base_url: \"http://127.0.0.1:9\", model: local-7b}\n"
    "surfaces:\n  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}\n"
    "seats:\n"
    "  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA}}\n"
    "  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}\n"
)
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def say(up: UpProcess, text: str) -> None:
    body = json.dumps({
        "type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex[:10]}",
        "event": {"type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE", "text": f"<@U0ADA> {text}",
                  "ts": f"1718000000.{uuid.uuid4().int % 10**6:06d}"},
        "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
    }).encode()
    status, _ = http_json("POST", up.url + "/webhooks/slack", body, {"Content-Type": "application/json"}, empty={})
    assert status == 202


def depth(up: UpProcess) -> float:
    status, _, body = http_call("GET", up.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    found = [line.split()[-1] for line in body.decode().splitlines() if line.startswith('crewlet_mailbox_depth{seat="ada"}')]
    return float(found[0]) if found else -1.0


def history(up: UpProcess) -> dict[str, str]:
    """Every stored event: id -> type."""
    return {row["id"]: row["type"] for row in up.api("/api/events?limit=500")["events"]}


def post_backup(up: UpProcess, body: dict[str, Any], headers: dict[str, str] = AUTH) -> tuple[int, Any]:
    return http_json("POST", up.url + "/backup", json.dumps(body).encode(), headers)


def manage(tmp: Path, data: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *argv], cwd=tmp, env=up_env(CREWLET_VAR_DIR=str(data)),
        capture_output=True, text=True, timeout=120,
    )


def test_a_backup_restored_into_a_wiped_data_dir_brings_back_the_waiting_mail_and_the_history(tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "copy"
    (tmp_path / "acme.yaml").write_text(COMPANY)
    env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused")
    argv = ("--data-dir", str(data), "--company", str(tmp_path / "acme.yaml"))
    with UpProcess(tmp_path, *argv, node="bk1", env=env) as up:
        status, _ = post_backup(up, {}, headers={"Content-Type": "application/json"})
        assert status == 401
        status, _ = http_json("POST", up.url + "/api/seats/ada/pause", json.dumps({"reason": "backup drill"}).encode(), AUTH)
        assert status == 200
        say(up, "first: when is the deploy?")
        say(up, "second: and the release notes?")
        wait_until(lambda: depth(up) == 2, 60, "two DMs waiting in paused ada's mailbox")
        wait_until(lambda: "seat_paused" in history(up).values(), 60, "the pause stored")
        before = history(up)

        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "x").write_text("x")
        refusals = {
            "relative": post_backup(up, {"dir": "backups/today"}),
            "not empty": post_backup(up, {"dir": str(tmp_path / "full")}),
            "no parent": post_backup(up, {"dir": str(tmp_path / "nowhere" / "deep")}),
            "unknown field": post_backup(up, {"dir": str(copy), "to": "x"}),
            "not a string": post_backup(up, {"dir": 7}),
        }
        for why, (status, body) in refusals.items():
            assert status == 400, (why, body)
        assert refusals["relative"][1]["param"] == "dir" and "absolute" in refusals["relative"][1]["reason"]
        assert "not empty" in refusals["not empty"][1]["reason"]
        assert refusals["unknown field"][1]["param"] == "to"
        assert not copy.exists()

        done = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), "backup", str(copy), "--url", up.url, "--token", TOKEN],
            cwd=tmp_path, env=up_env(), capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert f"to {copy}" in done.stdout and "2 stores" in done.stdout
        [requested] = wait_until(lambda: up.events("backup_requested"), 60, "the backup recorded")
        assert requested["finished"] is True and requested["dir"] == str(copy)
        assert requested["streams"] >= 2 and requested["token"]
        assert sorted(p.name for p in copy.iterdir()) == ["manifest.json", "stores", "streams"]

        refused = manage(tmp_path, data, "restore", str(copy))  # into the live node's data dir
        assert refused.returncode != 0 and "already holds" in refused.stderr, refused.stderr
    shutil.rmtree(data)

    for bad, says in (("relative/copy", "absolute"), (str(tmp_path / "full"), "manifest.json")):
        refused = manage(tmp_path, data, "restore", bad)
        assert refused.returncode != 0 and says in refused.stderr, refused.stderr
    restored = manage(tmp_path, data, "restore", str(copy))
    assert restored.returncode == 0, restored.stderr
    assert f"restored {requested['streams']} streams" in restored.stdout

    with UpProcess(tmp_path, *argv, node="bk1", env=env) as again:
        wait_until(lambda: depth(again) == 2, 60, "the same two DMs waiting in ada's mailbox")
        after = history(again)
        assert before.items() <= after.items()
        assert "backup_requested" not in after.values()  # published once the copy had finished
        [ada] = [seat for seat in again.api("/api/seats/")["seats"] if seat["handle"] == "ada"]
        assert ada["paused"] is True and ada["reason"] == "backup drill" and ada["depth"] == 2
