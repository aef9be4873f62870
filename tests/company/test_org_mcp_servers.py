"""The company file's ``mcp_servers`` and each seat's ``tools``: validated at load, secrets only by name."""
from __future__ import annotations

import pytest

from crewlet.base.logfmt import REDACTED
from crewlet.company.fields import CompanyError
from crewlet.company.org import A2A_ASK_TOOL, MCP_HTTP, MCP_STDIO
from crewlet.company.parse import parse_company

SERVERS = {
    "notes": {"command": ["python", "tools/notes_server.py"], "env": {"NOTES_DIR": "var/notes"}},
    "slack": {"command": ["npx", "-y", "some-slack-mcp-server"], "env_from": ["SLACK_BOT_TOKEN"]},
    "tracker": {"url": "http://127.0.0.1:9000/mcp", "headers_from": {"Authorization": "TRACKER_AUTH"}},
}


def company(servers=None, tools=None):
    seat = {"handle": "ada", "kind": "agent", "role": "engineer"}
    if tools is not None:
        seat["tools"] = tools
    return parse_company({"org": "acme", "mcp_servers": SERVERS if servers is None else servers, "seats": [seat]})


def refused(servers=None, tools=None) -> CompanyError:
    with pytest.raises(CompanyError) as info:
        company(servers, tools)
    return info.value


def test_servers_are_named_once_and_granted_per_seat_in_the_order_the_seat_names_them():
    org = company(tools=["tracker", "notes", A2A_ASK_TOOL])
    ada = org.seat_by_handle("ada")
    assert ada.tools == ("tracker", "notes", A2A_ASK_TOOL)
    assert [s.name for s in org.mcp_servers_of(ada)] == ["tracker", "notes"]
    notes, slack, tracker = org.mcp_servers["notes"], org.mcp_servers["slack"], org.mcp_servers["tracker"]
    assert notes.transport == MCP_STDIO and notes.command == ("python", "tools/notes_server.py")
    assert dict(notes.env) == {"NOTES_DIR": "var/notes"}
    assert slack.env_from == ("SLACK_BOT_TOKEN",)
    assert tracker.transport == MCP_HTTP and dict(tracker.headers_from) == {"Authorization": "TRACKER_AUTH"}


def test_a_seat_with_no_tools_key_is_granted_nothing():
    assert company().seat_by_handle("ada").tools == ()


def test_a_seat_granted_an_unknown_server_is_refused_with_what_it_may_name():
    err = refused(tools=["notes", "jira"])
    assert err.field == "seats[0].tools[1]" and err.value == "jira"
    assert "notes" in err.allowed and "tracker" in err.allowed and A2A_ASK_TOOL in err.allowed


@pytest.mark.parametrize(
    "body, shown",
    [
        ({"env": {"X": "1"}}, "neither command nor url"),
        ({"command": ["python"], "url": "http://127.0.0.1/mcp"}, "both command and url"),
    ],
)
def test_a_server_needs_exactly_one_of_command_and_url(body, shown):
    err = refused({"broken": body})
    assert err.field == "mcp_servers.broken" and err.value == shown
    assert "exactly one of command" in err.allowed


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "http://127.0.0.1/mcp", "headers": {"Authorization": "Bearer abcdefghijklmnop1234"}}, "mcp_servers.s.headers"),
        ({"command": ["slack-mcp"], "env": {"SLACK_BOT_TOKEN": "xoxb-1234-5678-abcdef"}}, "mcp_servers.s.env.SLACK_BOT_TOKEN"),
        ({"command": ["slack-mcp"], "env": {"SLACK": "xoxb-1234-5678-abcdef"}}, "mcp_servers.s.env.SLACK"),
        ({"command": ["gh-mcp", "--token", "ghp_abcdefghijklmnop"]}, "mcp_servers.s.command[2]"),
        ({"url": "https://bot:hunter2hunter2@tracker.example/mcp"}, "mcp_servers.s.url"),
        ({"url": "https://tracker.example/mcp?access_token=abcdef123456"}, "mcp_servers.s.url"),
        ({"url": "https://tracker.example/mcp", "headers_from": {"Authorization": "Bearer abcdefghijklmnop1234"}},
         "mcp_servers.s.headers_from.Authorization"),
        ({"command": ["slack-mcp"], "env_from": ["xoxb-1234-5678-abcdef"]}, "mcp_servers.s.env_from[0]"),
    ],
)
def test_a_secret_written_inline_is_refused_naming_the_field_and_never_echoing_the_value(body, field):
    err = refused({"s": body})
    assert err.field == field
    assert err.value == REDACTED
    for secret in ("abcdefghijklmnop", "xoxb-1234", "hunter2", "abcdef123456"):
        assert secret not in str(err)
    assert "env_from" in err.allowed or "headers_from" in err.allowed or "environment variable" in err.allowed


def test_a_plain_setting_in_env_is_kept_and_a_secret_one_must_come_from_the_environment():
    org = company({"n": {"command": ["notes"], "env": {"NOTES_DIR": "var/notes", "LOG_LEVEL": "debug"}}})
    assert dict(org.mcp_servers["n"].env) == {"NOTES_DIR": "var/notes", "LOG_LEVEL": "debug"}
    err = refused({"n": {"command": ["notes"], "env": {"NOTES_API_KEY": "plain"}}})
    assert "env_from: [NOTES_API_KEY]" in err.allowed


@pytest.mark.parametrize(
    "name, servers, allowed",
    [
        ("bad__name", {"bad__name": {"command": ["x"]}}, "never '__'"),
        (A2A_ASK_TOOL, {A2A_ASK_TOOL: {"command": ["x"]}}, "built-in tool"),
    ],
)
def test_a_server_name_must_fit_the_tool_name_rules_and_not_shadow_a_built_in(name, servers, allowed):
    err = refused(servers)
    assert name in (err.value, err.field.split(".")[-1]) and allowed in err.allowed


def test_headers_belong_to_url_servers_and_env_to_command_servers():
    assert refused({"s": {"command": ["x"], "headers_from": {"X-Key": "K"}}}).field == "mcp_servers.s.headers_from"
    assert refused({"s": {"url": "http://127.0.0.1/mcp", "env_from": ["K"]}}).field == "mcp_servers.s.env"


def test_a_seat_granting_one_server_twice_is_refused():
    assert refused(tools=["notes", "notes"]).field == "seats[0].tools[1]"
