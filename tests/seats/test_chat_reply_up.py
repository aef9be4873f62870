"""Seats answer where they were asked, through a real ``manage.py up``: a Slack mention and a Mattermost post, each
replied to in its thread with ada's own bot token, the working indicator set as the turn starts and cleared as
it ends, and a vendor refusing the indicator changing nothing else.

The company grants ada the shipped chat servers (``builtin: slack``,
``builtin: mattermost``), each grant mapping the server's token variable to
ada's own (``{server: slack, env: {SLACK_BOT_TOKEN: ADA_SLACK_BOT_TOKEN}}``)
while the shared variables hold other tokens, pointed at local servers that speak Slack's Web API
and Mattermost's REST API v4 (``tests/chat_vendor_support.py``); the model
is a local OpenAI-compatible server that answers a known question with the
reply tool's call. Every vendor call and every model request lands in one
ordered log, so what is asserted is the exact call and its place.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from crewlet.events.types.phrases import TRIGGER_ANSWERED_IN_THREAD
from chat_vendor_support import CallLog, MattermostApi, ScriptedModel, SlackWebApi, first, mattermost_api, slack_web_api
from seats_support import json_vendor
from tests.up_support import UpProcess, http_json, openai_company, serve, turn_completed, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "chat-reply-up-operator-token-0123456789"
ADA_SLACK_TOKEN = "xoxb-ada-own-bot-token-4242"
ADA_MM_TOKEN = "ada-own-mattermost-bot-token"
#: The company-wide bot tokens, under the servers' own variable names: what a seat without a mapping would use.
SHARED_SLACK_TOKEN = "xoxb-company-shared-bot-token"
SHARED_MM_TOKEN = "company-shared-mattermost-token"
ADA_MM_USER = "adabotuser00000000000000aa"
ADA_MM_ID = "xei6dqz8xfgm7kqzddjziyofyo"
GRACE_MM_ID = "cmr7sncacib4xfhd6yo3n4tf5e"
COMPANY = openai_company("MODEL_URL", "CHAT_UP_OPENAI_KEY", 60) + """\
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false, api_url: "SLACK_URL"}
  mattermost: {token_env: MATTERMOST_WEBHOOK_TOKEN, verify: false, server: "MATTERMOST_URL"}
mcp_servers:
  slack: {builtin: slack}
  mattermost: {builtin: mattermost}
seats:
  - {handle: ada, kind: agent, role: engineer, max_rounds: 4, identities: {slack: U0ADA, mattermost: ADA_MM_ID},
     tools: [{server: slack, env: {SLACK_BOT_TOKEN: ADA_SLACK_BOT_TOKEN}},
             {server: mattermost, env: {MATTERMOST_BOT_TOKEN: ADA_MATTERMOST_BOT_TOKEN}}]}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE, mattermost: GRACE_MM_ID}}
