"""Coding runs through a real `manage.py up`, with scripted jobs in a real bubblewrap sandbox.

The echo model is the model: a message asking it to "please build" calls
``sandbox_run``; every other turn answers with its prompt, so what woke a
turn is read back from ``agent_phase_completed.user_prompt``. The jobs are
shell scripts the tests write; one waits for a file the test creates (in a
directory the sandbox sees read-only), so the run lasts exactly as long as
the test needs it to. Read back the way an operator reads it: ``/api/events``,
``/api/seats`` (the inbox's depth) and ``/api/sandbox/runs``.
"""
from __future__ import annotations

import itertools
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.up_support import UpProcess, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN = "sandbox-up-operator-token-0123456789abcdef"
_ts = itertools.count(1)
RUNS_TABLE = "seats_sandbox_sandboxrun"


def company(tmp: Path, script: str) -> Path:
    jobs, gate = tmp / "jobs", tmp / "gate"
    jobs.mkdir()
    gate.mkdir()
    (jobs / "job.sh").write_text(script.replace("GATE", str(gate)))
    path = tmp / "company.yaml"
    path.write_text(f"""\
org: acme
providers:
  llm:
    - kind: echo
      match: "please build"
      script:
        - {{calls: [{{tool: sandbox_run, arguments: {{task: "build the parser"}}}}]}}
        - {{answer: "on it"}}
sandbox:
  command: ["/bin/sh", "{jobs / 'job.sh'}"]
  read_only_paths: ["{jobs}", "{gate}"]
  time_limit_s: 600
surfaces:
  slack: {{signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}
# A later turn of the thread is given no episode: one would quote "please build" to the echo's match.
episodes: {{recent: 0}}
seats:
  - {{handle: ada, kind: agent, role: engineer, identities: {{slack: U0ADA}}, tools: [sandbox_run]}}
  - {{handle: grace, kind: human, role: lead, identities: {{slack: U0GRACE}}}}
""")
    return path


def say(up: UpProcess, text: str, thread: Optional[str] = None) -> str:
    """Grace writes to ada (in ``thread`` when given); the message's ts."""
    ts = f"1718000000.{next(_ts):06d}"
    event: dict[str, Any] = {
        "type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE", "text": f"<@U0ADA> {text}", "ts": ts,
    }
    if thread:
        event["thread_ts"] = thread
    body = {"type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex[:10]}", "event": event,
            "authorizations": [{"user_id": "U0ADA", "is_bot": True}]}
    assert up.call("/webhooks/slack", "POST", body)[0] == 202
    return ts


def prompts(up: UpProcess) -> list[str]:
    return [p["user_prompt"] for p in up.events("agent_phase_completed", "ada")]


def depth(up: UpProcess) -> Optional[int]:
    return next(s["depth"] for s in up.api("/api/seats")["seats"] if s["handle"] == "ada")


def ada_live(up: UpProcess) -> dict[str, Any]:
    """ada's row on the live projection, as the first frame of ``/ws/stream`` shows it to the dashboard."""
    from websockets.sync.client import connect

    url = up.url.replace("http://", "ws://") + "/ws/stream"
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, open_timeout=30) as ws:
        return next(row for row in json.loads(ws.recv(timeout=30))["seats"] if row["handle"] == "ada")


def launched(tmp: Path) -> UpProcess:
    """A node running the gated job's company, with ada's run launched and working."""
    company(tmp, WAITS_FOR_THE_GATE)
    up = start(tmp, "t1")
    say(up, "please build the parser")
    wait_until(lambda: up.events("sandbox_run_started", "ada"), 60, "the run started")
    return up


def start(tmp: Path, node: str) -> UpProcess:
    env = up_env(CREWLET_VAR_DIR=str(tmp / "data"), CREWLET_OPERATOR_TOKEN=TOKEN)
    return UpProcess(tmp, "--company", str(tmp / "company.yaml"), node=node, env=env).start()


WAITS_FOR_THE_GATE = """\
echo "started: $CREWLET_TASK in $(pwd)"
while [ ! -e GATE/open ]; do sleep 0.05; done
echo "finished: $CREWLET_TASK"
"""


