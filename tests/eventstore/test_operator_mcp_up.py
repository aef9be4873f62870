"""``/operator/mcp`` inside a real ``up``: the official MCP client lists and calls the operator's tools.

One ``up`` (SQLite, the example company, an embedded broker) serves every check:
the gate refuses no token, an unknown one and the metrics-only one with a
reason; with the operator token the SDK's ``ClientSession`` over streamable HTTP
lists the tools (reads marked ``readOnlyHint``), reads seats and events, and
each acting call — done or refused — is exactly one ``operator_acted`` row
(transport ``mcp``, the token's name, never the arguments), read back through
``/api/events``.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Optional

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from crewlet.http.auth import SEEDED_TOKEN_NAME
from eventstore import actions as ops
from eventstore.console import operator_mcp as om
from tests.up_support import UpProcess, http_json, up_env
from waiting_support import wait_until

TOKEN = "operator-mcp-up-test-token-0123456789"
METRICS_TOKEN = "operator-mcp-metrics-only-token-0123456789"

READ_TOOLS = {
    "seats_list", "events_list", "event_get", "trace_get", "turns_list", "turn_get", "dead_letters_list", "seat_memory",
}


def _acted(up: UpProcess) -> list[dict[str, Any]]:
    return up.events("operator_acted")


async def _session_calls(url: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[Any]]:
    """List the tools, then make ``calls`` in order, over one SDK client session; (the tools, each call's result)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                tools = await session.list_tools()
                results = [await session.call_tool(name, args) for name, args in calls]
    return tools, results


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_official_client_operates_the_company_and_every_acting_call_is_one_operator_acted(tmp_path: Path) -> None:
    env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_METRICS_TOKEN=METRICS_TOKEN)
    with UpProcess(tmp_path, "--data-dir", str(tmp_path / "data"), node="m1", env=env, ready_s=90) as up:
        url = up.url + om.MCP_PATH
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        body = json.dumps(hello).encode()
        for headers, status, detail in (
            ({}, 401, "a Bearer token is required"),
            ({"Authorization": "Bearer not-a-token-of-ours-0123456789"}, 401, om.UNKNOWN_TOKEN),
            ({"Authorization": f"Bearer {METRICS_TOKEN}"}, 403, om.METRICS_ONLY),
        ):
            got, answer = http_json("POST", url, body, {"Content-Type": "application/json", **headers}, empty={})
            assert (got, detail in answer["detail"]) == (status, True), answer
        assert _acted(up) == []  # a refused gate ran no tool

        seats = up.api("/api/seats/")["seats"]
        agent = next(s["handle"] for s in seats if s.get("kind", "agent") == "agent")
        calls: list[tuple[str, dict[str, Any]]] = [
            ("seats_list", {}),
            ("events_list", {"limit": 5}),
            ("dead_letters_list", {}),
            ("event_get", {"event_id": "no-such-event"}),
            (om.TOOL_SEAT_PAUSE, {"handle": agent, "reason": "secret-reason-never-audited"}),
            (om.TOOL_SEAT_PAUSE, {"handle": agent}),
            (om.TOOL_SEAT_RESUME, {"handle": agent}),
            (om.TOOL_SEAT_PAUSE, {"handle": "nobody-here"}),
            (om.TOOL_DEAD_LETTER_REPLAY, {"ref": "999999"}),
            (om.TOOL_REVISION_ACTIVATE, {"revision": 424242}),
        ]
        tools, results = asyncio.run(_session_calls(url, calls))

        listed = {tool.name: tool.annotations for tool in tools.tools}
        assert set(listed) == READ_TOOLS | om.ACTING_TOOLS
        assert all(listed[name].read_only_hint is True for name in READ_TOOLS)
        assert all(listed[name].read_only_hint is False for name in om.ACTING_TOOLS)

        read_seats, read_events, read_letters, no_event, paused, again, resumed, unknown, gone, no_revision = results
        assert not read_seats.is_error and {s["handle"] for s in json.loads(_text(read_seats))["seats"]} >= {agent}
        assert not read_events.is_error and "events" in json.loads(_text(read_events))
        assert json.loads(_text(read_letters))["dead_letters"] == []
        assert no_event.is_error and "404 not_found: no such event" in _text(no_event)  # the route's refusal, as a tool error
        assert (json.loads(_text(paused))["changed"], json.loads(_text(again))["changed"]) == (True, False)
        assert json.loads(_text(resumed))["changed"] is True
        assert unknown.is_error and "nobody-here" in _text(unknown)
        assert gone.is_error and ops.REFUSAL_GONE in _text(gone)
        assert no_revision.is_error and om.REFUSAL_NO_REVISION in _text(no_revision)

        def six_rows() -> Optional[list[dict[str, Any]]]:
            rows = _acted(up)
            return rows if len(rows) >= 6 else None

        rows = wait_until(six_rows, 30.0, "six operator_acted rows", 0.1)
        assert len(rows) == 6  # one per acting call, none for a read
        data = rows  # the wire form carries the body's fields at its top
        assert [(d["tool"], d["outcome"], d["refusal"]) for d in data] == [
            (om.TOOL_SEAT_PAUSE, om.OUTCOME_CHANGED, ""),
            (om.TOOL_SEAT_PAUSE, om.OUTCOME_UNCHANGED, ""),
            (om.TOOL_SEAT_RESUME, om.OUTCOME_CHANGED, ""),
            (om.TOOL_SEAT_PAUSE, ops.OUTCOME_REFUSED, "not_found"),
            (om.TOOL_DEAD_LETTER_REPLAY, ops.OUTCOME_REFUSED, ops.REFUSAL_GONE),
            (om.TOOL_REVISION_ACTIVATE, ops.OUTCOME_REFUSED, om.REFUSAL_NO_REVISION),
        ]
        assert {(d["transport"], d["token"]) for d in data} == {(ops.TRANSPORT_MCP, SEEDED_TOKEN_NAME)}
        assert len({d["request_id"] for d in data}) == 6 and {row["source"] for row in rows} == {"operator"}
        assert "secret-reason-never-audited" not in json.dumps(rows) and "999999" not in json.dumps(rows)

        assert up.terminate() == 0
        assert "Traceback" not in up.output() and "was destroyed but it is pending" not in up.output()
