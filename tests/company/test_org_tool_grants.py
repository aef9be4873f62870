"""A seat's grant of an MCP server with credentials of its own: ``seats[].tools: [{server, env, headers}]``, validated at load."""
from __future__ import annotations

from typing import Any

import pytest

from crewlet.base.logfmt import REDACTED
from crewlet.company.fields import CompanyError
from crewlet.company.org import A2A_ASK_TOOL, GrantedServer, ToolGrant, grant_env, grant_headers
from crewlet.company.parse import parse_company, parse_company_text

SERVERS = {
    "notes": {"command": ["notes-mcp"], "env": {"NOTES_DIR": "var/notes"}},
    "slack": {"command": ["slack-mcp"], "env_from": ["SLACK_BOT_TOKEN", "SLACK_TEAM_ID"]},
    "tracker": {"url": "http://127.0.0.1:9000/mcp", "headers_from": {"Authorization": "TRACKER_AUTH", "X-Team": "TEAM"}},
}


def company(*tools: Any, grace: Any = None) -> Any:
    seats = [{"handle": "ada", "kind": "agent", "role": "engineer", "tools": list(tools)}]
    if grace is not None:
        seats.append({"handle": "grace", "kind": "agent", "role": "lead", "tools": grace})
    return parse_company({"org": "acme", "mcp_servers": SERVERS, "seats": seats})


def refused(*tools: Any) -> CompanyError:
    with pytest.raises(CompanyError) as info:
        company(*tools)
    return info.value


