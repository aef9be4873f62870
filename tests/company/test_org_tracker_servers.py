"""``mcp_servers: {<name>: {builtin: github | jira | confluence}}``: the shipped tracker servers and the surface URL each is given."""
from __future__ import annotations

import sys
from typing import Any, Optional

import pytest

from crewlet.company.fields import CompanyError
from crewlet.company.org import Organization
from crewlet.company.parse import parse_company


def company(servers: dict[str, Any], surfaces: Optional[dict[str, Any]] = None, grants: Optional[list[Any]] = None) -> Organization:
    return parse_company({
        "org": "acme", "surfaces": surfaces or {}, "mcp_servers": servers,
        "seats": [{"handle": "ada", "kind": "agent", "tools": list(servers) if grants is None else grants}],
    })


def test_builtin_github_reads_github_token_and_calls_githubs_api_unless_the_surface_names_another() -> None:
    server = company({"gh": {"builtin": "github"}}).mcp_servers["gh"]
    assert server.command == (sys.executable, "-m", "seats.tools.servers.github")
    assert server.env_from == ("GITHUB_TOKEN",)
    assert server.env["GITHUB_API_URL"] == "https://api.github.com"
    enterprise = company({"gh": {"builtin": "github"}}, {"github": {"secret_env": "GH_HOOK", "api_url": "https://ghe.example/api/v3/"}})
    assert enterprise.mcp_servers["gh"].env["GITHUB_API_URL"] == "https://ghe.example/api/v3"


@pytest.mark.parametrize("kind, variables", [("jira", ("JIRA_TOKEN", "JIRA_USER")), ("confluence", ("CONFLUENCE_TOKEN", "CONFLUENCE_USER"))])
def test_builtin_jira_and_confluence_read_a_token_and_a_user_and_call_the_surfaces_server(kind: str, variables: tuple[str, ...]) -> None:
    org = company({"t": {"builtin": kind}}, {kind: {"server": "https://acme.atlassian.net/"}})
    server = org.mcp_servers["t"]
    assert server.command == (sys.executable, "-m", f"seats.tools.servers.{kind}")
    assert server.env_from == variables
    assert server.env[f"{kind.upper()}_URL"] == "https://acme.atlassian.net"


@pytest.mark.parametrize("kind", ["jira", "confluence"])
def test_builtin_jira_or_confluence_without_the_surfaces_server_is_refused_naming_the_key_to_set(kind: str) -> None:
    with pytest.raises(CompanyError) as info:
        company({"t": {"builtin": kind}})
    assert (info.value.field, info.value.value) == ("mcp_servers.t.builtin", kind)
    assert f"surfaces.{kind}.server" in info.value.allowed


def test_a_seats_grant_maps_both_atlassian_credentials_onto_its_own_variables() -> None:
    org = company({"jira": {"builtin": "jira"}}, {"jira": {"server": "https://acme.atlassian.net"}},
                  [{"server": "jira", "env": {"JIRA_USER": "ADA_JIRA_USER", "JIRA_TOKEN": "ADA_JIRA_TOKEN"}}])
    (granted,) = org.granted_servers(org.seat_by_handle("ada"))  # type: ignore[arg-type]
    assert dict(granted.env_from) == {"JIRA_TOKEN": "ADA_JIRA_TOKEN", "JIRA_USER": "ADA_JIRA_USER"}


@pytest.mark.parametrize(
    "surfaces, field, value",
    [
        ({"github": {"api_url": "api.github.com"}}, "surfaces.github.api_url", "api.github.com"),
        ({"jira": {"server": "ftp://jira.example"}}, "surfaces.jira.server", "ftp://jira.example"),
        ({"confluence": {"mode": "socket"}}, "surfaces.confluence.mode", "socket"),
        ({"github": {"server": "https://ghe.example"}}, "surfaces.github.server", "https://ghe.example"),
    ],
)
def test_a_tracker_surfaces_url_is_an_http_url_under_its_own_key_and_trackers_have_no_socket(
    surfaces: dict[str, Any], field: str, value: str
) -> None:
    with pytest.raises(CompanyError) as info:
        company({}, surfaces)
    assert (info.value.field, info.value.value) == (field, value)