def test_a_run_holds_the_seat_its_mail_waits_survives_a_kill_9_and_runs_after_the_completions_turn_in_order(
    tmp_path: Path,
) -> None:
    up = launched(tmp_path)
    try:
        say(up, "first while you are busy")
        say(up, "second while you are busy")
        wait_until(lambda: depth(up) == 2, 60, "both messages wait in ada's inbox")
        assert len(prompts(up)) == 1  # only the launching turn ran
        [run] = up.api("/api/sandbox/runs")["runs"]
        assert (run["status"], run["holds"], run["attempt"], run["node"]) == ("running", True, 1, "t1")
    finally:
        up.kill()  # kill -9 of the node mid-run: its job dies with it
    up = start(tmp_path, "t1")  # the seat's next holder: the node started again on its data
    try:
        wait_until(lambda: len(up.events("sandbox_run_started", "ada")) == 2, 60, "the new holder started the run again")
        assert depth(up) == 2  # the hold was taken before the inbox was attached: nothing ran
        live = ada_live(up)  # seeded from the coordination store's runs: the dashboard says why nothing runs
        assert (live["state"], live["reason"]) == ("held", "sandbox")
        [run] = up.api("/api/sandbox/runs")["runs"]
        assert (run["status"], run["holds"], run["attempt"], run["node"]) == ("running", True, 2, "t1")
        assert len(prompts(up)) == 1
        (tmp_path / "gate" / "open").touch()
        wait_until(lambda: any("second while you are busy" in p for p in prompts(up)), 90, "the waiting mail's turn")
        started = up.events("sandbox_run_started", "ada")
        [completed] = up.events("sandbox_run_completed", "ada")
        final = up.api(f"/api/sandbox/runs/{run['run_id']}")
        turns = prompts(up)
        assert depth(up) == 0
        assert up.terminate() == 0, up.output()
    finally:
        up.kill()
    log = up.output()

    # One conversation's mail that waited is worked in one turn (the batch), after the completion's turn.
    launch, told, *mail = turns
    assert "please build the parser" in launch
    assert f"Your coding run {run['run_id']} finished (succeeded, exit code 0)" in told and "finished: build the parser" in told
    waited = "\n".join(mail)
    assert waited.count("first while you are busy") == 1 and waited.count("second while you are busy") == 1
    assert waited.index("first while you are busy") < waited.index("second while you are busy")
    assert [s["run_id"] for s in started] == [run["run_id"]] * 2 and [s["payload"]["attempt"] for s in started] == [1, 2]
    assert all(s["task"] == "build the parser" for s in started)
    assert started[0]["work_key"] and started[0]["turn_id"]
    assert completed["outcome"] == "succeeded" and completed["duration_seconds"] > 0
    assert "started: build the parser in /work" in completed["result"]
    assert (final["status"], final["holds"], final["outcome"], final["result"]["exit_code"]) == ("ended", False, "succeeded", 0)
    assert "event=sandbox_hold_taken seat=ada" in log and "event=sandbox_hold_lifted seat=ada" in log


ASKS_TWICE = """\
echo "CREWLET-QUESTION: which branch?"
read branch
echo "building on $branch"
echo "CREWLET-QUESTION: ship it?"
read ship
echo "shipping: $ship"
"""


def rename_runs(tmp: Path, old: str, new: str) -> None:
    """Take the runs' table away from the running node (or give it back): its coordination store fails for them."""
    with sqlite3.connect(tmp / "data" / "crewlet.sqlite3", timeout=30) as db:
        db.execute(f"ALTER TABLE {old} RENAME TO {new}")