def test_two_seats_granted_one_server_each_read_its_variables_from_their_own_node_variables() -> None:
    org = company(
        "notes",
        {"server": "slack", "env": {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"}},
        {"server": "tracker", "headers": {"Authorization": "ADA_TRACKER_AUTH"}},
        A2A_ASK_TOOL,
        grace=[{"server": "slack", "env": {"SLACK_BOT_TOKEN": "GRACE_SLACK_BOT_TOKEN"}}, "tracker"],
    )
    ada, grace = org.seat_by_handle("ada"), org.seat_by_handle("grace")
    assert ada.tools == ("notes", "slack", "tracker", A2A_ASK_TOOL)
    assert ada.grants["slack"] == ToolGrant(server="slack", env={"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"})
    notes, slack, tracker = org.granted_servers(ada)
    assert notes == GrantedServer(org.mcp_servers["notes"])
    assert dict(slack.env_from) == {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN", "SLACK_TEAM_ID": "SLACK_TEAM_ID"}
    assert dict(tracker.headers_from) == {"Authorization": "ADA_TRACKER_AUTH", "X-Team": "TEAM"}
    assert slack.variables() == ["ADA_SLACK_BOT_TOKEN", "SLACK_TEAM_ID"]
    grace_slack, grace_tracker = org.granted_servers(grace)
    assert dict(grace_slack.env_from)["SLACK_BOT_TOKEN"] == "GRACE_SLACK_BOT_TOKEN"
    assert dict(grace_tracker.headers_from) == dict(org.mcp_servers["tracker"].headers_from)
    # Two seats' grants of one server are two sessions' worth: never equal, so never shared.
    assert grace_slack != slack and grace_slack.server == slack.server


def test_a_plain_name_keeps_todays_meaning_each_variable_read_under_its_own_name() -> None:
    org = company("slack", "tracker")
    ada = org.seat_by_handle("ada")
    assert ada.grants == {}
    slack, tracker = org.granted_servers(ada)
    assert dict(slack.env_from) == {"SLACK_BOT_TOKEN": "SLACK_BOT_TOKEN", "SLACK_TEAM_ID": "SLACK_TEAM_ID"}
    assert dict(tracker.headers_from) == {"Authorization": "TRACKER_AUTH", "X-Team": "TEAM"}
    assert grant_env(ada, org.mcp_servers["slack"]) == dict(slack.env_from)
    assert grant_headers(ada, org.mcp_servers["tracker"]) == dict(tracker.headers_from)


def test_a_header_is_matched_whatever_its_case_and_kept_in_the_servers_spelling() -> None:
    org = company({"server": "tracker", "headers": {"authorization": "ADA_TRACKER_AUTH"}})
    (tracker,) = org.granted_servers(org.seat_by_handle("ada"))
    assert dict(tracker.headers_from)["Authorization"] == "ADA_TRACKER_AUTH"


def test_a_grant_with_no_mapping_is_the_plain_name() -> None:
    org = company({"server": "slack"})
    (slack,) = org.granted_servers(org.seat_by_handle("ada"))
    assert dict(slack.env_from) == {"SLACK_BOT_TOKEN": "SLACK_BOT_TOKEN", "SLACK_TEAM_ID": "SLACK_TEAM_ID"}


@pytest.mark.parametrize(
    "grant, field, value, allowed",
    [
        ({"server": "jira", "env": {"X": "Y"}}, "seats[0].tools[0].server", "jira", "must be an mcp_servers name (notes, slack, tracker)"),
        ({"env": {"X": "Y"}}, "seats[0].tools[0].server", None, "must be an mcp_servers name"),
        ({"server": A2A_ASK_TOOL, "env": {"X": "Y"}}, "seats[0].tools[0].server", A2A_ASK_TOOL, "is a built-in tool"),
        ({"server": A2A_ASK_TOOL}, "seats[0].tools[0].server", A2A_ASK_TOOL, "by its name alone"),
        ({"server": "slack", "env": {"GITHUB_TOKEN": "ADA_GH"}}, "seats[0].tools[0].env", "GITHUB_TOKEN",
         "must be one of what slack declares in env_from (SLACK_BOT_TOKEN, SLACK_TEAM_ID)"),
        ({"server": "tracker", "headers": {"Cookie": "ADA_COOKIE"}}, "seats[0].tools[0].headers", "Cookie",
         "must be one of what tracker declares in headers_from (Authorization, X-Team)"),
        ({"server": "notes", "env": {"NOTES_DIR": "OTHER"}}, "seats[0].tools[0].env", "NOTES_DIR",
         "declares in env_from (none)"),
        ({"server": "slack", "headers": {"Authorization": "ADA"}}, "seats[0].tools[0].headers", "Authorization",
         "declares in headers_from (none)"),
        ({"server": "slack", "env": ["SLACK_BOT_TOKEN"]}, "seats[0].tools[0].env", ["SLACK_BOT_TOKEN"], "must be a mapping"),
        ({"server": "slack", "env": {"SLACK_BOT_TOKEN": None}}, "seats[0].tools[0].env.SLACK_BOT_TOKEN", None,
         "must name a node environment variable"),
        ({"server": "slack", "tools": ["x"]}, "seats[0].tools[0].tools", ["x"], "unknown key; allowed: server, env, headers"),
    ],
)
def test_a_grant_that_names_what_it_may_not_is_refused_naming_the_field_the_value_and_what_is_allowed(
    grant: dict[str, Any], field: str, value: Any, allowed: str
) -> None:
    err = refused(grant)
    assert (err.field, err.value) == (field, value)
    assert allowed in err.allowed


@pytest.mark.parametrize(
    "grant, field",
    [
        ({"server": "slack", "env": {"SLACK_BOT_TOKEN": "xoxb-1234-5678-abcdefghij"}}, "seats[0].tools[0].env.SLACK_BOT_TOKEN"),
        ({"server": "slack", "env": {"SLACK_BOT_TOKEN": "my bot's password"}}, "seats[0].tools[0].env.SLACK_BOT_TOKEN"),
        ({"server": "slack", "env": {"SLACK_TEAM_ID": 12345678}}, "seats[0].tools[0].env.SLACK_TEAM_ID"),
        ({"server": "tracker", "headers": {"Authorization": "Bearer abcdefghijklmnop1234"}},
         "seats[0].tools[0].headers.Authorization"),
        ({"server": "slack", "token": "xoxb-1234-5678-abcdefghij"}, "seats[0].tools[0].token"),
        ({"server": "slack", "env": {"xoxb-1234-5678-abcdefghij": "ADA"}}, "seats[0].tools[0].env"),
    ],
)
def test_a_value_that_is_no_variable_name_is_refused_as_an_inline_secret_never_echoed(grant: dict[str, Any], field: str) -> None:
    err = refused(grant)
    assert err.field == field and err.value == REDACTED
    for secret in ("xoxb-1234", "password", "12345678", "abcdefghijklmnop"):
        assert secret not in str(err)


def test_a_server_granted_by_name_and_again_by_mapping_is_granted_twice() -> None:
    err = refused("slack", {"server": "slack", "env": {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"}})
    assert (err.field, err.value, err.allowed) == ("seats[0].tools[1]", "slack", "is granted twice")


def test_a_company_file_writes_the_grant_inline_and_the_refusal_names_the_file() -> None:
    text = (
        "org: acme\n"
        "mcp_servers: {slack: {command: [slack-mcp], env_from: [SLACK_BOT_TOKEN]}}\n"
        "seats:\n"
        "  - {handle: ada, kind: agent, tools: [{server: slack, env: {SLACK_BOT_TOKEN: ADA_SLACK_BOT_TOKEN}}]}\n"
    )
    org = parse_company_text(text, source="acme.yaml")
    assert dict(org.granted_servers(org.seat_by_handle("ada"))[0].env_from) == {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"}
    with pytest.raises(CompanyError) as info:
        parse_company_text(text.replace("ADA_SLACK_BOT_TOKEN", "xoxb-1-2-secretvalue"), source="acme.yaml")
    assert "seats[0].tools[0].env.SLACK_BOT_TOKEN" in str(info.value) and "acme.yaml" in str(info.value)
    assert "secretvalue" not in str(info.value)


def test_a_seats_own_chat_identity_feeds_its_bot_token_to_a_plain_grant_and_an_explicit_mapping_still_wins() -> None:
    servers = {**SERVERS, "mm": {"command": ["mm-mcp"], "env_from": ["MATTERMOST_BOT_TOKEN"]}}
    ada_app = {"app_id": "A0ADA", "signing_secret_env": "ADA_SLACK_SIGNING_SECRET", "bot_token_env": "ADA_SLACK_BOT_TOKEN"}
    grace_app = {"app_id": "A0GRACE", "signing_secret_env": "GRACE_SLACK_SIGNING_SECRET", "bot_token_env": "GRACE_SLACK_BOT_TOKEN"}
    org = parse_company({"org": "acme", "mcp_servers": servers, "seats": [
        {"handle": "ada", "slack": ada_app, "mattermost": {"bot_token_env": "ADA_MM_TOKEN"}, "tools": ["slack", "mm"]},
        {"handle": "grace", "slack": grace_app, "tools": [{"server": "slack", "env": {"SLACK_BOT_TOKEN": "GRACE_OTHER_TOKEN"}}]},
        {"handle": "linus", "tools": ["slack"]},
    ]})
    ada, grace, linus = (org.seat_by_handle(h) for h in ("ada", "grace", "linus"))
    assert grant_env(ada, org.mcp_servers["slack"]) == {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN", "SLACK_TEAM_ID": "SLACK_TEAM_ID"}
    assert grant_env(ada, org.mcp_servers["mm"]) == {"MATTERMOST_BOT_TOKEN": "ADA_MM_TOKEN"}
    assert grant_env(grace, org.mcp_servers["slack"])["SLACK_BOT_TOKEN"] == "GRACE_OTHER_TOKEN"
    assert grant_env(linus, org.mcp_servers["slack"])["SLACK_BOT_TOKEN"] == "SLACK_BOT_TOKEN"
