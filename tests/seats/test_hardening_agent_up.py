"""What a model says cannot lose history, drop a request or leak a key: through a real `manage.py up`, on both databases.

A local OpenAI-compatible server stands in for the vendor and answers by the
trigger's words: an auth error that quotes the key (with a NUL and a forged
log line in it), an answer holding a NUL and a lone surrogate, and an
``a2a_ask`` whose brief holds both. Each DM is its own conversation; what is
asserted is read back as an operator reads it, through ``/api/events`` and the
node's own log.
"""
from __future__ import annotations

import json
import os
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, Optional

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from tests.browser_support import slack_message
from seats_support import json_vendor
from tests.up_support import ADA_ASKS_LINUS_ON_SLACK, UpProcess, http_call, http_json, openai_company, pg_client_env, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "hardening-agent-operator-token-0123456789abcdef"
API_KEY = "sk-test-Zq8TnWm4yKp2Lr7Vx1Hc9Bd3Fg6Js0Qa"
FORGED = "level=critical event=forged_by_the_provider"
#: What the vendor answers a wrong key with, the key quoted, a NUL and a line of its own inside.
KEY_ERROR = f"Incorrect API key provided: {API_KEY}.\x00 You can find your key at https://example.invalid\n{FORGED}"
ODD_ANSWER = "the build is green \x00 and \ud800 that is all"
ODD_BRIEF = "is the deploy \x00 green \ud800 today?"
COMPANY = openai_company("BASE_URL", "HARDENING_OPENAI_KEY", 20) + ADA_ASKS_LINUS_ON_SLACK


