"""Seats answer on the trackers where they were asked, through a real ``manage.py up``: a GitHub issue comment gets a
comment on that issue, a Jira comment a Jira comment, a Confluence page comment a reply on that page — each with
ada's own credentials, at the place the turn's reply target named.

The triggers are the recorded vendor deliveries of ``shared/fixtures/webhooks``
(``github/issue_comment-created.json``, ``jira/comment_created.json``,
``confluence/comment_created-legacy-connect-example.json``) as published,
with one change each: the comment mentions ada (GitHub's ``@login``, Jira's
``[~accountid:…]``, Confluence's storage-format user link), which is what
addresses a seat on a tracker. The company grants ada the shipped servers
(``builtin: github|jira|confluence``), each grant mapping the server's
credential variables to ada's own while the shared ones hold others; each
vendor is a loopback server speaking its REST API
(``tests/tracker_vendor_support.py``). The model reads the reply target from
the prompt and calls the named tool with exactly its values, so what reaches
the vendor is what the target said.
"""
from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from chat_vendor_support import CallLog, ScriptedModel
from seats.reply_target import REPLY_TARGET_LEAD, REPLY_TOOL, SURFACE
from seats_support import json_vendor
from tests.up_support import UpProcess, http_json, openai_company, serve, turn_completed, up_env
from tracker_vendor_support import ConfluenceApi, GitHubApi, JiraApi, basic, confluence_api, github_api, jira_api, only_call

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "tracker-reply-up-operator-token-0123456789"
ADA_GITHUB_TOKEN = "ghp_adaOwnFineGrainedToken0000000000000"
SHARED_GITHUB_TOKEN = "ghp_companySharedToken000000000000000000"
ADA_ATLASSIAN_USER = "ada-bot@acme.example"
ADA_JIRA_TOKEN = "ATATT-ada-own-jira-api-token"
ADA_CONFLUENCE_TOKEN = "ATATT-ada-own-confluence-api-token"
SHARED_ATLASSIAN_USER = "shared@acme.example"
SHARED_ATLASSIAN_TOKEN = "ATATT-company-shared-token"
ADA_ACCOUNT = "5b10ac8d82e05b22cc7d4ada"
#: The people of the fixtures: GitHub's Codertocat, Jira's and Confluence's admin.
GRACE_GITHUB, GRACE_JIRA, GRACE_CONFLUENCE = "Codertocat", "5a1b0e47748e770ed11f338c", "ff80808154510724015451074c160001"
#: Each reply tool's parameters besides its text (what the model copies from the target).
REPLY_PARAMS = {"github": ("repo", "issue_number"), "jira": ("issue_key",), "confluence": ("page_id", "parent_comment_id")}
COMPANY = openai_company("MODEL_URL", "TRACKER_UP_OPENAI_KEY", 60) + f"""\
surfaces:
  github: {{secret_env: GITHUB_WEBHOOK_SECRET, verify: false, api_url: "GITHUB_URL"}}
  jira: {{secret_env: JIRA_WEBHOOK_SECRET, verify: false, server: "JIRA_URL"}}
  confluence: {{secret_env: CONFLUENCE_WEBHOOK_SECRET, verify: false, server: "CONFLUENCE_URL"}}
mcp_servers:
  github: {{builtin: github}}
  jira: {{builtin: jira}}
  wiki: {{builtin: confluence}}
seats:
  - {{handle: ada, kind: agent, role: engineer, max_rounds: 4,
     identities: {{github: ada-bot, jira: {ADA_ACCOUNT}, confluence: {ADA_ACCOUNT}}},
     tools: [{{server: github, env: {{GITHUB_TOKEN: ADA_GITHUB_TOKEN}}}},
             {{server: jira, env: {{JIRA_USER: ADA_ATLASSIAN_USER, JIRA_TOKEN: ADA_JIRA_TOKEN}}}},
             {{server: wiki, env: {{CONFLUENCE_USER: ADA_ATLASSIAN_USER, CONFLUENCE_TOKEN: ADA_CONFLUENCE_TOKEN}}}}]}}
  - {{handle: grace, kind: human, role: lead,
     identities: {{github: {GRACE_GITHUB}, jira: {GRACE_JIRA}, confluence: {GRACE_CONFLUENCE}}}}}
"""


def told_target(said: list[dict[str, Any]]) -> dict[str, Any]:
    """The reply target the turn's user message carries (the JSON line after its lead line)."""
    (user,) = [m for m in said if m.get("role") == "user"]
    lines = str(user["content"]).splitlines()
    return dict(json.loads(lines[lines.index(REPLY_TARGET_LEAD) + 1]))


