"""The shipped tracker servers (``builtin: github | jira | confluence``) as a seat's toolbox runs them, against local vendor APIs.

Each server is the real child the engine starts, reached through
:class:`~seats.tools.mcp.McpToolbox`; each vendor a loopback server speaking
its REST API (``tests/tracker_vendor_support.py``); every assertion is on the
exact request it received. The reply target's keys are checked against the
tools' own input schemas, so the target and the tools cannot drift apart.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import pytest
import pytest_asyncio
from mcp import Client

from chat_vendor_support import CallLog
from crewlet.company.conf import ToolSettings
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import parse_company
from seats_support import environment
from seats.reply_target import REPLY_TOOLS
from seats.tools import ToolCall
from seats.tools.mcp import McpToolbox
from seats.tools.mcp_transport import open_transport
from tracker_vendor_support import ConfluenceApi, GitHubApi, JiraApi, basic, confluence_api, github_api, jira_api

pytestmark = pytest.mark.integration  # the servers are real MCP server processes

GH_TOKEN, USER, JIRA_TOKEN, WIKI_TOKEN = "ghp_adaTrackerServers", "ada@acme.example", "jira-token-ada", "wiki-token-ada"
SETTINGS = ToolSettings(call_timeout_s=30.0, start_timeout_s=60.0, restart_backoff_s=0.05)
#: Each server's tools as MCP's hints say they are: (read only, destructive, idempotent).
HINTS = {
    "github": {"add_comment": (False, False, False), "read_comments": (True, False, True), "add_reaction": (False, False, True)},
    "jira": {"add_comment": (False, False, False), "read_comments": (True, False, True)},
    "confluence": {"add_comment": (False, False, False), "read_comments": (True, False, True)},
}
#: Every key a reply target of the surface may carry besides ``surface`` and ``reply_tool``.
TARGET_KEYS = {
    "slack": {"channel", "thread_ts", "timestamp"}, "mattermost": {"channel_id", "root_id", "post_id"},
    "github": {"repo", "issue_number", "comment_id"}, "jira": {"issue_key"}, "confluence": {"page_id", "parent_comment_id"},
}



def company(github: str, jira: str, wiki: str) -> Organization:
    return parse_company({
        "org": "acme",
        "surfaces": {"github": {"api_url": github}, "jira": {"server": jira}, "confluence": {"server": wiki},
                     "mattermost": {"server": "http://127.0.0.1:9"}},
        "mcp_servers": {k: {"builtin": k} for k in ("github", "jira", "confluence", "slack", "mattermost")},
        "seats": [{"handle": "ada", "kind": "agent", "tools": ["github", "jira", "confluence"]},
                  {"handle": "linus", "kind": "agent", "tools": ["slack", "mattermost"]}],
    })


class Vendors:
    def __init__(self, log: CallLog, github: GitHubApi, jira: JiraApi, wiki: ConfluenceApi, org: Organization, box: McpToolbox) -> None:
        self.log, self.github, self.jira, self.wiki, self.org, self.box = log, github, jira, wiki, org, box

    async def call(self, tool: str, /, **arguments: Any) -> Any:
        return await self.box.call("ada", ToolCall(id=f"call-{tool}", name=tool, arguments=arguments))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def trackers() -> AsyncIterator[Vendors]:
    log = CallLog()
    with (
        github_api(log, {GH_TOKEN}) as github,
        jira_api(log, {basic(USER, JIRA_TOKEN)}, {"ZUL-1"}) as jira,
        confluence_api(log, {basic(USER, WIKI_TOKEN)}, {"16777227"}) as wiki,
    ):
        org = company(github.url, jira.url, wiki.url)
        with environment(GITHUB_TOKEN=GH_TOKEN, JIRA_USER=USER, JIRA_TOKEN=JIRA_TOKEN, CONFLUENCE_USER=USER, CONFLUENCE_TOKEN=WIKI_TOKEN):
            box = McpToolbox(CompanyHolder(org), settings=SETTINGS)
            try:
                await box.specs("ada")
                yield Vendors(log, github, jira, wiki, org, box)
            finally:
                await box.stop()


async def listed(org: Organization, handle: str, name: str) -> dict[str, Any]:
    seat = org.seat_by_handle(handle)
    assert seat is not None
    (granted,) = [g for g in org.granted_servers(seat) if g.name == name]
    async with Client(open_transport(granted, asyncio.Event(), seat=handle)) as client:
        return {tool.name: tool for tool in (await client.list_tools()).tools}


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", ["github", "jira", "confluence"])
async def test_each_tracker_server_lists_its_tools_annotated_as_the_read_or_the_write_each_is(trackers: Vendors, name: str) -> None:
    tools = await listed(trackers.org, "ada", name)
    assert set(tools) == set(HINTS[name])
    for tool_name, (read_only, destructive, idempotent) in HINTS[name].items():
        hints = tools[tool_name].annotations
        assert (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint) == (
            read_only, destructive, idempotent, True), tool_name


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("surface, handle", [("github", "ada"), ("jira", "ada"), ("confluence", "ada"), ("slack", "linus"), ("mattermost", "linus")])
async def test_every_reply_target_key_is_a_parameter_of_its_surfaces_tools_and_the_reply_tool_takes_the_place_ones(
    trackers: Vendors, surface: str, handle: str
) -> None:
    tools = await listed(trackers.org, handle, surface)
    params = {name: set(tool.input_schema["properties"]) for name, tool in tools.items()}
    assert TARGET_KEYS[surface] <= set().union(*params.values())
    reply = params[REPLY_TOOLS[surface]]
    place = {"slack": {"channel", "thread_ts"}, "mattermost": {"channel_id", "root_id"}}.get(surface, TARGET_KEYS[surface] - {"comment_id"})
    assert place <= reply


@pytest.mark.asyncio(loop_scope="module")
async def test_github_reads_an_issues_comments_and_reacts_to_one_each_in_one_call_with_the_granted_token(trackers: Vendors) -> None:
    made = trackers.github.comment("octo-org/octo-repo", 7, "grace", "Is this still broken?")
    read = await trackers.call("github__read_comments", repo="octo-org/octo-repo", issue_number=7, limit=10)
    reacted = await trackers.call("github__add_reaction", repo="octo-org/octo-repo", issue_number=7, comment_id=made["id"], content="eyes")
    assert read.ok and reacted.ok, (read.error, reacted.error)
    assert [(c["user"], c["body"]) for c in json.loads(read.content)["comments"]] == [("grace", "Is this still broken?")]
    (listing,) = trackers.log.of("github", "/api/v3/repos/octo-org/octo-repo/issues/7/comments")
    assert (listing.verb, listing.token, listing.args["per_page"]) == ("GET", f"token {GH_TOKEN}", "10")
    (reaction,) = trackers.log.of("github", f"/api/v3/repos/octo-org/octo-repo/issues/comments/{made['id']}/reactions")
    assert (reaction.verb, reaction.token, reaction.args) == ("POST", f"token {GH_TOKEN}", {"content": "eyes"})


@pytest.mark.asyncio(loop_scope="module")
async def test_githubs_refusal_reaches_the_model_with_its_status_and_message_and_a_bad_repo_is_refused_unsent(trackers: Vendors) -> None:
    missing = await trackers.call("github__add_comment", repo="octo-org/octo-repo", issue_number=404, body="hello")
    before = len(trackers.log.calls)
    bad = await trackers.call("github__add_comment", repo="../../user", issue_number=1, body="hello")
    assert not missing.ok and missing.error.endswith(
        "GitHub refused POST /repos/octo-org/octo-repo/issues/404/comments: HTTP 404: Not Found")
    assert not bad.ok and "repo must be a repository as owner/name" in bad.error
    assert len(trackers.log.calls) == before


@pytest.mark.asyncio(loop_scope="module")
async def test_jira_reads_an_issues_comments_a_page_at_a_time_and_names_its_refusal(trackers: Vendors) -> None:
    posted = await trackers.call("jira__add_comment", issue_key="zul-1", body="first")
    read = await trackers.call("jira__read_comments", issue_key="ZUL-1", limit=5)
    missing = await trackers.call("jira__add_comment", issue_key="NOPE-9", body="hello")
    assert posted.ok and read.ok, (posted.error, read.error)
    answer = json.loads(read.content)
    assert ([c["body"] for c in answer["comments"]], answer["total"], answer["has_more"]) == (["first"], 1, False)
    (listing,) = [c for c in trackers.log.of("jira", "/rest/api/2/issue/ZUL-1/comment") if c.verb == "GET"]
    assert (listing.token, listing.args) == (basic(USER, JIRA_TOKEN), {"startAt": "0", "maxResults": "5", "orderBy": "created"})
    assert not missing.ok and missing.error.endswith(
        "Jira refused POST /rest/api/2/issue/NOPE-9/comment: HTTP 404: Issue does not exist or you do not have permission to see it.")


@pytest.mark.asyncio(loop_scope="module")
async def test_confluence_comments_on_a_page_and_reads_its_footer_comments_back(trackers: Vendors) -> None:
    posted = await trackers.call("confluence__add_comment", page_id="16777227", body="Looks good.\n\nOne <b> tag left.")
    read = await trackers.call("confluence__read_comments", page_id="16777227", limit=10)
    assert posted.ok and read.ok, (posted.error, read.error)
    (made,) = [c for c in trackers.log.of("confluence", "/wiki/api/v2/footer-comments") if c.args.get("pageId")]
    assert (made.token, made.args) == (basic(USER, WIKI_TOKEN), {"pageId": "16777227", "body": {
        "representation": "storage", "value": "<p>Looks good.</p><p>One &lt;b&gt; tag left.</p>"}})
    (listing,) = trackers.log.of("confluence", "/wiki/api/v2/pages/16777227/footer-comments")
    assert listing.args == {"body-format": "storage", "limit": "10"}
    assert [c["body"] for c in json.loads(read.content)["comments"]] == ["<p>Looks good.</p><p>One &lt;b&gt; tag left.</p>"]


@pytest.mark.asyncio(loop_scope="module")
async def test_confluences_refusal_is_named_and_a_page_id_that_is_no_number_is_refused_unsent(trackers: Vendors) -> None:
    missing = await trackers.call("confluence__add_comment", page_id="999", body="hello")
    before = len(trackers.log.calls)
    bad = await trackers.call("confluence__read_comments", page_id="Some page")
    assert not missing.ok and missing.error.endswith("Confluence refused POST /wiki/api/v2/footer-comments: HTTP 404: Not Found")
    assert not bad.ok and "page_id must be a Confluence content id" in bad.error
    assert len(trackers.log.calls) == before