"""


class Model(ScriptedModel[tuple[str, dict[str, Any]]]):
    """The model: a known question gets the reply tool's call, a tool's result the closing answer."""

    def tool_call(self, scripted: tuple[str, dict[str, Any]], messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        return scripted


@dataclass
class ChatUp:
    log: CallLog
    slack: SlackWebApi
    mattermost: MattermostApi
    model: Model
    up: UpProcess

    def post(self, source: str, payload: dict[str, Any]) -> str:
        status, answer = http_json(
            "POST", f"{self.up.url}/webhooks/{source}", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        assert status == 202, answer
        return str(answer["trace_id"])

    def turn_of(self, trace_id: str) -> dict[str, Any]:
        """The trace's completed turn as published (its wire form), once it completed."""
        turn_completed(self.up.url + "/", trace_id, TOKEN)
        rows = self.api(f"/api/events?trace_id={trace_id}&type=agent_turn_completed")["events"]
        (row,) = rows
        return dict(self.api(f"/api/events/{row['id']}")["event"]["wire"])

    def phase_of(self, trace_id: str) -> dict[str, Any]:
        (row,) = self.api(f"/api/events?trace_id={trace_id}&type=agent_phase_completed")["events"]
        return dict(self.api(f"/api/events/{row['id']}")["event"]["wire"])

    def api(self, path: str) -> Any:
        status, answer = http_json("GET", self.up.url + path, None, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, (path, answer)
        return answer

    def cleared(self, turn_id: str) -> str:
        """The node's ``working_indicator_cleared`` line of ``turn_id``, once it is printed."""
        return wait_until(
            lambda: next((line for line in self.up.output_so_far().splitlines()
                          if "working_indicator_cleared" in line and turn_id in line), ""),
            60, f"the indicator of turn {turn_id} cleared",
        )

    def events(self, trace_id: str, kind: str) -> list[dict[str, Any]]:
        """The events of ``kind`` in the trace, each as published (its wire form), oldest first."""
        rows = self.api(f"/api/events?trace_id={trace_id}&type={kind}")["events"]
        return [dict(self.api(f"/api/events/{row['id']}")["event"]["wire"]) for row in reversed(rows)]

    def worked_turn(self, trace_id: str) -> dict[str, Any]:
        """The trace's turn that completed without failing, once there is one (its failed ones may come first)."""
        return wait_until(
            lambda: next((t for t in self.events(trace_id, "agent_turn_completed") if not t["failed"]), None),
            90, f"a turn of trace {trace_id} that did not fail",
        )

    def lines(self, event: str, turn_id: str) -> list[str]:
        return [line for line in self.up.output_so_far().splitlines() if f"event={event}" in line and turn_id in line]


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatUp]:
    tmp = tmp_path_factory.mktemp("chat-up")
    log = CallLog()
    model = Model(log)
    with (
        slack_web_api(log, {ADA_SLACK_TOKEN, SHARED_SLACK_TOKEN}) as slack,
        mattermost_api(log, {ADA_MM_TOKEN: ADA_MM_USER, SHARED_MM_TOKEN: "companybotuser000000000000"}) as mattermost,
        json_vendor(model.answer) as model_url,
    ):
        text = COMPANY
        for name, value in (("MODEL_URL", model_url), ("SLACK_URL", slack.url), ("MATTERMOST_URL", mattermost.url),
                            ("ADA_MM_ID", ADA_MM_ID), ("GRACE_MM_ID", GRACE_MM_ID)):
            text = text.replace(name, value)
        (tmp / "company.yaml").write_text(text)
        env = up_env(
            CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_VAR_DIR=str(tmp / "data"), CHAT_UP_OPENAI_KEY="sk-chat-up-test-key",
            SLACK_SIGNING_SECRET="unused", MATTERMOST_WEBHOOK_TOKEN="unused",
            # Ada's grants map the servers' token variables to her own bots' tokens; the shared ones are
            # set too, so a call made with anything but hers would show its token.
            ADA_SLACK_BOT_TOKEN=ADA_SLACK_TOKEN, ADA_MATTERMOST_BOT_TOKEN=ADA_MM_TOKEN,
            SLACK_BOT_TOKEN=SHARED_SLACK_TOKEN, MATTERMOST_BOT_TOKEN=SHARED_MM_TOKEN,
            CREWLET_TOOLS_TYPING_EVERY_S="0.2",
        )
        for process in serve(UpProcess(tmp, "--company", str(tmp / "company.yaml"), node="t1", env=env)):
            yield ChatUp(log, slack, mattermost, model, process)


def slack_mention(channel: str, root: str, ts: str, text: str) -> dict[str, Any]:
    """grace mentions ada in a reply inside a channel thread (the shape of the Events API's thread-reply fixture)."""
    return {
        "type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex[:10]}", "team_id": "T0ACME",
        "event": {"type": "message", "channel": channel, "channel_type": "channel", "user": "U0GRACE",
                  "text": f"<@U0ADA> {text}", "ts": ts, "thread_ts": root},
        "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
    }


def mattermost_posted(post: dict[str, Any]) -> dict[str, Any]:
    """The websocket ``posted`` frame for ``post``, mentioning ada, as Mattermost sends it (``data.post`` as JSON text)."""
    return {
        "event": "posted", "seq": 7,
        "broadcast": {"channel_id": post["channel_id"], "omit_users": None, "team_id": "", "user_id": ""},
        "data": {"channel_display_name": "Town Square", "channel_name": "town-square", "channel_type": "O",
                 "post": json.dumps(post), "sender_name": "@grace", "team_id": "teamacme000000000000000000",
                 "mentions": json.dumps([ADA_MM_ID]), "set_online": True},
    }


def only(calls: list[Call], **args: Any) -> Call:
    found = [c for c in calls if all(c.args.get(k) == v for k, v in args.items())]
    assert len(found) == 1, (args, calls)
    return found[0]


def test_a_slack_mention_in_a_thread_makes_ada_reply_in_that_thread_through_her_own_bot_token(chat: ChatUp) -> None:
    root, ts = "1718000000.000100", "1718000000.000200"
    reply = {"channel": "C0DEV", "thread_ts": root, "text": "The build is green."}
    chat.model.script["summarise the build"] = ("slack__reply_in_thread", reply)
    trace = chat.post("slack", slack_mention("C0DEV", root, ts, "summarise the build"))
    turn = chat.turn_of(trace)
    chat.cleared(turn["turn_id"])

    assert not turn["failed"]
    posted = only(chat.log.of("slack", "chat.postMessage"), channel="C0DEV", thread_ts=root)
    assert (posted.verb, posted.token, posted.args) == ("POST", ADA_SLACK_TOKEN, reply)
    (tool_call,) = chat.phase_of(trace)["rounds"][0]["tool_calls"]
    assert (tool_call["server"], tool_call["tool"], tool_call["ok"]) == ("slack", "reply_in_thread", True)
    asked = chat.model.asked("summarise the build")[0]
    assert "C0DEV" in asked.args["said"] and root in asked.args["said"]  # the model was told where it was asked

    # The working indicator: eyes on grace's message from the turn's start, gone at its end, with ada's token.
    added = only(chat.log.of("slack", "reactions.add"), timestamp=ts)
    removed = only(chat.log.of("slack", "reactions.remove"), timestamp=ts)
    for call in (added, removed):
        assert (call.token, call.args) == (ADA_SLACK_TOKEN, {"channel": "C0DEV", "timestamp": ts, "name": "eyes"})
    last_model_call = chat.model.asked("summarise the build")[-1]
    assert added.seq < posted.seq < last_model_call.seq < removed.seq