class Model(ScriptedModel[str]):
    """The model: a known phrase is answered by calling the reply tool the target names, with the target's values."""

    def tool_call(self, scripted: str, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        target = told_target(messages)
        args = {k: target[k] for k in REPLY_PARAMS[target[SURFACE]] if k in target}
        return target[REPLY_TOOL], {**args, "body": scripted}


@dataclass
class TrackersUp:
    log: CallLog
    github: GitHubApi
    jira: JiraApi
    confluence: ConfluenceApi
    model: Model
    up: UpProcess

    def post(self, path: str, payload: dict[str, Any], headers: dict[str, str]) -> str:
        status, answer = http_json(
            "POST", f"{self.up.url}{path}", json.dumps(payload).encode(), {"Content-Type": "application/json", **headers}
        )
        assert status == 202, answer
        return str(answer["trace_id"])

    def turn_of(self, trace_id: str) -> dict[str, Any]:
        """The trace's completed turn as published (its wire form), once it completed."""
        turn_completed(self.up.url + "/", trace_id, TOKEN)
        (row,) = self.api(f"/api/events?trace_id={trace_id}&type=agent_turn_completed")["events"]
        return dict(self.api(f"/api/events/{row['id']}")["event"]["wire"])

    def tool_calls_of(self, trace_id: str) -> list[dict[str, Any]]:
        (row,) = self.api(f"/api/events?trace_id={trace_id}&type=agent_phase_completed")["events"]
        rounds = self.api(f"/api/events/{row['id']}")["event"]["wire"]["rounds"]
        return [call for r in rounds for call in r.get("tool_calls", [])]

    def api(self, path: str) -> Any:
        status, answer = http_json("GET", self.up.url + path, None, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, (path, answer)
        return answer


@pytest.fixture(scope="module")
def trackers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrackersUp]:
    tmp = tmp_path_factory.mktemp("trackers-up")
    log = CallLog()
    model = Model(log)
    ada_jira, ada_wiki = basic(ADA_ATLASSIAN_USER, ADA_JIRA_TOKEN), basic(ADA_ATLASSIAN_USER, ADA_CONFLUENCE_TOKEN)
    shared = basic(SHARED_ATLASSIAN_USER, SHARED_ATLASSIAN_TOKEN)
    with (
        github_api(log, {ADA_GITHUB_TOKEN, SHARED_GITHUB_TOKEN}) as github,
        jira_api(log, {ada_jira, shared}, {"ZUL-1"}) as jira,
        confluence_api(log, {ada_wiki, shared}, {"16777227"}) as confluence,
        json_vendor(model.answer) as model_url,
    ):
        github.comment("Codertocat/Hello-World", 1, GRACE_GITHUB, "Spelling error in the README file")
        confluence.known_comment("16777227", "16777228")
        text = COMPANY
        for name, value in (("MODEL_URL", model_url), ("GITHUB_URL", github.url), ("JIRA_URL", jira.url),
                            ("CONFLUENCE_URL", confluence.url)):
            text = text.replace(f'"{name}"', f'"{value}"')
        (tmp / "company.yaml").write_text(text)
        env = up_env(
            CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_VAR_DIR=str(tmp / "data"), TRACKER_UP_OPENAI_KEY="sk-tracker-up-test-key",
            GITHUB_WEBHOOK_SECRET="unused", JIRA_WEBHOOK_SECRET="unused", CONFLUENCE_WEBHOOK_SECRET="unused",
            # Ada's grants map the servers' variables to her own; the shared ones are set too, so a call made
            # with anything but hers would show its credentials.
            ADA_GITHUB_TOKEN=ADA_GITHUB_TOKEN, ADA_ATLASSIAN_USER=ADA_ATLASSIAN_USER, ADA_JIRA_TOKEN=ADA_JIRA_TOKEN,
            ADA_CONFLUENCE_TOKEN=ADA_CONFLUENCE_TOKEN, GITHUB_TOKEN=SHARED_GITHUB_TOKEN,
            JIRA_USER=SHARED_ATLASSIAN_USER, JIRA_TOKEN=SHARED_ATLASSIAN_TOKEN,
            CONFLUENCE_USER=SHARED_ATLASSIAN_USER, CONFLUENCE_TOKEN=SHARED_ATLASSIAN_TOKEN,
        )
        for process in serve(UpProcess(tmp, "--company", str(tmp / "company.yaml"), node="t1", env=env)):
            yield TrackersUp(log, github, jira, confluence, model, process)


def fixture(fixtures_dir: Path, name: str) -> dict[str, Any]:
    return dict(copy.deepcopy(json.loads((fixtures_dir / "webhooks" / name).read_text())))


def test_a_github_issue_comment_gets_ada_s_comment_back_on_that_issue_with_her_own_token(
    trackers: TrackersUp, fixtures_dir: Path
) -> None:
    delivery = fixture(fixtures_dir, "github/issue_comment-created.json")
    delivery["comment"]["body"] = "@ada-bot " + delivery["comment"]["body"]
    trackers.model.script["I'll get this fixed right away"] = "Fixed in the README; thanks for the report."
    trace = trackers.post("/webhooks/github", delivery, {"X-GitHub-Event": "issue_comment", "X-GitHub-Delivery": str(uuid.uuid4())})
    turn = trackers.turn_of(trace)

    assert not turn["failed"], turn
    (asked, *_) = trackers.model.asked("I'll get this fixed right away")
    assert told_target(asked.args["messages"]) == {
        "surface": "github", "reply_tool": "github__add_comment", "repo": "Codertocat/Hello-World", "issue_number": 1,
        "comment_id": 492700400,
    }
    # The turn first read the issue's comments for its thread block, with ada's token, then commented.
    read, posted = trackers.log.of("github", "/api/v3/repos/Codertocat/Hello-World/issues/1/comments")
    assert (read.verb, read.token) == ("GET", f"token {ADA_GITHUB_TOKEN}")
    assert (posted.verb, posted.token, posted.args) == (
        "POST", f"token {ADA_GITHUB_TOKEN}", {"body": "Fixed in the README; thanks for the report."}
    )
    (call,) = trackers.tool_calls_of(trace)
    assert (call["server"], call["tool"], call["ok"]) == ("github", "add_comment", True)


def test_a_jira_comment_gets_ada_s_jira_comment_on_that_issue_as_her_own_account(
    trackers: TrackersUp, fixtures_dir: Path
) -> None:
    delivery = fixture(fixtures_dir, "jira/comment_created.json")
    delivery["comment"]["body"] = f"[~accountid:{ADA_ACCOUNT}] " + delivery["comment"]["body"]
    trackers.model.script["Leaving a comment here!"] = "Seen; I will pick ZUL-1 up today."
    trace = trackers.post("/webhooks/jira", delivery, {"X-Atlassian-Webhook-Identifier": str(uuid.uuid4())})
    turn = trackers.turn_of(trace)

    assert not turn["failed"], turn
    (asked, *_) = trackers.model.asked("Leaving a comment here!")
    assert told_target(asked.args["messages"]) == {"surface": "jira", "reply_tool": "jira__add_comment", "issue_key": "ZUL-1"}
    read, posted = trackers.log.of("jira", "/rest/api/2/issue/ZUL-1/comment")  # the thread block's read, then the reply
    assert (read.verb, read.token) == ("GET", basic(ADA_ATLASSIAN_USER, ADA_JIRA_TOKEN))
    assert (posted.verb, posted.token, posted.args) == (
        "POST", basic(ADA_ATLASSIAN_USER, ADA_JIRA_TOKEN), {"body": "Seen; I will pick ZUL-1 up today."}
    )
    assert [c["body"] for c in trackers.jira.comments["ZUL-1"]] == ["Seen; I will pick ZUL-1 up today."]


def test_a_confluence_page_comment_gets_ada_s_reply_on_that_page_in_the_comment_s_thread(
    trackers: TrackersUp, fixtures_dir: Path
) -> None:
    delivery = fixture(fixtures_dir, "confluence/comment_created-legacy-connect-example.json")
    delivery["comment"]["body"] = {"storage": {"representation": "storage", "value": (
        f'<p><ac:link><ri:user ri:account-id="{ADA_ACCOUNT}" /></ac:link> can you review this page?</p>')}}
    trackers.model.script["can you review this page?"] = "Reviewed: two typos fixed & one link updated."
    trace = trackers.post("/webhooks/confluence?event=comment_created", delivery,
                          {"X-Atlassian-Webhook-Identifier": str(uuid.uuid4())})
    turn = trackers.turn_of(trace)

    assert not turn["failed"], turn
    (asked, *_) = trackers.model.asked("can you review this page?")
    assert told_target(asked.args["messages"]) == {
        "surface": "confluence", "reply_tool": "wiki__add_comment", "page_id": "16777227", "parent_comment_id": "16777228",
    }
    posted = only_call(trackers.log.of("confluence", "/wiki/api/v2/footer-comments"))
    assert (posted.verb, posted.token, posted.args) == (
        "POST", basic(ADA_ATLASSIAN_USER, ADA_CONFLUENCE_TOKEN),
        {"parentCommentId": "16777228",
         "body": {"representation": "storage", "value": "<p>Reviewed: two typos fixed &amp; one link updated.</p>"}},
    )
    (made,) = trackers.confluence.comments["16777227"]
    assert made["parentCommentId"] == "16777228"
