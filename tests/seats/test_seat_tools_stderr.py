"""A stdio MCP server's stderr reaches the node's log as one redacted, bounded ``tool_server_stderr`` record per line.

In process through :class:`McpToolbox` (the records as logging gets them,
and the test process's own file descriptor 2, which an inherited stderr would
write to), then through ``manage.py up`` in both log formats, where a server
that prints a key, a NUL and a line with no end, and one whose start-up error
holds forged log lines, must leave every line of the node's output one record.
"""
from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from crewlet.company.conf import ToolSettings
from crewlet.company.org import CompanyHolder
from crewlet.company.parse import parse_company
from seats.tools.mcp import McpToolbox
from seats.tools.mcp_transport import STDERR_LINE_MAX_CHARS
from stderr_mcp_support import BEARER, FORGED, LAST_WORDS, VENDOR_KEY, command
from tests.browser_support import slack_message
from tests.up_support import UpProcess, http_json, turn_completed, up_env
from waiting_support import eventually, wait_until

SETTINGS = ToolSettings(call_timeout_s=5.0, start_timeout_s=60.0, restart_backoff_s=30.0)
SECRETS = (VENDOR_KEY, BEARER)
TOKEN = "stderr-up-operator-token-0123456789"


def _company(servers: dict[str, Any]) -> dict[str, Any]:
    return {
        "org": "acme",
        "providers": {"llm": [{"kind": "echo"}]},
        "mcp_servers": servers,
        "surfaces": {"slack": {"signing_secret_env": "SLACK_SIGNING_SECRET", "verify": False}},
        "seats": [
            {"handle": "ada", "kind": "agent", "role": "engineer", "tools": list(servers), "identities": {"slack": "U0ADA"}},
            {"handle": "grace", "kind": "human", "role": "lead", "identities": {"slack": "U0GRACE"}},
        ],
    }


def _stderr_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "tool_server_stderr"]


@pytest.mark.integration  # starts a child process
async def test_each_stderr_line_of_a_stdio_server_is_one_redacted_bounded_record_and_nothing_reaches_the_nodes_stderr(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.seats.tools")
    box = McpToolbox(CompanyHolder(parse_company(_company({"noisy": {"command": command("noisy")}}))), settings=SETTINGS)
    try:
        assert "noisy__write" in {spec.name for spec in await box.specs("ada")}
        await eventually(lambda: len(_stderr_records(caplog)) >= 4, 30, "the server's stderr lines as records")
    finally:
        await box.stop()
    records = _stderr_records(caplog)
    lines = [getattr(r, "line") for r in records]
    assert {(getattr(r, "seat"), getattr(r, "server")) for r in records} == {("ada", "noisy")}
    assert lines[0] == "noisy server starting with OPENAI_API_KEY=[redacted]"
    assert lines[1] == "calling upstream with Authorization: [redacted]"
    assert lines[2] == "a line with a NUL \x00 and an escape \x1b[31m in it"  # the formatter escapes it, as any field
    long = records[3]
    assert getattr(long, "line") == "x" * STDERR_LINE_MAX_CHARS and getattr(long, "cut") is True
    assert lines[-1] == LAST_WORDS  # the line with no newline, read once the server stopped
    assert "" not in lines and not any(getattr(r, "cut", False) for r in records if r is not long)
    assert not any(secret in line for secret in SECRETS for line in lines)
    # Inherited, the server's stderr would have been this process's file descriptor 2, raw.
    err = capfd.readouterr().err
    assert "a line with a NUL \x00" not in err and "x" * 3000 not in err
    assert not any(secret in err for secret in SECRETS)


# -- manage.py up: the node's own output, every line one record ---------------------------------------------


@pytest.fixture(params=["kv", "json"])
def up(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UpProcess]:
    company = tmp_path / "company.yaml"
    company.write_text(
        json.dumps(_company({"noisy": {"command": command("noisy")}, "broken": {"command": command("broken")}})),
        encoding="utf-8",
    )
    env = up_env(CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_LOG_FORMAT=request.param)
    process = UpProcess(tmp_path, "--data-dir", str(tmp_path / "data"), "--company", str(company), node="se1", env=env)
    with process:
        yield process


#: Text only the two servers write: a line of up's output holding one came from a server's stderr or its error.
MARKERS = ("engine_compromised", "noisy server starting", "calling upstream", "a line with a NUL", "x" * 100, LAST_WORDS)


def _record_lines(text: str, log_format: str) -> list[Any]:
    """Each line of ``up``'s output that quotes a server, as the record it must be; a line that is not one fails the test.

    ``up`` also prints a few sentences for a person on stdout, which the
    process's output interleaves with the log; none of them quotes a server.
    """
    records: list[Any] = []
    for line in text.splitlines():
        if not any(marker in line for marker in MARKERS):
            continue
        if log_format == "json":
            records.append(json.loads(line))
        else:
            assert line.startswith("ts=") and " level=" in line and " event=" in line, f"not a record: {line!r}"
            records.append(line)
    return records


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_tool_servers_stderr_and_a_start_up_error_holding_forged_lines_leave_every_line_of_up_one_record(
    up: UpProcess,
) -> None:
    log_format = up.env["CREWLET_LOG_FORMAT"]
    mention = slack_message(f"Ev{uuid.uuid4().hex[:10]}", "are your tools up?")
    status, accepted = http_json("POST", f"{up.url}/webhooks/slack", json.dumps(mention).encode(), {"Content-Type": "application/json"})
    assert status == 202 and accepted["accepted"], accepted
    turn_completed(up.url + "/", accepted["trace_id"], TOKEN)
    wait_until(lambda: LAST_WORDS in up.output_so_far(), 60, "the broken server's last stderr line, read once it stopped")
    text = up.stop()

    assert "\x00" not in text and "\x1b" not in text
    assert not any(secret in text for secret in SECRETS)
    records = _record_lines(text, log_format)
    if log_format == "kv":  # a forged record would be a line of its own, starting with its own ts=
        assert not [r for r in records if r.startswith(FORGED.split(" ", 1)[0])]
    else:  # a forged line would not have parsed as JSON; none is a record of its own either
        assert not [r for r in records if r.get("event") == "engine_compromised"]
    if log_format == "json":
        stderr = [r for r in records if r["event"] == "tool_server_stderr"]
        refused = [r for r in records if r["event"] == "tool_server_unavailable" and r["server"] == "broken"]
        assert refused and FORGED in refused[0]["error"] and "sk-[redacted]" in refused[0]["error"]
        assert {r["server"] for r in stderr} == {"noisy", "broken"}
        assert any(r["line"] == "a line with a NUL \x00 and an escape \x1b[31m in it" for r in stderr)
        assert any(r.get("cut") is True and len(r["line"]) == STDERR_LINE_MAX_CHARS for r in stderr)
    else:
        stderr = [r for r in records if " event=tool_server_stderr " in r]
        refused = [r for r in records if " event=tool_server_unavailable " in r and " server=broken " in r]
        assert refused and "\\nts=2026-01-01T00:00:00.000+00:00 level=critical" in refused[0]
        assert any(" server=noisy " in r for r in stderr) and any(" server=broken " in r for r in stderr)
        assert any('line="a line with a NUL \\u0000 and an escape \\u001b[31m in it"' in r for r in stderr)