def test_a_mattermost_post_mentioning_ada_gets_her_reply_in_its_thread_with_her_bot(chat: ChatUp) -> None:
    root = chat.mattermost.add_post("chan0town00000000000000000", GRACE_MM_ID, "@ada is the deploy done?")
    reply = {"channel_id": root["channel_id"], "root_id": root["id"], "message": "Deployed at ten."}
    chat.model.script["is the deploy done"] = ("mattermost__reply_in_thread", reply)
    trace = chat.post("mattermost", mattermost_posted(root))
    turn = chat.turn_of(trace)
    cleared = chat.cleared(turn["turn_id"])

    assert not turn["failed"]
    posted = only(chat.log.of("mattermost", "/posts"), root_id=root["id"])
    assert (posted.verb, posted.token, posted.args) == ("POST", ADA_MM_TOKEN, reply)
    (stored,) = [p for p in chat.mattermost.posts.values() if p["message"] == "Deployed at ten."]
    assert (stored["user_id"], stored["root_id"]) == (ADA_MM_USER, root["id"])  # posted as ada's bot, in the thread

    # The typing event in the thread, from the turn's start, re-sent while it ran and not after it ended.
    typing = [c for c in chat.log.of("mattermost", "/users/me/typing") if c.args.get("parent_id") == root["id"]]
    assert typing and {(c.token, c.args["channel_id"]) for c in typing} == {(ADA_MM_TOKEN, root["channel_id"])}
    assert typing[0].seq < posted.seq
    sent = int(re.search(r"calls=(\d+)", cleared).group(1))  # type: ignore[union-attr]
    assert sent == len(typing)
    chat.model.script.pop("is the deploy done")
    later = chat.post("slack", slack_mention("C0LATER", "1718000001.000100", "1718000001.000100", "anything new?"))
    chat.turn_of(later)  # a whole turn later, still the same count: the typing stopped with its turn
    assert len([c for c in chat.log.of("mattermost", "/users/me/typing") if c.args.get("parent_id") == root["id"]]) == sent


def test_a_vendor_refusing_the_working_indicator_changes_nothing_else(chat: ChatUp) -> None:
    chat.slack.fail["reactions.add"] = "missing_scope"
    chat.mattermost.fail["/users/me/typing"] = 403
    try:
        root, ts = "1718000002.000100", "1718000002.000300"
        slack_reply = {"channel": "C0OPS", "thread_ts": root, "text": "Restarted it."}
        chat.model.script["restart the worker"] = ("slack__reply_in_thread", slack_reply)
        slack_turn = chat.turn_of(chat.post("slack", slack_mention("C0OPS", root, ts, "restart the worker")))

        post = chat.mattermost.add_post("chan0ops000000000000000000", GRACE_MM_ID, "@ada rotate the logs")
        mm_reply = {"channel_id": post["channel_id"], "root_id": post["id"], "message": "Rotated."}
        chat.model.script["rotate the logs"] = ("mattermost__reply_in_thread", mm_reply)
        mm_turn = chat.turn_of(chat.post("mattermost", mattermost_posted(post)))
        for turn in (slack_turn, mm_turn):
            chat.cleared(turn["turn_id"])
    finally:
        chat.slack.fail.clear()
        chat.mattermost.fail.clear()

    assert not slack_turn["failed"] and not mm_turn["failed"]
    assert only(chat.log.of("slack", "chat.postMessage"), thread_ts=root).args == slack_reply
    assert only(chat.log.of("mattermost", "/posts"), root_id=post["id"]).args == mm_reply
    assert first(chat.log.of("slack", "reactions.add"), timestamp=ts) is not None  # tried, refused
    assert first(chat.log.of("slack", "reactions.remove"), timestamp=ts) is None  # nothing shown, nothing to clear
    tries = [c for c in chat.log.of("mattermost", "/users/me/typing") if c.args.get("parent_id") == post["id"]]
    assert tries
    for turn in (slack_turn, mm_turn):  # one warning per turn, however often the typing event was refused
        warned = chat.lines("working_indicator_failed", turn["turn_id"])
        assert len(warned) == 1, warned
        assert ADA_SLACK_TOKEN not in warned[0] and ADA_MM_TOKEN not in warned[0]
    # Only the indicator's own line: the driver's and its HTTP client's per-call lines stay out of the node's log.
    assert not [line for line in chat.up.output_so_far().splitlines()
                if "logger=mattermostautodriver" in line or "logger=httpx " in line]