def test_a_run_asks_a_reply_that_cannot_be_recorded_waits_then_resumes_it_an_operator_answers_the_next_and_later_mail_is_ordinary(
    tmp_path: Path,
) -> None:
    company(tmp_path, ASKS_TWICE)
    up = start(tmp_path, "t1")
    try:
        root = say(up, "please build the parser")
        wait_until(lambda: up.events("sandbox_clarification_requested", "ada"), 60, "the run asked")
        wait_until(lambda: any("stopped to ask: which branch?" in p for p in prompts(up)), 60, "ada put the question")
        [run] = up.api("/api/sandbox/runs")["runs"]
        assert (run["status"], run["holds"], run["question"]) == ("parked", False, "which branch?")

        rename_runs(tmp_path, RUNS_TABLE, "runs_away")
        say(up, "use main", thread=root)
        up.wait_for("why=sandbox_answer_unrecorded", 60)  # handed back at the head, not NAK'd
        say(up, "and thanks for asking", thread=root)
        rename_runs(tmp_path, "runs_away", RUNS_TABLE)
        wait_until(lambda: len(up.events("sandbox_clarification_requested", "ada")) == 2, 60, "resumed, it asked again")
        wait_until(lambda: any("stopped to ask: ship it?" in p for p in prompts(up)), 60, "ada put the second question")

        assert up.call("/api/sandbox/runs/run-nope/answer", "POST", {"answer": "yes"})[0] == 404
        refused = up.call(f"/api/sandbox/runs/{run['run_id']}/answer", "POST", {"answer": ""})
        assert refused[0] == 400 and refused[1]["param"] == "answer"
        status, accepted = up.call(f"/api/sandbox/runs/{run['run_id']}/answer", "POST", {"answer": "yes"})
        assert status == 202 and accepted["seat"] == "ada"
        wait_until(lambda: up.events("sandbox_run_completed", "ada"), 60, "the run completed")
        wait_until(lambda: any("shipping: yes" in p for p in prompts(up)), 60, "ada was told the result")
        status, late = up.call(f"/api/sandbox/runs/{run['run_id']}/answer", "POST", {"answer": "too late"})
        assert status == 202
        wait_until(lambda: len(up.events("sandbox_run_answered", "ada")) == 3, 60, "the late answer's outcome")
        say(up, "what is next?", thread=root)
        wait_until(lambda: any("what is next?" in p for p in prompts(up)), 60, "the next message is an ordinary turn")
        asked = up.events("sandbox_clarification_requested", "ada")
        answered = up.events("sandbox_run_answered", "ada")
        [completed] = up.events("sandbox_run_completed", "ada")
        turns = prompts(up)
        assert up.terminate() == 0, up.output()
    finally:
        up.kill()

    assert [(a["question"], a["run_id"]) for a in asked] == [("which branch?", run["run_id"]), ("ship it?", run["run_id"])]
    assert asked[0]["asked_in"] == run["work_key"]
    assert [(a["outcome"], a["route"]) for a in answered] == [("resumed", "chat"), ("resumed", "operator"), ("gone", "operator")]
    assert answered[0]["answered_by"] and answered[1]["answered_by"]
    assert "building on <@U0ADA> use main\nshipping: yes" in completed["result"]  # the reply as written, then the operator's
    # "use main" went to the run, never a turn; "and thanks for asking" waited behind the run and was then worked as mail.
    assert not any(p.endswith("use main") for p in turns)
    assert sum("and thanks for asking" in p for p in turns) == 1


def test_a_paused_seat_is_told_of_its_runs_ending_once_resumed_and_a_run_that_cannot_start_fails_and_is_told(
    tmp_path: Path,
) -> None:
    up = launched(tmp_path)
    try:
        assert up.call("/api/seats/ada/pause", "POST", {"reason": "lunch"})[0] == 200
        (tmp_path / "gate" / "open").touch()
        up.wait_for("event=sandbox_wake_deferred seat=ada", 60)
        assert len(prompts(up)) == 1 and up.events("sandbox_run_completed", "ada")  # ended, and nobody told while paused
        assert up.call("/api/seats/ada/resume", "POST", {})[0] == 200
        wait_until(lambda: any("finished: build the parser" in p for p in prompts(up)), 60, "told once resumed")

        (tmp_path / "gate" / "open").unlink()
        (tmp_path / "gate").rmdir()  # a path the sandbox binds is gone: the next run cannot start on this node
        say(up, "please build it again")
        [failed] = wait_until(lambda: up.events("sandbox_run_failed", "ada"), 60, "the run failed to start")
        wait_until(lambda: any("failed: the sandbox could not start" in p for p in prompts(up)), 60, "ada was told")
        runs = up.api("/api/sandbox/runs?seat=ada")["runs"]
        assert up.terminate() == 0, up.output()
    finally:
        up.kill()

    assert failed["run_id"] == runs[0]["run_id"] and "does not exist on this node" in failed["error"] and failed["ended_at"]
    assert [(r["status"], r["outcome"], r["holds"]) for r in runs] == [("ended", "failed", False), ("ended", "succeeded", False)]
