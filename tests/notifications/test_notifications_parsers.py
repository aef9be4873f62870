"""Every recorded webhook fixture, parsed: its partition key, its conversation identity, and the rules behind them.

The expected keys are written out below AND checked against the fixtures
README's key column, so a fixture added to ../shared without a test here
fails rather than passing unseen. One deliberate difference from that
column, which the issue and the design settle: a DM THREAD REPLY keeps its
thread as the partition key (so a merged trigger never carries the wrong
reply target); the README's channel-only key for it is the conversation
identity, which every message of a DM shares.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from notifications.parsers import (
    WHY_ASSIGNEE,
    WHY_DM,
    WHY_MENTION,
    WHY_REVIEWER,
    DeliveryMeta,
    ParseError,
    Parsed,
)
from notifications.sources import PARSERS
from notifications_support import fixture, fixture_files, fixture_params, github_event_of, need, readme_keys

# (partition_key, conversation_identity); "" for a delivery nothing routes.
EXPECTED: dict[str, tuple[str, str]] = {
    # GitHub: repo#number, one key for both.
    "github/issue_comment-created-with-organization.json": ("github:Codertocat/Hello-World#1",) * 2,
    "github/issue_comment-created.json": ("github:Codertocat/Hello-World#1",) * 2,
    "github/issues-opened.json": ("github:Codertocat/Hello-World#1",) * 2,
    "github/pull_request-opened.json": ("github:Codertocat/Hello-World#2",) * 2,
    "github/pull_request_review_comment-created.json": ("github:Codertocat/Hello-World#2",) * 2,
    # Slack channels: channel + thread root, one key for both.
    "slack/event_callback-app_mention.json": ("slack:C111:1595926230.009600",) * 2,
    "slack/event_callback-message-bot_message-subtype.json": ("slack:C111:1610262363.001600",) * 2,
    "slack/event_callback-message-channel-thread-reply.json": ("slack:C111:1726133698.626339",) * 2,
    "slack/event_callback-message-channel-toplevel-real-ids.json": ("slack:C06NRA6JLER:1719209506.817929",) * 2,
    "slack/event_callback-message-channel-toplevel.json": ("slack:C111:1596183880.004200",) * 2,
    "slack/event_callback-message-from-bot-user-no-subtype.json": ("slack:C111:1610261539.000900",) * 2,
    "slack/event_callback-message-message_changed-docs.json": ("slack:C123ABC456:1355517523.000005",) * 2,
    "slack/event_callback-message-message_changed.json": ("slack:C111:1665102338.901939",) * 2,
    "slack/event_callback-message-message_deleted.json": ("slack:C111:1665368619.804829",) * 2,
    "slack/event_callback-message-private-channel-group-docs.json": ("slack:G024BE91L:1355517523.000005",) * 2,
    "slack/event_callback-message-thread_broadcast.json": ("slack:C111:1633663824.000500",) * 2,
    # Slack DMs: top-level on the channel; a thread reply keeps its thread; identity always the channel.
    "slack/event_callback-message-im-thread-reply-from-bot.json": ("slack:D111:1726133698.626339", "slack:D111"),
    "slack/event_callback-message-im-thread-reply.json": ("slack:D111:1726133698.626339", "slack:D111"),
    "slack/event_callback-message-im-toplevel-docs.json": ("slack:D024BE91L", "slack:D024BE91L"),
    "slack/event_callback-message-im-toplevel.json": ("slack:D111", "slack:D111"),
    "slack/event_callback-message-message_changed-im-thread-root.json": ("slack:D111", "slack:D111"),
    "slack/event_callback-message-mpim-docs.json": ("slack:G024BE91L", "slack:G024BE91L"),
    "slack/url_verification.json": ("", ""),
    # Jira: the issue.
    "jira/comment_created.json": ("jira:ZUL-1",) * 2,
    "jira/jira-issue_updated-status-change.json": ("jira:TEST-1",) * 2,
    # Confluence: the page (a comment: the page it is on).
    "confluence/comment_created-legacy-connect-example.json": ("confluence:16777227",) * 2,
    "confluence/page_created-legacy-connect-example.json": ("confluence:16777227",) * 2,
    "confluence/page_created.json": ("confluence:13139970",) * 2,
    "confluence/page_updated-personal-space.json": ("confluence:1188560897",) * 2,
    "confluence/page_updated.json": ("confluence:13139970",) * 2,
    # Mattermost: the Slack rule, root_id or the post's own id.
    "mattermost/posted-channel-root-decoded.json": (
        "mattermost:4fgt3n51f7ftpff91gk1iy1zow:wqpuawcw3iym3pq63s5xi1776r",
    )
    * 2,
    "mattermost/posted-channel-root.json": ("mattermost:1waumyyd6jyczrxntuiopybygy:5greg5b4w3rojmqc188znn8s7c",) * 2,
    "mattermost/posted-channel-thread-reply-decoded.json": (
        "mattermost:4fgt3n51f7ftpff91gk1iy1zow:wqpuawcw3iym3pq63s5xi1776r",
    )
    * 2,
    "mattermost/posted-dm-root.json": ("mattermost:4ckrmjaeeb8mbpodbmo6bknpge",) * 2,
}


def parse_fixture(path: Path) -> Parsed:
    source = path.parent.name
    meta = DeliveryMeta(event_name=github_event_of(path.name)) if source == "github" else DeliveryMeta()
    return PARSERS[source](json.loads(path.read_bytes()), meta)


@pytest.mark.parametrize("path", fixture_params())
def test_every_fixture_parses_to_its_partition_key_and_identity(path: Optional[Path]) -> None:
    path = need(path)
    name = f"{path.parent.name}/{path.name}"
    assert name in EXPECTED, f"{name} is a new fixture: add its expected keys here"
    parsed = parse_fixture(path)
    partition, identity = EXPECTED[name]
    assert (parsed.partition_key, parsed.conversation_identity) == (partition, identity)


@pytest.mark.parametrize("path", fixture_params())
def test_a_partition_key_is_always_the_identity_or_a_finer_cut_of_it(path: Optional[Path]) -> None:
    parsed = parse_fixture(need(path))
    if parsed.partition_key:
        assert parsed.partition_key == parsed.conversation_identity or parsed.partition_key.startswith(
            parsed.conversation_identity + ":"
        )


def test_the_expected_keys_agree_with_the_fixtures_readme() -> None:
    readme = readme_keys()
    files = {f"{p.parent.name}/{p.name}" for p in fixture_files()}
    assert set(readme) == files == set(EXPECTED)
    for name, key in readme.items():
        partition, identity = EXPECTED[name]
        if partition == identity:
            assert key == partition, name
        else:  # a DM thread reply: the README keys it on the channel, which is its identity
            assert key == identity and partition.startswith(identity + ":"), name


def test_every_fixture_names_its_event_and_its_delivery() -> None:
    for path in fixture_files():
        parsed = parse_fixture(path)
        assert parsed.event_name, path.name
        if path.parent.name in ("slack", "mattermost") and path.name != "url_verification.json":
            assert parsed.delivery_id, path.name


def test_a_slack_mention_in_a_channel_addresses_the_mentioned_user() -> None:
    parsed = PARSERS["slack"](fixture("slack", "event_callback-app_mention.json"))
    assert [(r.identity, r.why) for r in parsed.recipients] == [("W111", WHY_MENTION)]
    assert parsed.sender == "W222" and parsed.delivery_id == "Ev111" and parsed.body == "<@W111> Hi there!"
    assert not parsed.dm and not parsed.thread_reply and not parsed.filtered


def test_a_slack_dm_addresses_the_authorizing_bot_user_and_a_mpim_is_a_dm_but_a_private_group_is_not() -> None:
    dm = PARSERS["slack"](fixture("slack", "event_callback-message-im-toplevel.json"))
    assert dm.dm and [(r.identity, r.why) for r in dm.recipients] == [("W111", WHY_DM)]
    mpim = PARSERS["slack"](fixture("slack", "event_callback-message-mpim-docs.json"))
    group = PARSERS["slack"](fixture("slack", "event_callback-message-private-channel-group-docs.json"))
    assert mpim.dm and not group.dm


def test_a_slack_d_channel_without_a_channel_type_is_a_dm_and_a_g_channel_without_one_is_not() -> None:
    payload = fixture("slack", "event_callback-message-im-toplevel.json")
    del payload["event"]["channel_type"]
    assert PARSERS["slack"](payload).partition_key == "slack:D111"
    payload["event"]["channel"] = "G999"
    assert PARSERS["slack"](payload).partition_key == "slack:G999:1726133700.887259"


def test_a_slack_dm_thread_reply_is_a_thread_reply_and_a_thread_root_edit_is_not() -> None:
    reply = PARSERS["slack"](fixture("slack", "event_callback-message-im-thread-reply.json"))
    assert reply.thread_reply and reply.dm
    root = PARSERS["slack"](fixture("slack", "event_callback-message-message_changed-im-thread-root.json"))
    assert not root.thread_reply


def test_slack_edits_deletions_and_system_posts_are_the_parsers_own_filtering() -> None:
    slack = PARSERS["slack"]
    assert slack(fixture("slack", "event_callback-message-message_changed.json")).filtered.startswith("edited post")
    assert slack(fixture("slack", "event_callback-message-message_deleted.json")).filtered == "deleted post"
    join = fixture("slack", "event_callback-message-channel-toplevel.json")
    join["event"]["subtype"] = "channel_join"
    assert slack(join).filtered.startswith("system post")
    assert slack(fixture("slack", "url_verification.json")).filtered == "handshake"


def test_a_slack_edit_that_adds_a_mention_addresses_the_newly_mentioned_user() -> None:
    payload = fixture("slack", "event_callback-message-message_changed.json")
    payload["event"]["message"]["text"] = "updated message, <@W111> please look"
    parsed = PARSERS["slack"](payload)
    assert not parsed.filtered and [r.identity for r in parsed.recipients] == ["W111"]


def test_a_thread_broadcast_is_a_reply_in_its_thread() -> None:
    parsed = PARSERS["slack"](fixture("slack", "event_callback-message-thread_broadcast.json"))
    assert parsed.thread_reply and parsed.partition_key == "slack:C111:1633663824.000500" and not parsed.filtered


def test_a_slack_event_callback_without_an_event_fails_to_parse() -> None:
    with pytest.raises(ParseError, match="no event object"):
        PARSERS["slack"]({"type": "event_callback", "event_id": "Ev1"})
    with pytest.raises(ParseError, match="event.channel"):
        PARSERS["slack"]({"type": "event_callback", "event": {"type": "message", "ts": "1.2"}})


def test_github_recipients_are_assignees_requested_reviewers_and_mentions() -> None:
    github = PARSERS["github"]
    pr = github(fixture("github", "pull_request-opened.json"), DeliveryMeta(event_name="pull_request"))
    assert {(r.identity, r.why) for r in pr.recipients} == {("Codertocat", WHY_ASSIGNEE), ("octocat", WHY_REVIEWER)}
    comment = fixture("github", "issue_comment-created.json")
    comment["comment"]["body"] = "cc @octocat and @grace-h, see foo@example.com"
    parsed = github(comment, DeliveryMeta(event_name="issue_comment"))
    assert [r.identity for r in parsed.recipients if r.why == WHY_MENTION] == ["octocat", "grace-h"]
    assert parsed.sender == "Codertocat" and parsed.digest_body == ""


def test_a_github_review_comment_takes_its_number_from_the_pull_request() -> None:
    payload = fixture("github", "pull_request_review_comment-created.json")
    assert "number" not in payload
    parsed = PARSERS["github"](payload, DeliveryMeta(event_name="pull_request_review_comment"))
    assert parsed.partition_key == "github:Codertocat/Hello-World#2"
    assert "README.md" in parsed.body


def test_a_github_lifecycle_event_collapses_to_its_lead_line_and_an_opened_one_keeps_its_text() -> None:
    github = PARSERS["github"]
    opened = github(fixture("github", "issues-opened.json"), DeliveryMeta(event_name="issues"))
    assert opened.digest_body == "" and "accidently" in opened.body
    labeled = fixture("github", "issues-opened.json")
    labeled["action"] = "labeled"
    parsed = github(labeled, DeliveryMeta(event_name="issues"))
    assert parsed.digest_body == "Codertocat labeled issue #1 in Codertocat/Hello-World: Spelling error in the README file"


def test_a_github_event_nothing_routes_is_filtered_and_a_handled_one_without_a_number_fails() -> None:
    push = PARSERS["github"]({"ref": "refs/heads/main", "repository": {"full_name": "a/b"}}, DeliveryMeta(event_name="push"))
    assert push.filtered.startswith("unhandled event push")
    with pytest.raises(ParseError, match="number"):
        PARSERS["github"]({"action": "opened", "repository": {"full_name": "a/b"}, "issue": {}}, DeliveryMeta(event_name="issues"))


def test_jira_recipients_are_the_assignee_and_account_id_mentions() -> None:
    jira = PARSERS["jira"]
    comment = fixture("jira", "comment_created.json")
    comment["comment"]["body"] = "[~accountid:acc-ada] can you look? [~accountid:acc-grace]"
    parsed = jira(comment)
    assert [(r.identity, r.why) for r in parsed.recipients] == [("acc-ada", WHY_MENTION), ("acc-grace", WHY_MENTION)]
    assert parsed.sender == "5a1b0e47748e770ed11f338c" and parsed.url == "https://zulipintegrations.atlassian.net/browse/ZUL-1"
    updated = fixture("jira", "jira-issue_updated-status-change.json")
    updated["issue"]["fields"]["assignee"] = {"accountId": "acc-ada", "displayName": "Ada"}
    assert [(r.identity, r.why) for r in jira(updated).recipients] == [("acc-ada", WHY_ASSIGNEE)]


def test_a_jira_update_collapses_to_its_lead_line_and_a_comment_keeps_its_text() -> None:
    jira = PARSERS["jira"]
    updated = jira(fixture("jira", "jira-issue_updated-status-change.json"))
    assert updated.digest_body == 'James Williams updated TEST-1 "Fix That": status: To Do → In Progress'
    assert updated.body.startswith(updated.digest_body) and "Description:\nFix That" in updated.body
    assert jira(fixture("jira", "comment_created.json")).digest_body == ""


def test_a_jira_adf_comment_is_read_as_text_with_its_mentions() -> None:
    comment = fixture("jira", "comment_created.json")
    comment["comment"]["body"] = {
        "type": "doc",
        "content": [
            {
                "type": "paragraph",
                "content": [
                    {"type": "mention", "attrs": {"id": "acc-ada", "text": "@Ada"}},
                    {"type": "text", "text": " please review"},
                ],
            }
        ],
    }
    parsed = PARSERS["jira"](comment)
    assert parsed.body.endswith("@Ada please review") and [r.identity for r in parsed.recipients] == ["acc-ada"]


def test_a_jira_delivery_without_an_issue_key_fails_to_parse() -> None:
    with pytest.raises(ParseError, match="issue.key"):
        PARSERS["jira"]({"webhookEvent": "jira:issue_updated", "issue": {"fields": {}}})


def test_confluence_ids_are_normalised_to_strings_and_the_event_name_can_come_from_the_route() -> None:
    confluence = PARSERS["confluence"]
    page = fixture("confluence", "page_updated-personal-space.json")
    assert isinstance(page["page"]["id"], int)
    assert confluence(page).partition_key == "confluence:1188560897"
    assert confluence(page).event_name == "page_updated"
    named = confluence(page, DeliveryMeta(query={"event": "page_restored"}))
    assert named.event_name == "page_restored"
    assert confluence(fixture("confluence", "page_created.json")).event_name == "page_created"


def test_a_confluence_comment_without_its_page_fails_to_parse() -> None:
    payload = fixture("confluence", "comment_created-legacy-connect-example.json")
    del payload["comment"]["parent"]
    with pytest.raises(ParseError, match="comment.parent"):
        PARSERS["confluence"](payload)


def test_mattermost_decodes_the_post_string_and_addresses_dm_members_and_mentions() -> None:
    mm = PARSERS["mattermost"]
    dm = mm(fixture("mattermost", "posted-dm-root.json"))
    assert dm.dm and dm.sender == "t1pn9rb63fnpjrqibgriijcx4r" and dm.body == "aweff"
    assert [(r.identity, r.why) for r in dm.recipients] == [("xei6dqz8xfgm7kqzddjziyofyo", WHY_DM)]
    assert dm.delivery_id == "a4aurxyyc3yruntz4zfmdw75nr"
    channel = mm(fixture("mattermost", "posted-channel-root.json"))
    assert channel.body == "message sent" and not channel.dm
    reply = mm(fixture("mattermost", "posted-channel-thread-reply-decoded.json"))
    assert reply.thread_reply and [r.identity for r in reply.recipients] == ["qmw86q7qsjriura9jos75i4why"]


def test_mattermost_username_mentions_skip_the_broadcast_ones() -> None:
    payload = fixture("mattermost", "posted-channel-root-decoded.json")
    payload["data"]["post"]["message"] = "@channel hey @Ada.Bot and @linus."
    payload["data"]["mentions"] = []
    parsed = PARSERS["mattermost"](payload)
    assert [r.identity for r in parsed.recipients] == ["Ada.Bot", "linus"]


def test_mattermost_system_and_deleted_posts_are_filtered_and_a_bad_post_string_fails() -> None:
    mm = PARSERS["mattermost"]
    system = fixture("mattermost", "posted-channel-root-decoded.json")
    system["data"]["post"]["type"] = "system_join_channel"
    assert mm(system).filtered.startswith("system post")
    deleted = fixture("mattermost", "posted-channel-root-decoded.json")
    deleted["data"]["post"]["delete_at"] = 1533085458999
    assert mm(deleted).filtered == "deleted post"
    broken = fixture("mattermost", "posted-channel-root.json")
    broken["data"]["post"] = "{not json"
    with pytest.raises(ParseError, match="data.post is not valid JSON"):
        mm(broken)


def test_a_mattermost_dm_thread_reply_keeps_its_thread_key_and_the_channel_identity() -> None:
    payload = fixture("mattermost", "posted-dm-root.json")
    post = json.loads(payload["data"]["post"])
    post["root_id"] = "rootpost0000000000000000000"
    payload["data"]["post"] = json.dumps(post)
    parsed = PARSERS["mattermost"](payload)
    assert parsed.partition_key == "mattermost:4ckrmjaeeb8mbpodbmo6bknpge:rootpost0000000000000000000"
    assert parsed.conversation_identity == "mattermost:4ckrmjaeeb8mbpodbmo6bknpge"


def test_a_payload_that_is_not_an_object_fails_to_parse_for_every_source() -> None:
    for parser in PARSERS.values():
        with pytest.raises(ParseError):
            parser(["not", "an", "object"])  # type: ignore[arg-type]