def grace_said(ts: str, text: str, root: str) -> dict[str, Any]:
    """grace's message as ``conversations.replies`` lists it."""
    return {"type": "message", "ts": ts, "user": "U0GRACE", "text": f"<@U0ADA> {text}", "thread_ts": root}


def failed_turn(chat: ChatUp, trace_id: str) -> dict[str, Any]:
    turns = wait_until(lambda: chat.events(trace_id, "agent_turn_completed"), 60, f"the first turn of trace {trace_id}")
    assert turns[0]["failed"], turns
    return turns[0]


def test_a_failed_thread_message_is_answered_by_the_next_turn_in_its_thread_and_its_redelivery_is_dropped(chat: ChatUp) -> None:
    channel, root, a_ts, b_ts = "C0THR", "1718000010.000100", "1718000010.000200", "1718000010.000300"
    thread = chat.slack.threads[(channel, root)] = [
        {"type": "message", "ts": root, "user": "U0GRACE", "text": "the nightly job died", "thread_ts": root},
        grace_said(a_ts, "message A: why did it die?", root),
    ]
    chat.model.failing.add("message A")
    trace_a = chat.post("slack", slack_mention(channel, root, a_ts, "message A: why did it die?"))
    failed_turn(chat, trace_a)

    thread.append(grace_said(b_ts, "message B: any news?", root))
    reply = {"channel": channel, "thread_ts": root, "text": "Out of disk; cleaned, and it runs again."}
    chat.model.script["message B"] = ("slack__reply_in_thread", reply)
    trace_b = chat.post("slack", slack_mention(channel, root, b_ts, "message B: any news?"))
    answered = chat.worked_turn(trace_b)

    # B's turn was shown A, waiting, in its thread block, apart from its own message, and reported it.
    phase = chat.phase_of(trace_b)
    assert phase["thread_block"]["status"] == "read" and f"message:slack:{channel}:{a_ts}" in phase["thread_block"]["waiting"]
    assert "[U0GRACE | waiting] <@U0ADA> message A: why did it die?" in phase["user_prompt"]
    assert "[U0GRACE | this message woke you] <@U0ADA> message B: any news?" in phase["user_prompt"]
    # A comes round again and is dropped as answered in its thread, naming the turn that answered it.
    skipped = wait_until(lambda: chat.events(trace_a, "turn_trigger_skipped"), 90, "A's redelivery skipped")
    assert (skipped[0]["reason"], skipped[0]["turn_id"]) == (TRIGGER_ANSWERED_IN_THREAD, answered["turn_id"])
    assert [t["failed"] for t in chat.events(trace_a, "agent_turn_completed")] == [True] * len(chat.events(trace_a, "agent_turn_completed"))
    assert [c.args for c in chat.log.of("slack", "chat.postMessage") if c.args.get("thread_ts") == root] == [reply]


def test_a_failed_top_level_message_still_gets_its_own_turn_after_a_newer_one_in_its_channel(chat: ChatUp) -> None:
    channel, first_ts, second_ts = "C0TOPL", "1718000020.000100", "1718000020.000200"
    for ts, text in ((first_ts, "message T1: rotate the keys"), (second_ts, "message T2: and the certs")):
        chat.slack.threads[(channel, ts)] = [grace_said(ts, text, ts)]
    chat.model.failing.add("message T1")
    trace_first = chat.post("slack", slack_mention(channel, first_ts, first_ts, "message T1: rotate the keys"))
    failed_turn(chat, trace_first)

    second_reply = {"channel": channel, "thread_ts": second_ts, "text": "Certs renewed."}
    chat.model.script["message T2"] = ("slack__reply_in_thread", second_reply)
    chat.worked_turn(chat.post("slack", slack_mention(channel, second_ts, second_ts, "message T2: and the certs")))
    first_reply = {"channel": channel, "thread_ts": first_ts, "text": "Keys rotated."}
    chat.model.script["message T1"] = ("slack__reply_in_thread", first_reply)
    chat.model.failing.discard("message T1")

    chat.worked_turn(trace_first)  # nobody was shown T1 waiting: it is still owed its turn, and gets it
    assert chat.events(trace_first, "turn_trigger_skipped") == []
    posted = [c.args for c in chat.log.of("slack", "chat.postMessage") if c.args.get("channel") == channel]
    assert posted == [second_reply, first_reply]
