"""The reply target a turn is told: where its trigger was asked, in the arguments its surface's tools take."""
from __future__ import annotations

import json
from typing import Any

import pytest

from crewlet.company.org import Organization, Seat
from crewlet.company.parse import parse_company
from crewlet.events import Event, new
from crewlet.events.trace import Trace
from crewlet.events.types import ExternalNotification, TaskAssigned
from seats.reply_target import REPLY_TARGET_LEAD, reply_target, target_of, with_reply_target
from seats.tools.base import ToolSpec
from seats.turn_types import Trigger

TOOLS = [ToolSpec(name="notes__write", description="", input_schema={"type": "object"})]


def wake(source: str, partition_key: str, message_id: str, event_name: str = "") -> Trigger:
    """A one-wake trigger as the router publishes a delivery (``notifications.service.NotifyRouter.wake``)."""
    extras = {"sender": "grace", "body": "@ada please look", "partition_key": partition_key, "event_name": event_name,
              "conversation_identity": partition_key, "message_id": message_id, "delivery_id": message_id}
    event = new(ExternalNotification(seat="ada", sender="grace", body="@ada please look"), Trace.root(), source=source, extras=extras)
    return Trigger(events=[event], partition_key=partition_key)


def company(servers: dict[str, Any]) -> tuple[Organization, Seat]:
    org = parse_company({
        "org": "acme",
        "surfaces": {"mattermost": {"server": "https://chat.example"}, "jira": {"server": "https://acme.atlassian.net"},
                     "confluence": {"server": "https://acme.atlassian.net/wiki"}},
        "mcp_servers": servers,
        "seats": [{"handle": "ada", "kind": "agent", "tools": list(servers)}],
    })
    ada = org.seat_by_handle("ada")
    assert ada is not None
    return org, ada


@pytest.mark.parametrize(
    "trigger, target",
    [
        (wake("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000200"),
         {"surface": "slack", "channel": "C0DEV", "thread_ts": "1718000000.000100", "timestamp": "1718000000.000200"}),
        (wake("slack", "slack:D0ADA", "D0ADA:1718000000.000300"),
         {"surface": "slack", "channel": "D0ADA", "thread_ts": "1718000000.000300", "timestamp": "1718000000.000300"}),
        (wake("slack", "slack:C0DEV", "cmd-3f2a"), {"surface": "slack", "channel": "C0DEV"}),
        (wake("mattermost", "mattermost:chan0town:root0post", "reply0post"),
         {"surface": "mattermost", "channel_id": "chan0town", "root_id": "root0post", "post_id": "reply0post"}),
        (wake("github", "github:Codertocat/Hello-World#1", "comment:492700400", "issue_comment"),
         {"surface": "github", "repo": "Codertocat/Hello-World", "issue_number": 1, "comment_id": 492700400}),
        (wake("github", "github:Codertocat/Hello-World#2", "comment:191908831", "pull_request_review_comment"),
         {"surface": "github", "repo": "Codertocat/Hello-World", "issue_number": 2}),
        (wake("jira", "jira:ZUL-1", "comment:10000"), {"surface": "jira", "issue_key": "ZUL-1"}),
        (wake("confluence", "confluence:16777227", "comment:16777228"),
         {"surface": "confluence", "page_id": "16777227", "parent_comment_id": "16777228"}),
        (wake("confluence", "confluence:13139970", "13139970:v2"), {"surface": "confluence", "page_id": "13139970"}),
    ],
)
def test_each_surfaces_trigger_names_its_place_in_its_tools_own_argument_names(trigger: Trigger, target: dict[str, Any]) -> None:
    assert target_of(trigger) == target


def test_a_trigger_from_no_surface_has_no_target_and_leaves_the_message_as_it_was() -> None:
    task = new(TaskAssigned(seat="ada", title="standup", instructions="post the standup"), Trace.root(), source="scheduler")
    org, ada = company({"gh": {"builtin": "github"}})
    assert target_of(Trigger(events=[task])) is None
    assert with_reply_target("Task: standup", Trigger(events=[task]), org, ada, TOOLS) == "Task: standup"


def test_the_reply_tool_is_the_seats_grant_of_the_surfaces_shipped_server_under_the_companys_name_for_it() -> None:
    org, ada = company({"tracker": {"builtin": "jira"}, "chat": {"builtin": "mattermost"}})
    assert reply_target(wake("jira", "jira:ZUL-1", "comment:1"), org, ada) == {
        "surface": "jira", "reply_tool": "tracker__add_comment", "issue_key": "ZUL-1"}
    chat = reply_target(wake("mattermost", "mattermost:chan0dm", ""), org, ada)
    assert chat == {"surface": "mattermost", "reply_tool": "chat__post_message", "channel_id": "chan0dm"}
    assert reply_target(wake("github", "github:o/r#3", ""), org, ada) == {"surface": "github", "repo": "o/r", "issue_number": 3}


def test_the_target_follows_the_message_as_one_json_line_after_its_lead_and_only_for_a_seat_with_tools() -> None:
    org, ada = company({"gh": {"builtin": "github"}})
    trigger = wake("github", "github:octo-org/octo-repo#7", "comment:1201", "issue_comment")
    text = with_reply_target("grace: @ada please look", trigger, org, ada, TOOLS)
    said, lead, line = text.split("\n\n")[0], *text.split("\n\n")[1].split("\n")
    assert (said, lead) == ("grace: @ada please look", REPLY_TARGET_LEAD)
    assert json.loads(line) == {"surface": "github", "reply_tool": "gh__add_comment", "repo": "octo-org/octo-repo",
                                "issue_number": 7, "comment_id": 1201}
    assert with_reply_target("grace: @ada please look", trigger, org, ada, []) == "grace: @ada please look"
