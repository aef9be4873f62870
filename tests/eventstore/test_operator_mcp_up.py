"""``/operator/mcp`` inside a real ``up``: the official MCP client lists and calls the operator's tools.

One ``up`` (SQLite, the example company, a real nats-server the test runs, so
it can bury bytes no event decodes from in ada's inbox) serves every check: the
gate refuses no token, an unknown one and the metrics-only one with a reason;
with the operator token the SDK's ``ClientSession`` over streamable HTTP lists
the tools (reads marked ``readOnlyHint``), reads seats, events and the dead
letter, and each acting call — done or refused — is exactly one
``operator_acted`` row (transport ``mcp``, the token's name, never the
arguments), read back through ``/api/events``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from crewlet.events.types import MessageDeadLettered
from crewlet.http.auth import SEEDED_TOKEN_NAME
from crewlet.queue import topics
from eventstore import actions as ops
from eventstore.console import operator_mcp as om
from seats.steering import NO_RUNNING_TURN
from seats_support import publish_raw, subscribed_on
from tests.browser_support import LoopThread
from tests.up_support import UpProcess, http_json, up_env
from waiting_support import wait_until

TOKEN = "operator-mcp-up-test-token-0123456789"
METRICS_TOKEN = "operator-mcp-metrics-only-token-0123456789"
SEAT = "ada"

READ_TOOLS = {
    "seats_list", "events_list", "event_get", "trace_get", "turns_list", "turn_get", "dead_letters_list", "seat_memory",
    "sandbox_runs",
}


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def _operate(url: str) -> dict[str, Any]:
    """Over one SDK client session: list the tools, read, then act; each answer by name."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    got: dict[str, Any] = {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                got["tools"] = await session.list_tools()
                got["seats"] = await session.call_tool("seats_list", {})
                got["events"] = await session.call_tool("events_list", {"limit": 5})
                got["no_event"] = await session.call_tool("event_get", {"event_id": "no-such-event"})
                got["letters"] = await session.call_tool("dead_letters_list", {})
                got["runs"] = await session.call_tool("sandbox_runs", {"seat": SEAT})
                ref = json.loads(_text(got["letters"]))["dead_letters"][0]["ref"]
                for name, tool, args in (
                    ("paused", om.TOOL_SEAT_PAUSE, {"handle": SEAT, "reason": "secret-reason-never-audited"}),
                    ("again", om.TOOL_SEAT_PAUSE, {"handle": SEAT}),
                    ("resumed", om.TOOL_SEAT_RESUME, {"handle": SEAT}),
                    ("unknown", om.TOOL_SEAT_PAUSE, {"handle": "nobody-here"}),
                    ("no_turn", om.TOOL_SEAT_STEER, {"handle": SEAT, "note": "secret-note-never-audited"}),
                    ("replayed", om.TOOL_DEAD_LETTER_REPLAY, {"ref": ref}),
                    ("gone", om.TOOL_DEAD_LETTER_REPLAY, {"ref": ref}),
                    ("no_revision", om.TOOL_REVISION_ACTIVATE, {"revision": 424242}),
                    ("zero", om.TOOL_REVISION_ACTIVATE, {"revision": 0}),
                    ("active", om.TOOL_REVISION_ACTIVATE, {"revision": 1}),  # the file up imported: already active
                    ("no_run", om.TOOL_SANDBOX_ANSWER, {"run_id": "run-0123456789abcdef", "answer": "secret-answer"}),
                ):
                    got[name] = await session.call_tool(tool, args)
    return got


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_official_client_operates_the_company_and_every_acting_call_is_one_operator_acted(tmp_path: Path) -> None:
    from crewlet.queue.broker import EmbeddedBroker

    loop = LoopThread()
    broker = EmbeddedBroker(store_dir=tmp_path / "jetstream")
    loop.run(broker.start())
    env = up_env(
        CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_METRICS_TOKEN=METRICS_TOKEN,
        CREWLET_STREAM_TYPE="nats", CREWLET_STREAM_URL=broker.url, CREWLET_VAR_DIR=str(tmp_path / "data"),
    )
    try:
        with UpProcess(tmp_path, node="m1", env=env, ready_s=90) as up:
            url = up.url + om.MCP_PATH
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
            for headers, status, detail in (
                ({}, 401, "a Bearer token is required"),
                ({"Authorization": "Bearer not-a-token-of-ours-0123456789"}, 401, om.UNKNOWN_TOKEN),
                ({"Authorization": f"Bearer {METRICS_TOKEN}"}, 403, om.METRICS_ONLY),
            ):
                code, answer = http_json("POST", url, body, {"Content-Type": "application/json", **headers}, empty={})
                assert (code, detail in answer["detail"]) == (status, True), answer
            assert up.events("operator_acted") == []  # a refused request ran no tool

            # Bytes no event decodes from, buried by up's own seat loop: the dead letter the tools see and replay.
            inbox = topics.agent_inbox(SEAT)
            wait_until(lambda: loop.run(subscribed_on(broker.url, inbox)), 60.0, "up's subscription on ada's inbox", 0.1)
            loop.run(publish_raw(broker.url, inbox, b"\xff this is no event"))
            wait_until(lambda: up.events(MessageDeadLettered.event_type), 60.0, "the burial in /api/events", 0.1)

            got = loop.run(_operate(url), timeout_s=120.0)

            listed = {tool.name: tool.annotations for tool in got["tools"].tools}
            assert set(listed) == READ_TOOLS | om.ACTING_TOOLS
            assert all(listed[name].read_only_hint is True for name in READ_TOOLS)
            assert all(listed[name].read_only_hint is False for name in om.ACTING_TOOLS)

            assert SEAT in {s["handle"] for s in json.loads(_text(got["seats"]))["seats"]}
            assert "events" in json.loads(_text(got["events"]))
            assert got["no_event"].is_error and "404 not_found: no such event" in _text(got["no_event"])
            (letter,) = json.loads(_text(got["letters"]))["dead_letters"]
            assert (letter["topic"], letter["type"]) == (inbox, "unreadable")
            assert (json.loads(_text(got["paused"]))["changed"], json.loads(_text(got["again"]))["changed"]) == (True, False)
            assert json.loads(_text(got["resumed"]))["changed"] is True
            assert got["unknown"].is_error and "nobody-here" in _text(got["unknown"])
            assert got["no_turn"].is_error and f"409 conflict: seat '{SEAT}' {NO_RUNNING_TURN}" in _text(got["no_turn"])
            assert json.loads(_text(got["replayed"]))["topic"] == inbox
            assert got["gone"].is_error and ops.REFUSAL_GONE in _text(got["gone"])
            assert got["no_revision"].is_error and om.REFUSAL_NO_REVISION in _text(got["no_revision"])
            assert got["zero"].is_error and "revision=0 is out of range" in _text(got["zero"])
            assert json.loads(_text(got["active"])) == {"changed": False, "revision": 1}
            assert json.loads(_text(got["runs"])) == {"runs": []}
            assert got["no_run"].is_error and "404 not_found: no coding run 'run-0123456789abcdef'" in _text(got["no_run"])

            def audited() -> Optional[list[dict[str, Any]]]:
                rows = up.events("operator_acted")
                return rows if len(rows) >= 11 else None

            rows = wait_until(audited, 30.0, "eleven operator_acted rows", 0.1)
            # One per acting call, none for a read; the wire form carries the body's fields at its top.
            assert [(r["tool"], r["outcome"], r["refusal"]) for r in rows] == [
                (om.TOOL_SEAT_PAUSE, om.OUTCOME_CHANGED, ""),
                (om.TOOL_SEAT_PAUSE, om.OUTCOME_UNCHANGED, ""),
                (om.TOOL_SEAT_RESUME, om.OUTCOME_CHANGED, ""),
                (om.TOOL_SEAT_PAUSE, ops.OUTCOME_REFUSED, "not_found"),
                (om.TOOL_SEAT_STEER, ops.OUTCOME_REFUSED, "conflict"),
                (om.TOOL_DEAD_LETTER_REPLAY, ops.OUTCOME_REPLAYED, ""),
                (om.TOOL_DEAD_LETTER_REPLAY, ops.OUTCOME_REFUSED, ops.REFUSAL_GONE),
                (om.TOOL_REVISION_ACTIVATE, ops.OUTCOME_REFUSED, om.REFUSAL_NO_REVISION),
                (om.TOOL_REVISION_ACTIVATE, ops.OUTCOME_REFUSED, ops.REFUSAL_BAD_ARGS),
                (om.TOOL_REVISION_ACTIVATE, om.OUTCOME_UNCHANGED, ""),
                (om.TOOL_SANDBOX_ANSWER, ops.OUTCOME_REFUSED, "not_found"),
            ]
            assert {(r["transport"], r["token"], r["source"]) for r in rows} == {
                (ops.TRANSPORT_MCP, SEEDED_TOKEN_NAME, "operator")
            }
            assert len({r["request_id"] for r in rows}) == 11 and rows[5]["position"] == inbox
            assert "secret-reason-never-audited" not in json.dumps(rows)  # never the arguments
            assert "secret-note-never-audited" not in json.dumps(rows) and "secret-answer" not in json.dumps(rows)

            assert up.terminate() == 0
            assert "Traceback" not in up.output() and "was destroyed but it is pending" not in up.output()
    finally:
        loop.run(broker.stop())
        loop.close()
