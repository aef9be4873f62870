"""Per-grant credentials: two seats granted one MCP server each reach it with their own token, through :class:`McpToolbox`.

The server is a real MCP server process (``tests/grant_mcp_support.py``)
that answers which variable or header it was given.
"""
from __future__ import annotations

import logging
from typing import Any, AsyncIterator

import pytest
import pytest_asyncio

from crewlet.company.conf import ToolSettings
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import parse_company
from grant_mcp_support import http_server, stdio_command
from seats.tools import ToolCall
from seats.tools.mcp import McpToolbox

pytestmark = pytest.mark.integration  # the tool servers are real MCP server processes

SETTINGS = ToolSettings(call_timeout_s=10.0, start_timeout_s=60.0, restart_backoff_s=0.05)
ADA_TOKEN, GRACE_TOKEN, SHARED_TOKEN = "ada-own-token-5a1c", "grace-own-token-9e07", "the-one-shared-token-77"


def company(ada_env: dict[str, str], grace_env: dict[str, str], url: str = "") -> Organization:
    servers: dict[str, Any] = {"chat": {"command": stdio_command(), "env_from": ["SLACK_BOT_TOKEN"]}}
    ada: list[Any] = [{"server": "chat", "env": ada_env}]
    grace: list[Any] = [{"server": "chat", "env": grace_env}]
    if url:
        servers["tracker"] = {"url": url, "headers_from": {"Authorization": "TRACKER_AUTH"}}
        ada.append({"server": "tracker", "headers": {"Authorization": "ADA_TRACKER_AUTH"}})
        grace.append({"server": "tracker", "headers": {"Authorization": "GRACE_TRACKER_AUTH"}})
    return parse_company(
        {
            "org": "acme",
            "mcp_servers": servers,
            "seats": [
                {"handle": "ada", "kind": "agent", "role": "engineer", "tools": ada},
                {"handle": "grace", "kind": "agent", "role": "lead", "tools": grace},
                {"handle": "linus", "kind": "agent", "role": "reviewer", "tools": ["chat"]},
            ],
        }
    )


@pytest_asyncio.fixture
async def box() -> AsyncIterator[McpToolbox]:
    toolbox = McpToolbox(
        CompanyHolder(company({"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"}, {"SLACK_BOT_TOKEN": "GRACE_SLACK_BOT_TOKEN"})),
        settings=SETTINGS,
    )
    try:
        yield toolbox
    finally:
        await toolbox.stop()


async def answer(box: McpToolbox, seat: str, tool: str, **arguments: Any) -> str:
    """What a turn does: list the seat's tools (its sessions opened), then call one."""
    await box.specs(seat)
    result = await box.call(seat, ToolCall(id=f"call-{tool}", name=tool, arguments=arguments))
    assert result.ok, result.error
    return result.content


