"""Prompt caching through a real ``manage.py up``: marked cacheable, read back, recorded per round and billed.

A local server speaking Anthropic's Messages API (``prompt_cache_support``)
reports cache reads and writes the way Anthropic does. ada's instructions run
past the 1024 tokens a cacheable prefix needs, and a Slack DM wakes her into
a three-round turn (two read-only tool calls over a real stdio MCP server,
then the answer). The first round writes the prefix, the next two read it;
each round's ``cache_read_tokens``/``cache_write_tokens`` are what the server
reported, its ``input_tokens`` the input as billed, and the turn's totals,
``agent_turn_completed`` and ``/metrics`` carry the same counts.
"""
from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest

from prompt_cache_support import caching_anthropic
from tests.mcp_support import stdio_command
from tests.up_support import UpProcess, http_call, http_json, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "prompt-cache-up-operator-token-0123456789"
INSTRUCTIONS = " ".join(f"Rule {i}: check the runbook before you answer, and say where the answer came from." for i in range(90))


def company(base_url: str) -> str:
    return (
        "org: acme\n"
        "providers:\n  llm:\n"
        f"    - {{kind: anthropic, base_url: \"{base_url}\", model: claude-sonnet-4-5}}\n"
        f"mcp_servers:\n  tt: {{command: {json.dumps(stdio_command())}}}\n"
        "surfaces:\n  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}\n"
        "seats:\n"
        f"  - {{handle: ada, kind: agent, role: engineer, identities: {{slack: U0ADA}}, tools: [tt], instructions: \"{INSTRUCTIONS}\"}}\n"
        "  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}\n"
    )


def test_the_system_prompt_and_tools_are_cached_and_each_round_records_the_cached_tokens_and_bills_them(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("the deploy is on Friday")
    read = {"calls": [["tt__read_file", {"path": str(notes)}]]}
    with caching_anthropic(scripts={"ada": [read, read, {"text": "Friday"}]}) as server:
        (tmp_path / "acme.yaml").write_text(company(server.base_url))
        env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_SIGNING_SECRET="unused")
        with UpProcess(tmp_path, "--data-dir", str(tmp_path / "data"), "--company", str(tmp_path / "acme.yaml"), node="t1", env=env) as up:
            dm = {
                "type": "event_callback",
                "event_id": f"Ev{uuid.uuid4().hex[:10]}",
                "event": {"type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE",
                          "text": "<@U0ADA> when is the deploy?", "ts": "1718000000.000100"},
                "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
            }
            status, _ = http_json("POST", up.url + "/webhooks/slack", json.dumps(dm).encode(), {"Content-Type": "application/json"}, empty={})
            assert status == 202
            wait_until(lambda: up.events("agent_turn_completed", "ada"), 120, "ada's turn")
            [phase] = up.events("agent_phase_completed", "ada")
            [done] = up.events("agent_turn_completed", "ada")
            _, _, metrics = http_call("GET", up.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            assert up.terminate() == 0, up.output()
        usages, asked = server.usages, server.requests

    # Marked cacheable: the system prompt (one block) and the last tool definition, on every round.
    for body in asked:
        assert [b["cache_control"] for b in body["system"]] == [{"type": "ephemeral"}]
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert all("cache_control" not in t for t in body["tools"][:-1])
    # The server wrote the prefix on round 1 and read it on rounds 2 and 3.
    first, second, third = usages
    assert first["cache_creation_input_tokens"] > 1024 and first["cache_read_input_tokens"] == 0
    assert second["cache_read_input_tokens"] == third["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    # Each round records the raw cached counts and bills its input: reads at 0.1, writes at 1.25.
    rounds = phase["rounds"]
    assert [(r.get("cache_read_tokens", 0), r.get("cache_write_tokens", 0)) for r in rounds] == [
        (u["cache_read_input_tokens"], u["cache_creation_input_tokens"]) for u in usages
    ]
    billed = [
        u["input_tokens"] + math.ceil(u["cache_read_input_tokens"] * 0.1) + math.ceil(u["cache_creation_input_tokens"] * 1.25)
        for u in usages
    ]
    assert [r["input_tokens"] for r in rounds] == billed
    # The turn's totals, on the phase and on agent_turn_completed, and on /metrics.
    reads, writes = sum(u["cache_read_input_tokens"] for u in usages), sum(u["cache_creation_input_tokens"] for u in usages)
    for record in (phase, done):
        assert (record["input_tokens"], record["cache_read_tokens"], record["cache_write_tokens"]) == (sum(billed), reads, writes)
    lines = metrics.decode().splitlines()
    assert f'crewlet_llm_tokens_total{{kind="cache_read"}} {float(reads)}' in lines
    assert f'crewlet_llm_tokens_total{{kind="cache_write"}} {float(writes)}' in lines
    assert not done["failed"] and phase["response"] == "Friday"
