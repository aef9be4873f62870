"""``mcp_servers: {<name>: {builtin: slack | mattermost}}``: the shipped chat servers, read from the company file into what the engine starts."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from crewlet.company.builtin_servers import builtin_grant
from crewlet.company.fields import CompanyError
from crewlet.company.org import MCP_STDIO, Organization
from crewlet.company.parse import parse_company, parse_company_text

REPO_ROOT = str(Path(__file__).resolve().parents[2])


def company(servers: dict[str, Any], surfaces: Optional[dict[str, Any]] = None, tools: Optional[list[str]] = None) -> Organization:
    return parse_company(
        {
            "org": "acme",
            "surfaces": surfaces or {},
            "mcp_servers": servers,
            "seats": [{"handle": "ada", "kind": "agent", "tools": list(servers) if tools is None else tools}],
        }
    )


def refused(servers: dict[str, Any], surfaces: Optional[dict[str, Any]] = None) -> CompanyError:
    with pytest.raises(CompanyError) as info:
        company(servers, surfaces)
    return info.value


def test_builtin_slack_runs_the_shipped_server_on_this_interpreter_with_the_token_by_name_and_slacks_default_api() -> None:
    server = company({"slack": {"builtin": "slack"}}).mcp_servers["slack"]
    assert server.transport == MCP_STDIO and server.builtin == "slack"
    assert server.command == (sys.executable, "-m", "seats.tools.servers.slack")
    assert server.env_from == ("SLACK_BOT_TOKEN",)
    assert dict(server.env) == {"SLACK_API_URL": "https://slack.com/api/", "PYTHONPATH": REPO_ROOT}


def test_the_slack_surfaces_api_url_is_the_url_the_server_is_given_even_without_a_socket() -> None:
    org = company({"chat": {"builtin": "slack"}}, {"slack": {"signing_secret_env": "S", "api_url": "https://slack.corp.example/api"}})
    assert org.surfaces["slack"].server == "https://slack.corp.example/api"
    assert org.mcp_servers["chat"].env["SLACK_API_URL"] == "https://slack.corp.example/api/"


def test_builtin_mattermost_is_given_the_surfaces_server_and_reads_its_token_from_mattermost_bot_token() -> None:
    org = company({"mm": {"builtin": "mattermost"}}, {"mattermost": {"token_env": "MM_OUTGOING", "server": "https://chat.example/"}})
    server = org.mcp_servers["mm"]
    assert server.command == (sys.executable, "-m", "seats.tools.servers.mattermost")
    assert server.env_from == ("MATTERMOST_BOT_TOKEN",)
    assert server.env["MATTERMOST_URL"] == "https://chat.example"
    assert builtin_grant(org, org.seat_by_handle("ada"), "mattermost") == server  # type: ignore[arg-type]
    assert builtin_grant(org, org.seat_by_handle("ada"), "slack") is None  # type: ignore[arg-type]


def test_builtin_mattermost_without_the_surfaces_server_is_refused_naming_the_key_to_set() -> None:
    err = refused({"mm": {"builtin": "mattermost"}})
    assert (err.field, err.value) == ("mcp_servers.mm.builtin", "mattermost")
    assert "surfaces.mattermost.server" in err.allowed


@pytest.mark.parametrize(
    "body, field, shown",
    [
        ({"builtin": "teams"}, "mcp_servers.x.builtin", "teams"),
        ({"builtin": "slack", "command": ["slack-mcp"]}, "mcp_servers.x.command", ["slack-mcp"]),
        ({"builtin": "slack", "env_from": ["ADA_SLACK_BOT_TOKEN"]}, "mcp_servers.x.env_from", ["ADA_SLACK_BOT_TOKEN"]),
    ],
)
def test_a_builtin_server_names_only_a_shipped_kind_and_nothing_beside_it(body: dict[str, Any], field: str, shown: Any) -> None:
    err = refused({"x": body})
    assert (err.field, err.value) == (field, shown)
    assert ("slack, mattermost" in err.allowed) if field.endswith("builtin") else ("no other key" in err.allowed)


def test_a_surface_url_that_is_no_http_url_is_refused_in_webhook_mode_too() -> None:
    err = refused({"s": {"builtin": "slack"}}, {"slack": {"api_url": "slack.com/api"}})
    assert (err.field, err.value, err.allowed) == ("surfaces.slack.api_url", "slack.com/api", "must be an http:// or https:// URL")


def test_the_company_file_lines_the_docs_show_grant_ada_both_chat_servers() -> None:
    org = parse_company_text(
        "org: acme\n"
        "surfaces:\n"
        "  slack: {signing_secret_env: SLACK_SIGNING_SECRET}\n"
        "  mattermost: {token_env: MATTERMOST_WEBHOOK_TOKEN, server: https://chat.example.com}\n"
        "mcp_servers:\n"
        "  slack: {builtin: slack}\n"
        "  mattermost: {builtin: mattermost}\n"
        "seats:\n"
        "  - handle: ada\n"
        "    kind: agent\n"
        "    identities: {slack: U0ADA, mattermost: ada}\n"
        "    tools:\n"
        "      - {server: slack, env: {SLACK_BOT_TOKEN: ADA_SLACK_BOT_TOKEN}}\n"
        "      - {server: mattermost, env: {MATTERMOST_BOT_TOKEN: ADA_MATTERMOST_BOT_TOKEN}}\n"
    )
    ada = org.seat_by_handle("ada")
    assert ada is not None and [s.builtin for s in org.mcp_servers_of(ada)] == ["slack", "mattermost"]
    assert [dict(g.env_from) for g in org.granted_servers(ada)] == [
        {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"}, {"MATTERMOST_BOT_TOKEN": "ADA_MATTERMOST_BOT_TOKEN"}
    ]
