"""The thread block: each vendor's conversation read with the seat's own credentials, against local servers speaking its API.

Every reader is the one a turn runs (:func:`seats.thread_block.read_thread_block`),
through the shipped servers' clients, pointed at the loopback vendors of
``tests/chat_vendor_support.py`` and ``tests/tracker_vendor_support.py``;
what is asserted is the block the model reads, the waiting messages the turn
reports to the completion ledger, and the exact calls the vendors received.
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from typing import Any, Iterator

import pytest

from chat_vendor_support import (
    SLACK_BOT_USER,
    CallLog,
    MattermostApi,
    SlackWebApi,
    mattermost_api,
    slack_web_api,
)
from crewlet.company.org import Organization, Seat
from crewlet.company.fields import CompanyError
from crewlet.company.parse import parse_company
from crewlet.company.thread_bounds import ThreadBounds
from crewlet.events import new
from crewlet.events.trace import Trace
from crewlet.events.types import ExternalNotification
from seats.thread_block import (
    MARK_WAITING,
    MARK_WOKE,
    STATUS_FAILED,
    STATUS_READ,
    STATUS_UNREAD,
    ThreadBlock,
    read_thread_block,
    shown,
)
from seats.thread_read import Conversation, ThreadMessage
from seats.turn_types import Trigger
from tracker_vendor_support import ConfluenceApi, GitHubApi, JiraApi, basic, confluence_api, github_api, jira_api

SLACK_TOKEN, MM_TOKEN, GH_TOKEN = "xoxb-ada-thread-block", "ada-mm-thread-block", "ghp_adaThreadBlock"
USER, JIRA_TOKEN, WIKI_TOKEN = "ada@acme.example", "jira-token-ada", "wiki-token-ada"
MM_BOT = "adabotuser00000000000000aa"
JIRA_ADA = "5b10ac8d82e05b22cc7d4ada"
#: Ada's own variables (her grants map the servers' names onto them): what the readers must use.
ENVIRON = {"ADA_SLACK_BOT_TOKEN": SLACK_TOKEN, "ADA_MM_TOKEN": MM_TOKEN, "GITHUB_TOKEN": GH_TOKEN, "JIRA_USER": USER,
           "JIRA_TOKEN": JIRA_TOKEN, "CONFLUENCE_USER": USER, "CONFLUENCE_TOKEN": WIKI_TOKEN,
           "SLACK_BOT_TOKEN": "xoxb-shared-not-adas", "MATTERMOST_BOT_TOKEN": "shared-not-adas"}


class Vendors:
    def __init__(self, log: CallLog, slack: SlackWebApi, mm: MattermostApi, github: GitHubApi, jira: JiraApi,
                 wiki: ConfluenceApi) -> None:
        self.log, self.slack, self.mm, self.github, self.jira, self.wiki = log, slack, mm, github, jira, wiki

    def company(self, **thread_block: Any) -> tuple[Organization, Seat]:
        org = parse_company({
            "org": "acme",
            "surfaces": {"slack": {"api_url": self.slack.url}, "mattermost": {"server": self.mm.url},
                         "github": {"api_url": self.github.url}, "jira": {"server": self.jira.url},
                         "confluence": {"server": self.wiki.url}},
            "mcp_servers": {k: {"builtin": k} for k in ("slack", "mattermost", "github", "jira", "confluence")},
            "seats": [{"handle": "ada", "kind": "agent",
                       "identities": {"slack": SLACK_BOT_USER, "mattermost": MM_BOT, "github": "ada-bot", "jira": JIRA_ADA,
                                      "confluence": JIRA_ADA},
                       "tools": [{"server": "slack", "env": {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"}},
                                 {"server": "mattermost", "env": {"MATTERMOST_BOT_TOKEN": "ADA_MM_TOKEN"}},
                                 "github", "jira", "confluence"]}],
            **({"thread_block": thread_block} if thread_block else {}),
        })
        ada = org.seat_by_handle("ada")
        assert ada is not None
        return org, ada

    def block(self, trigger: Trigger, **thread_block: Any) -> ThreadBlock:
        org, ada = self.company(**thread_block)
        return asyncio.run(read_thread_block(org, ada, trigger, environ=ENVIRON))


@pytest.fixture(scope="module")
def vendors() -> Iterator[Vendors]:
    log = CallLog()
    with (
        slack_web_api(log, {SLACK_TOKEN}) as slack,
        mattermost_api(log, {MM_TOKEN: MM_BOT}) as mm,
        github_api(log, {GH_TOKEN}) as github,
        jira_api(log, {basic(USER, JIRA_TOKEN)}, {"ZUL-1"}) as jira,
        confluence_api(log, {basic(USER, WIKI_TOKEN)}, {"16777227"}) as wiki,
    ):
        yield Vendors(log, slack, mm, github, jira, wiki)


def wake(source: str, partition_key: str, message_id: str, event_name: str = "") -> Trigger:
    extras = {"sender": "grace", "body": "@ada please look", "partition_key": partition_key, "event_name": event_name,
              "conversation_identity": partition_key, "message_id": message_id}
    event = new(ExternalNotification(seat="ada", sender="grace", body="@ada please look"), Trace.root(), source=source, extras=extras)
    return Trigger(events=[event], partition_key=partition_key)


def slack_message(ts: str, user: str, text: str, root: str = "") -> dict[str, Any]:
    return {"type": "message", "ts": ts, "user": user, "text": text, **({"thread_ts": root} if root else {})}


def test_a_slack_thread_shows_the_messages_after_the_seats_last_reply_as_waiting_and_reads_with_its_own_token(vendors: Vendors) -> None:
    root = "1718200000.000100"
    vendors.slack.threads[("C0BLK", root)] = [
        slack_message(root, "U0GRACE", "the deploy is red", root),
        slack_message("1718200000.000200", SLACK_BOT_USER, "looking", root),
        slack_message("1718200000.000300", "U0GRACE", "message A: it is the cache", root),
        slack_message("1718200000.000400", "U0LINUS", "and the queue", root),
        slack_message("1718200000.000500", "U0GRACE", "message B: any news?", root),
        slack_message("1718200000.000600", "U0GRACE", "a later one", root),
    ]
    block = vendors.block(wake("slack", f"slack:C0BLK:{root}", "C0BLK:1718200000.000500"))

    assert block.waiting == ("message:slack:C0BLK:1718200000.000300", "message:slack:C0BLK:1718200000.000400")
    assert block.record == {"surface": "slack", "status": STATUS_READ, "shown": 6, "left_out": 0, "waiting": list(block.waiting)}
    lines = block.text.splitlines()
    assert lines[1:] == [
        "[U0GRACE] the deploy is red", f"[{SLACK_BOT_USER} | you] looking", f"[U0GRACE | {MARK_WAITING}] message A: it is the cache",
        f"[U0LINUS | {MARK_WAITING}] and the queue", f"[U0GRACE | {MARK_WOKE}] message B: any news?", "[U0GRACE] a later one",
    ]
    (call,) = [c for c in vendors.log.of("slack", "conversations.replies") if c.args.get("channel") == "C0BLK"]
    assert call.token == SLACK_TOKEN and call.args["ts"] == root


def test_a_slack_direct_message_at_its_channels_top_reads_the_channels_latest_messages(vendors: Vendors) -> None:
    vendors.slack.history["D0BLK"] = [
        slack_message(f"1718300000.00{i}00", "U0GRACE" if i != 2 else SLACK_BOT_USER, f"dm {i}") for i in range(1, 6)
    ]
    block = vendors.block(wake("slack", "slack:D0BLK", "D0BLK:1718300000.00500"), max_messages=3)

    assert block.waiting == ("message:slack:D0BLK:1718300000.00300", "message:slack:D0BLK:1718300000.00400")
    assert block.record is not None and block.record["left_out"] is None  # Slack says there are more, not how many
    assert "earlier messages left out" in block.text.splitlines()[0]
    (call,) = vendors.log.of("slack", "conversations.history")
    assert (call.token, call.args["channel"], call.args["limit"]) == (SLACK_TOKEN, "D0BLK", "3")


def test_a_top_level_channel_message_has_nothing_waiting_before_it(vendors: Vendors) -> None:
    ts = "1718400000.000100"
    vendors.slack.threads[("C0TOP", ts)] = [slack_message(ts, "U0GRACE", "second top-level ask")]
    block = vendors.block(wake("slack", f"slack:C0TOP:{ts}", f"C0TOP:{ts}"))
    assert block.waiting == () and block.record is not None and block.record["shown"] == 1


def test_a_mattermost_thread_is_read_through_the_post_with_the_seats_bot(vendors: Vendors) -> None:
    root = vendors.mm.add_post("chan0blk00000000000000000", "grace00000000000000000000a", "root ask")
    older = vendors.mm.add_post(root["channel_id"], "grace00000000000000000000a", "waiting one", root["id"])
    woke = vendors.mm.add_post(root["channel_id"], "grace00000000000000000000a", "the new one", root["id"])
    block = vendors.block(wake("mattermost", f"mattermost:{root['channel_id']}:{root['id']}", woke["id"]))

    assert block.waiting == (f"message:mattermost:{root['id']}", f"message:mattermost:{older['id']}")
    (call,) = vendors.log.of("mattermost", f"/posts/{woke['id']}/thread")
    assert call.token == MM_TOKEN


def test_github_comments_are_read_page_by_page_and_the_seats_own_comment_ends_what_waits(vendors: Vendors) -> None:
    vendors.github.issues[("octo/blk", 7)] = []
    vendors.github.comment("octo/blk", 7, "grace", "first")
    vendors.github.comment("octo/blk", 7, "ada-bot", "answered")
    waiting_one = vendors.github.comment("octo/blk", 7, "grace", "still waiting")
    woke = vendors.github.comment("octo/blk", 7, "grace", "ping")
    block = vendors.block(wake("github", "github:octo/blk#7", f"comment:{woke['id']}", "issue_comment"))

    assert block.waiting == (f"message:github:comment:{waiting_one['id']}",)
    assert [c.token for c in vendors.log.of("github", "/api/v3/repos/octo/blk/issues/7/comments")] == [f"token {GH_TOKEN}"]


def test_jira_reads_the_total_then_the_newest_page_and_says_how_many_it_left_out(vendors: Vendors) -> None:
    for i in range(5):
        vendors.jira.answer("POST", "/rest/api/2/issue/ZUL-1/comment", basic(USER, JIRA_TOKEN), {"body": f"c{i}"})
    for c in vendors.jira.comments["ZUL-1"][:4]:
        c["author"] = {"accountId": "grace0account", "displayName": "Grace"}
    woke = vendors.jira.comments["ZUL-1"][3]
    vendors.log.calls.clear()
    block = vendors.block(wake("jira", "jira:ZUL-1", f"comment:{woke['id']}"), max_messages=3)

    assert block.record is not None and (block.record["shown"], block.record["left_out"]) == (3, 2)
    assert block.waiting == (f"message:jira:comment:{vendors.jira.comments['ZUL-1'][2]['id']}",)
    assert "2 earlier messages left out" in block.text.splitlines()[0]
    starts = [c.args["startAt"] for c in vendors.log.of("jira", "/rest/api/2/issue/ZUL-1/comment")]
    assert starts == ["0", "2"]


def test_confluence_page_comments_are_read_with_the_seats_account(vendors: Vendors) -> None:
    auth = basic(USER, WIKI_TOKEN)
    vendors.wiki.answer("POST", "/wiki/api/v2/footer-comments", auth, {"pageId": "16777227", "body": {"representation": "storage", "value": "<p>mine</p>"}})
    for text in ("<p>waiting</p>", "<p>woke</p>"):
        made = vendors.wiki.answer("POST", "/wiki/api/v2/footer-comments", auth, {"pageId": "16777227", "body": {"representation": "storage", "value": text}})[1]
        made["version"]["authorId"] = "grace0account"
    first, waiting_one, woke = vendors.wiki.comments["16777227"]
    block = vendors.block(wake("confluence", "confluence:16777227", f"comment:{woke['id']}"))

    assert block.waiting == (f"message:confluence:comment:{waiting_one['id']}",)
    assert f"[{JIRA_ADA} | you] <p>mine</p>" in block.text
    assert {c.token for c in vendors.log.of("confluence", "/wiki/api/v2/pages/16777227/footer-comments")} == {auth}


def test_a_read_the_vendor_refuses_or_that_outlasts_its_timeout_leaves_no_block_and_the_phase_says_why(vendors: Vendors) -> None:
    vendors.slack.fail["conversations.replies"] = "missing_scope"
    try:
        refused = vendors.block(wake("slack", "slack:C0NO:1718500000.000100", "C0NO:1718500000.000100"))
    finally:
        vendors.slack.fail.clear()
    assert (refused.text, refused.waiting) == ("", ())
    assert refused.record is not None and refused.record["status"] == STATUS_FAILED
    assert "missing_scope" in refused.record["error"] and SLACK_TOKEN not in refused.record["error"]

    vendors.slack.gate = threading.Event()
    try:
        slow = vendors.block(wake("slack", "slack:C0NO:1718500000.000100", "C0NO:1718500000.000100"), timeout_s=0.1)
    finally:
        vendors.slack.gate.set()
        vendors.slack.gate = None
    assert slow.record is not None and slow.record["status"] == STATUS_FAILED and "thread_block.timeout_s" in slow.record["error"]


def test_a_seat_granted_no_server_of_the_surface_reads_nothing_and_a_trigger_from_no_conversation_has_no_block(vendors: Vendors) -> None:
    org, ada = vendors.company()
    bare = dataclasses.replace(ada, tools=())
    unread = asyncio.run(read_thread_block(org, bare, wake("slack", "slack:C0X:1718.000100", "C0X:1718.000100"), environ=ENVIRON))
    assert unread.record is not None and unread.record["status"] == STATUS_UNREAD and unread.text == ""
    task = asyncio.run(read_thread_block(org, ada, wake("", "event:123", "")))
    assert task.record is None and task.text == ""


def test_a_thread_larger_than_the_bounds_keeps_the_newest_and_says_how_many_it_left_out() -> None:
    messages = [ThreadMessage(f"message:slack:C1:{i}", "U0GRACE", f"message {i} " + "x" * 90) for i in range(40)]
    trigger = wake("slack", "slack:C1:0", "C1:39")
    by_count = shown(Conversation("slack", messages), trigger, ThreadBounds(max_messages=5, max_bytes=100_000))
    assert by_count.record is not None and (by_count.record["shown"], by_count.record["left_out"]) == (5, 35)
    assert [re.findall(r"message (\d+)", line) for line in by_count.text.splitlines()[1:]] == [["35"], ["36"], ["37"], ["38"], ["39"]]
    assert "35 earlier messages left out" in by_count.text.splitlines()[0]
    # Only the shown ones wait: the 35 a bound dropped are never reported as answered.
    assert by_count.waiting == tuple(f"message:slack:C1:{i}" for i in range(35, 39))

    by_bytes = shown(Conversation("slack", messages), trigger, ThreadBounds(max_messages=40, max_bytes=1024))
    assert by_bytes.record is not None and by_bytes.record["shown"] == 10 and by_bytes.record["left_out"] == 30
    huge = shown(Conversation("slack", [ThreadMessage("message:slack:C1:39", "U0GRACE", "y" * 5000)]), trigger,
                 ThreadBounds(max_bytes=1024))
    assert huge.text.endswith("…[cut]") and len(huge.text.splitlines()[1].encode()) < 1100


@pytest.mark.parametrize(
    "thread_block, refusal",
    [
        ({"max_messages": 0}, "thread_block.max_messages=0: must be between 1 and 200"),
        ({"max_bytes": 10**9}, "thread_block.max_bytes=1000000000: must be between 1024 and 262144"),
        ({"timeout_s": "soon"}, "must be a number between 0.1 and 60"),
        ({"max_lines": 3}, "thread_block.max_lines=3: unknown key; allowed: max_messages, max_bytes, timeout_s"),
    ],
)
def test_thread_block_bounds_out_of_range_are_refused_naming_the_key_and_what_is_allowed(
    thread_block: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(CompanyError) as refused:
        parse_company({"org": "acme", "thread_block": thread_block})
    assert refusal in str(refused.value) and "thread_block." in str(refused.value) and "\n" not in str(refused.value)
    assert parse_company({"org": "acme", "thread_block": {"max_messages": 5}}).thread_block == ThreadBounds(max_messages=5)