def _completion(content: Optional[str], calls: list[tuple[str, dict[str, Any]]] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)
        ]
    return {
        "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }


def answer_for(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The vendor's answer, by what the conversation says (json.dumps escapes NUL and the surrogate on the wire)."""
    texts = " ".join(str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") in ("user", "tool"))
    if "wrong key" in texts:
        return 401, {"error": {"message": KEY_ERROR, "type": "invalid_request_error", "code": "invalid_api_key"}}
    if "odd answer" in texts:
        return 200, _completion(ODD_ANSWER)
    if "deploy" in texts and "linus says" in texts:
        return 200, _completion("thanks, linus")
    if "deploy" in texts and any(m.get("role") == "tool" for m in body.get("messages", [])):
        return 200, _completion("asked linus")
    if "ask linus" in texts:
        return 200, _completion(None, [("a2a_ask", {"to": "linus", "brief": ODD_BRIEF})])
    if "deploy" in texts:
        return 200, _completion("linus says the deploy is green")
    return 200, _completion("hello")


@pytest.fixture
def vendor() -> Iterator[str]:
    with json_vendor(answer_for) as base_url:
        yield base_url


def _pg_env(name: str) -> dict[str, str]:
    """A fresh pair of PostgreSQL databases for one `up`, on the server bin/test started."""
    conn = {
        "host": os.environ.get("CREWLET_PG_HOST", "/var/run/postgresql"),
        "port": os.environ.get("CREWLET_PG_PORT") or None,
        "user": os.environ.get("CREWLET_PG_USER") or None,
        "password": os.environ.get("CREWLET_PG_PASSWORD") or None,
    }
    base = os.environ.get("CREWLET_PG_DBNAME", "crewlet") + "_" + name
    with psycopg.connect(dbname="postgres", autocommit=True, **conn) as admin:
        for db in (base, base + "_events"):
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{db}"')
    return {"CREWLET_DATABASE": "postgres", "CREWLET_PG_DBNAME": base, "CREWLET_PG_EVENTS_DBNAME": base + "_events", **pg_client_env()}


def _api(up: UpProcess, path: str) -> Any:
    status, answer = http_json("GET", up.url + path, None, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, (path, status, answer)
    return answer


def _dm(up: UpProcess, text: str) -> str:
    """A Slack DM from grace to ada in a channel of its own; the delivery's trace."""
    channel = "D" + uuid.uuid4().hex[:10].upper()
    payload = slack_message(f"Ev{uuid.uuid4().hex[:12]}", text)
    payload["event"]["channel"] = channel
    status, answer = http_json("POST", up.url + "/webhooks/slack", json.dumps(payload).encode(), {"Content-Type": "application/json"})
    assert status == 202, answer
    return str(answer["trace_id"])


def _events(up: UpProcess, **filters: str) -> list[dict[str, Any]]:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    return list(_api(up, f"/api/events?{query}")["events"])


def _wire(up: UpProcess, row: dict[str, Any]) -> dict[str, Any]:
    return dict(_api(up, f"/api/events/{row['id']}")["event"]["wire"])


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_odd_bytes_and_a_quoted_key_from_the_model_lose_no_record_and_leak_nothing(
    database: str, vendor: str, tmp_path: Path
) -> None:
    (tmp_path / "acme.yaml").write_text(COMPANY.replace("BASE_URL", vendor))
    env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused-signing-secret", HARDENING_OPENAI_KEY=API_KEY)
    if database == "postgres":
        env.update(_pg_env("hardening_agent"))
    with UpProcess(tmp_path, "--data-dir", str(tmp_path / "data"), "--company", str(tmp_path / "acme.yaml"), node="agent1", env=env) as up:
        wrong = _dm(up, "wrong key please")
        wait_until(lambda: _events(up, trace_id=wrong, type="llm_unavailable"), timeout_s=60, what="the failed turn on record")
        odd = _dm(up, "odd answer please")
        done = wait_until(lambda: _events(up, trace_id=odd, type="agent_turn_completed"), timeout_s=60, what="the odd answer's turn")
        assert done[0]["failed"] is False
        phase = _wire(up, _events(up, trace_id=odd, type="agent_phase_completed")[0])
        assert phase["response"] == ODD_ANSWER.replace("\x00", "\\u0000").replace("\ud800", "\\ud800")

        ask = _dm(up, "ask linus about the deploy")
        wait_until(
            lambda: any(r["seat"] == "ada" and not r["failed"] for r in _events(up, type="agent_turn_completed"))
            and len(_events(up, type="a2a_channel_closed")) == 1,
            timeout_s=90, what="linus answered ada's ask and ada's answer turn closed it",
        )
        opened = [_wire(up, r) for r in _events(up, type="a2a_channel_opened")]
        assert [o["brief"] for o in opened] == [ODD_BRIEF.replace("\x00", "\\u0000").replace("\ud800", "\\ud800")]
        assert _events(up, type="message_dead_lettered") == []

        # The failed turn's record names the failure, never the key; the store kept writing behind it.
        failure = _wire(up, _events(up, trace_id=wrong, type="llm_unavailable")[0])
        assert "Incorrect API key provided" in failure["error"] and API_KEY not in failure["error"]
        pages = json.dumps([_api(up, "/api/events?limit=500"), [_wire(up, r) for r in _events(up, trace_id=wrong)]])
        assert API_KEY not in pages
        status, _, metrics = http_call("GET", up.url + "/metrics", None, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and b"crewlet_eventstore_rows_refused_total 0.0" in metrics
        wait_until(lambda: _events(up, trace_id=wrong, type="agent_turn_completed"), timeout_s=60, what="the failed turn closed")
    log = up.output()
    assert API_KEY not in log
    assert not any(line.startswith(FORGED) for line in log.splitlines()), "a provider's words forged a log line"
    assert "\x00" not in log


# -- a fuzzing pass: what a model or its vendor may say, through a real `up` ----------------------------

#: Characters that have cost a record before: NUL, lone surrogates of both halves, line breaks, a log line's shape.
NASTY = st.sampled_from(["\x00", "\ud800", "\udfff", "\n", "\r\n", "\u2028", '"', "\\", "level=critical ", API_KEY, "\x1b[31m"])
TEXT = st.lists(st.one_of(NASTY, st.text(max_size=40)), max_size=30).map("".join)
#: Padding: none, a long answer, or a JSON-looking nest (the store and the wire must take all three).
PAD = st.one_of(
    st.just(""),
    st.integers(min_value=100_000, max_value=2_000_000).map(lambda n: "z" * n),
    st.integers(min_value=1, max_value=400).map(lambda n: "[" * n + "]" * n),
)
#: What the model or its vendor says: free text around at least two of the characters that cost a record.
SAID = st.tuples(TEXT, st.lists(NASTY, min_size=2, max_size=6), PAD).map(lambda t: t[0] + "".join(t[1]) + t[2])
CASE = st.one_of(
    st.tuples(st.just("answer"), SAID),
    st.tuples(st.just("tool"), SAID),
    st.tuples(st.sampled_from(["401", "429", "500", "400"]), SAID),
)
#: The fuzz cases the vendor answers, by the marker each DM carries.
FUZZ: dict[str, tuple[str, str]] = {}


def fuzz_answer(body: dict[str, Any]) -> Optional[tuple[int, dict[str, Any]]]:
    texts = " ".join(str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") == "user")
    marker = next((w for w in texts.split() if w.startswith("fuzz-")), "")
    if marker not in FUZZ:
        return None
    kind, said = FUZZ[marker]
    if kind == "answer":
        return 200, _completion(said)
    if kind == "tool":
        if any(m.get("role") == "tool" for m in body.get("messages", [])):
            return 200, _completion(said[:1000])  # the tool's error read, the turn ends
        return 200, _completion(None, [("no_such_tool", {"said": said})])
    return int(kind), {"error": {"message": said, "type": "fuzz", "code": kind}}


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fuzzed_up(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    env = up_env(
        CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused-signing-secret", HARDENING_OPENAI_KEY=API_KEY,
        # A failing delivery spends its whole budget in about a second, so its dead letter is part of the case.
        CREWLET_DELIVERY_BACKOFF_BASE_S="0.01", CREWLET_DELIVERY_BACKOFF_CAP_S="0.02",
        # A 429 or 500 is retried within the round first: its waits shrunk alike, through the same code.
        CREWLET_DELIVERY_PROVIDER_RETRY_SCALE="0.001",
    )
    if request.param == "postgres":
        env.update(_pg_env("hardening_fuzz"))
    with json_vendor(lambda body: fuzz_answer(body) or answer_for(body)) as base_url:
        (tmp / "acme.yaml").write_text(COMPANY.replace("BASE_URL", base_url))
        with UpProcess(tmp, "--data-dir", str(tmp / "data"), "--company", str(tmp / "acme.yaml"), node="fuzz1", env=env) as up:
            yield up


@pytest.mark.timeout(600)
@hsettings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=CASE)
def test_fuzzed_model_answers_and_errors_are_answered_once_or_dead_lettered_with_their_reason_and_leak_nothing(
    fuzzed_up: UpProcess, case: tuple[str, str]
) -> None:
    up = fuzzed_up
    marker = f"fuzz-{uuid.uuid4().hex[:10]}"
    FUZZ[marker] = case
    trace = _dm(up, marker)
    if case[0] in ("answer", "tool"):
        done = wait_until(lambda: _events(up, trace_id=trace, type="agent_turn_completed"), timeout_s=60, what=f"{case[0]} answered")
        assert [r["failed"] for r in done] == [False], done
    else:
        buried = wait_until(
            lambda: _events(up, trace_id=trace, type="message_dead_lettered"), timeout_s=90, what="the failing delivery's dead letter"
        )
        assert [_wire(up, r)["reason"] for r in buried] == ["max_deliveries"]
    rows = _api(up, f"/api/events?trace_id={trace}&limit=500")["events"]
    assert rows and all(_wire(up, r) for r in rows[:5])  # every row reads back
    log = up.output_so_far()
    assert API_KEY not in log and API_KEY not in json.dumps(rows)
    assert not any(line.startswith("level=critical ") for line in log.splitlines())