async def test_two_seats_granted_one_server_run_two_children_each_given_its_own_token_under_the_servers_name(
    box: McpToolbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADA_SLACK_BOT_TOKEN", ADA_TOKEN)
    monkeypatch.setenv("GRACE_SLACK_BOT_TOKEN", GRACE_TOKEN)
    monkeypatch.setenv("SLACK_BOT_TOKEN", SHARED_TOKEN)
    assert await answer(box, "ada", "chat__variable", name="SLACK_BOT_TOKEN") == ADA_TOKEN
    assert await answer(box, "grace", "chat__variable", name="SLACK_BOT_TOKEN") == GRACE_TOKEN
    # A plain name keeps today's meaning: the node's variable under its own name.
    assert await answer(box, "linus", "chat__variable", name="SLACK_BOT_TOKEN") == SHARED_TOKEN
    # The child sees the server's name only, never the seat's own variable.
    assert await answer(box, "ada", "chat__variable", name="ADA_SLACK_BOT_TOKEN") == ""
    pids = {seat: await answer(box, seat, "chat__pid") for seat in ("ada", "grace", "linus")}
    assert len(set(pids.values())) == 3, pids
    assert box.running() == {"ada": ["chat"], "grace": ["chat"], "linus": ["chat"]}


async def test_a_seat_whose_own_variable_is_unset_gets_no_token_never_the_shared_one(
    box: McpToolbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ADA_SLACK_BOT_TOKEN", raising=False)
    monkeypatch.setenv("SLACK_BOT_TOKEN", SHARED_TOKEN)
    assert await answer(box, "ada", "chat__variable", name="SLACK_BOT_TOKEN") == ""


async def test_a_revision_that_changes_a_seats_mapping_replaces_its_session_and_leaves_the_other_seats(
    box: McpToolbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADA_SLACK_BOT_TOKEN", ADA_TOKEN)
    monkeypatch.setenv("ADA_NEW_TOKEN", "ada-rotated-token-31")
    monkeypatch.setenv("GRACE_SLACK_BOT_TOKEN", GRACE_TOKEN)
    ada_before = await answer(box, "ada", "chat__pid")
    grace_before = await answer(box, "grace", "chat__pid")
    box.holder.swap(company({"SLACK_BOT_TOKEN": "ADA_NEW_TOKEN"}, {"SLACK_BOT_TOKEN": "GRACE_SLACK_BOT_TOKEN"}))
    assert await answer(box, "ada", "chat__variable", name="SLACK_BOT_TOKEN") == "ada-rotated-token-31"
    assert await answer(box, "ada", "chat__pid") != ada_before
    assert await answer(box, "grace", "chat__pid") == grace_before


async def test_two_seats_granted_one_http_server_each_send_their_own_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADA_TRACKER_AUTH", "Bearer ada-tracker-credential")
    monkeypatch.setenv("GRACE_TRACKER_AUTH", "Bearer grace-tracker-credential")
    monkeypatch.setenv("TRACKER_AUTH", "Bearer the-shared-tracker-credential")
    with http_server() as url:
        box = McpToolbox(CompanyHolder(company({}, {}, url)), settings=SETTINGS)
        try:
            ada = await answer(box, "ada", "tracker__header", name="authorization")
            grace = await answer(box, "grace", "tracker__header", name="authorization")
        finally:
            await box.stop()
    assert (ada, grace) == ("Bearer ada-tracker-credential", "Bearer grace-tracker-credential")


async def test_an_unset_variable_a_grant_names_is_warned_once_by_name_at_start_and_never_per_turn(
    box: McpToolbox, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.seats.tools")
    monkeypatch.setenv("ADA_SLACK_BOT_TOKEN", ADA_TOKEN)
    monkeypatch.delenv("GRACE_SLACK_BOT_TOKEN", raising=False)
    monkeypatch.setenv("SLACK_BOT_TOKEN", SHARED_TOKEN)

    def warnings() -> list[tuple[str, str, list[str]]]:
        return [
            (r.seat, r.server, r.variables)  # type: ignore[attr-defined]
            for r in caplog.records if r.getMessage() == "tool_server_variable_unset"
        ]

    await box.start()
    assert warnings() == [("grace", "chat", ["GRACE_SLACK_BOT_TOKEN"])]
    for _ in range(3):  # three turns' worth of tool use
        await answer(box, "grace", "chat__pid")
    assert len(warnings()) == 1
    # A revision that names another unset variable names that one, once.
    monkeypatch.delenv("ADA_NEW_TOKEN", raising=False)
    box.holder.swap(company({"SLACK_BOT_TOKEN": "ADA_NEW_TOKEN"}, {"SLACK_BOT_TOKEN": "GRACE_SLACK_BOT_TOKEN"}))
    await answer(box, "ada", "chat__pid")
    await answer(box, "ada", "chat__pid")
    assert warnings()[1:] == [("ada", "chat", ["ADA_NEW_TOKEN"])]
    assert not any(token in caplog.text for token in (ADA_TOKEN, SHARED_TOKEN))
