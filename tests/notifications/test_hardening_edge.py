"""The webhook edge and the router under hostile bodies: unstorable text, deep nesting, odd timestamps, missing secrets.

What nothing downstream can store (a NUL, a lone surrogate) is refused at the
edge with a reason instead of accepted and then failing routing on every
redelivery; verification comes before any decoding; every decode is
depth-limited; tree walks are iterative; a routing failure is one short line.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from crewlet.events.types import SKIP_PARSER_REFUSED, SKIP_PAYLOAD_UNREADABLE
from crewlet.engine.interfaces import NOTIFY
from crewlet.base.jsontext import depth_exceeds
from engine_support import engine_here
from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, Delivery, Outcome
from notifications.edge import InboundRequest
from notifications.parsers import (
    MAX_JSON_DEPTH,
    JSONTooDeep,
    ParseError,
    load_json,
    unstorable,
)
from notifications.runtime import NotifyService
from notifications.service import NotifyRouter, RateValve
from notifications.sources.atlassian import ADF_MAX_NODES
from notifications.sources.jira import JiraParser
from notifications.sources.slack import verify as verify_slack
from notifications_support import (
    SECRETS,
    company,
    fixture,
    hex_hmac,
    holder,
    raw_delivery,
    set_secrets,
    slack_headers,
    slack_message,
)
from seats_support import Recorder, eventually, memory_queues
from test_notifications_edge import ACCEPTED, edge_on, post, published
from tests.up_support import UpProcess, http_json, turn_completed, up_env

pytestmark = pytest.mark.usefixtures("close_store_connections")

SURROGATE = "\ud800"
NUL = "\x00"


def body_of(payload: dict[str, Any]) -> bytes:
    """The JSON a sender puts on the wire: ASCII, with NUL and surrogates as ``\\uXXXX`` escapes."""
    return json.dumps(payload).encode("ascii")


def slack_dm(**event: Any) -> dict[str, Any]:
    payload = slack_message("<@W111> hello", channel="D0ADA", channel_type="im", event_id="EvH1")
    payload["event"].update(event)
    return payload


def deep_adf_json(levels: int, text: str = "deep words", mention: str = "acc-ada") -> str:
    """An ADF document ``levels`` paragraphs deep, as JSON text (the encoder itself recurses, so it is built flat)."""
    inner = json.dumps([{"type": "text", "text": text}, {"type": "mention", "attrs": {"id": mention, "text": "@Ada"}}])
    return '{"type":"doc","version":1,"content":[' + '{"type":"paragraph","content":' * levels + inner + "}" * levels + "]}"


def jira_comment_json(adf: str, comment_id: str = "c-deep") -> bytes:
    head = json.dumps(
        {
            "webhookEvent": "comment_created",
            "issue": {"key": "ACME-7", "fields": {"summary": "Deep"}},
            "comment": {"id": comment_id, "author": {"accountId": "acc-grace", "displayName": "Grace"}, "body": "@@ADF@@"},
        }
    )
    return head.replace('"@@ADF@@"', adf).encode()


def deep_adf_payload(levels: int) -> dict[str, Any]:
    node: Any = [{"type": "text", "text": "deep words"}, {"type": "mention", "attrs": {"id": "acc-ada", "text": "@Ada"}}]
    for _ in range(levels):
        node = [{"type": "paragraph", "content": node}]
    return {
        "webhookEvent": "comment_created",
        "issue": {"key": "ACME-7", "fields": {"summary": "Deep"}},
        "comment": {"id": "c-deep", "author": {"accountId": "acc-grace"}, "body": {"type": "doc", "content": node}},
    }


def nested(depth: int) -> bytes:
    """A JSON object whose ``pad`` nests arrays so the document is ``depth`` levels deep."""
    return b'{"webhookEvent":"x","pad":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


# -- 1. unstorable text is refused at the edge, after verification ---------------------------------------


@pytest.mark.parametrize(
    "where, payload",
    [
        ("event.text", slack_dm(text=f"<@W111> hi {SURROGATE}")),
        ("event.channel", slack_dm(channel=f"D0{SURROGATE}")),
        ("event.user", slack_dm(user=f"U{SURROGATE}")),
        ("event_id", {**slack_dm(), "event_id": f"Ev{SURROGATE}"}),
        ("event.x", slack_dm(**{f"x{SURROGATE}": "key"})),
    ],
)
async def test_a_lone_surrogate_anywhere_in_a_slack_delivery_is_refused_with_400_naming_where(where: str, payload: dict[str, Any]) -> None:
    async with edge_on() as (_, _, rec):
        resp = await post("/webhooks/slack", body_of(payload))
        assert resp.status_code == 400, resp.content
        reason = resp.json()["error"]
        assert where in reason and "lone surrogate (\\ud800)" in reason and "no UTF-8 encoding" in reason
        assert rec.seen == []  # never a 202 that then fails downstream


def _nul_cases() -> list[Any]:
    mm = fixture("mattermost", "posted-dm-root.json")
    post_doc = json.loads(mm["data"]["post"])
    post_doc["message"] = f"hi{NUL}"
    mm_embedded = {**mm, "data": {**mm["data"], "post": json.dumps(post_doc)}}
    github = fixture("github", "issue_comment-created.json")
    github["comment"]["body"] = f"ok{NUL}"
    jira = fixture("jira", "comment_created.json")
    jira["comment"]["body"] = f"ok{NUL}"
    confluence = fixture("confluence", "page_created.json")
    confluence["page"]["title"] = f"T{NUL}"
    return [
        pytest.param("slack", {}, slack_dm(channel=f"D0{NUL}X"), "event.channel", id="slack-channel"),
        pytest.param("github", {"X-GitHub-Event": "issue_comment"}, github, "comment.body", id="github-comment"),
        pytest.param("jira", {}, jira, "comment.body", id="jira-comment"),
        pytest.param("confluence", {}, confluence, "page.title", id="confluence-title"),
        pytest.param("mattermost", {}, mm_embedded, "data.post.message", id="mattermost-embedded-post"),
    ]


@pytest.mark.parametrize("source, headers, payload, where", _nul_cases())
async def test_a_nul_in_any_sources_field_is_refused_with_400_naming_where(
    source: str, headers: dict[str, str], payload: dict[str, Any], where: str
) -> None:
    async with edge_on() as (_, _, rec):
        resp = await post(f"/webhooks/{source}", body_of(payload), headers=headers)
        assert resp.status_code == 400, resp.content
        reason = resp.json()["error"]
        assert where in reason and "NUL character" in reason
        assert rec.seen == []


async def test_a_nul_in_the_event_name_a_query_gives_is_refused() -> None:
    async with edge_on() as (_, _, rec):
        resp = await post("/webhooks/confluence?event=page_updated%00x", body_of(fixture("confluence", "page_updated.json")))
        assert resp.status_code == 400 and "event name contains a NUL" in resp.json()["error"]
        assert rec.seen == []


async def test_an_unsigned_unstorable_delivery_is_refused_for_its_signature_first(monkeypatch: pytest.MonkeyPatch) -> None:
    set_secrets(monkeypatch)
    body = body_of(slack_dm(text=f"hi {SURROGATE}"))
    async with edge_on(company(verify=True)) as (_, _, rec):
        unsigned = await post("/webhooks/slack", body)
        assert unsigned.status_code == 401 and "missing" in unsigned.json()["error"]
        signed = await post("/webhooks/slack", body, headers=slack_headers(body))
        assert signed.status_code == 400 and "lone surrogate" in signed.json()["error"]
        assert rec.seen == []


async def test_a_surrogate_pair_is_a_character_not_a_problem_and_is_accepted_byte_for_byte() -> None:
    body = body_of(slack_dm(text="<@W111> ship it \U0001F680"))
    assert b"\\ud83d\\ude80" in body
    async with edge_on() as (_, _, rec):
        resp = await post("/webhooks/slack", body)
        assert resp.status_code == 202, resp.content
        assert published(rec) == ACCEPTED and rec.seen[0][1].data.raw_bytes() == body


# -- 3. verify first, then decode with a depth limit -------------------------------------------------------


@pytest.mark.parametrize("source", ["slack", "github", "jira", "confluence", "mattermost"])
async def test_a_body_nested_thousands_deep_is_400_with_a_reason_on_every_route(source: str) -> None:
    async with edge_on() as (_, _, rec):
        resp = await post(f"/webhooks/{source}", nested(5000))
        assert resp.status_code == 400, resp.content
        assert resp.json()["error"] == f"the JSON nests deeper than {MAX_JSON_DEPTH} levels: the limit is {MAX_JSON_DEPTH}"
        assert rec.seen == []


async def test_a_body_exactly_at_the_depth_limit_is_accepted() -> None:
    async with edge_on() as (_, _, rec):
        assert (await post("/webhooks/jira", nested(MAX_JSON_DEPTH))).status_code == 202
        assert (await post("/webhooks/jira", nested(MAX_JSON_DEPTH + 1))).status_code == 400
        assert published(rec) == ACCEPTED


async def test_a_deep_body_to_a_verified_mattermost_route_is_401_without_a_token_and_400_with_one(monkeypatch: pytest.MonkeyPatch) -> None:
    set_secrets(monkeypatch)
    async with edge_on(company(verify=True)) as (_, _, rec):
        anonymous = await post("/webhooks/mattermost", nested(5000))
        assert anonymous.status_code == 401 and "token" in anonymous.json()["error"]
        token_in_a_deep_body = b'{"token":"' + SECRETS["mattermost"][1].encode() + b'","pad":' + b"[" * 5000 + b"]" * 5000 + b"}"
        assert (await post("/webhooks/mattermost", token_in_a_deep_body)).status_code == 401
        authorized = await post("/webhooks/mattermost", nested(5000), headers={"Authorization": f"Token {SECRETS['mattermost'][1]}"})
        assert authorized.status_code == 400 and "deeper than" in authorized.json()["error"]
        assert rec.seen == []


def test_brackets_inside_strings_do_not_count_towards_the_depth() -> None:
    text = json.dumps({"text": "[" * 5000, "escaped": '\\"[[[' * 300, "list": [[["ok"]]]})
    assert not depth_exceeds(text, 4)
    assert load_json(text)["list"] == [[["ok"]]]
    assert depth_exceeds(text, 3)
    with pytest.raises(JSONTooDeep):
        load_json(nested(MAX_JSON_DEPTH + 1))


# -- 2. ADF walks are iterative and bounded ------------------------------------------------------------


def test_a_five_thousand_deep_adf_comment_parses_with_its_text_and_its_mention() -> None:
    parsed = JiraParser()(deep_adf_payload(5000))
    assert parsed.body.endswith("deep words@Ada")
    assert [r.identity for r in parsed.recipients] == ["acc-ada"]


def test_an_adf_walk_stops_at_its_node_budget_with_a_parse_error() -> None:
    payload = deep_adf_payload(1)
    payload["comment"]["body"] = {"type": "doc", "content": [{"type": "text", "text": "a"}] * (ADF_MAX_NODES + 1)}
    with pytest.raises(ParseError, match=f"more than {ADF_MAX_NODES} nodes"):
        JiraParser()(payload)


async def test_a_deep_adf_jira_comment_inside_the_limit_is_accepted_and_one_past_it_is_400() -> None:
    async with edge_on() as (_, _, rec):
        ok = await post("/webhooks/jira", jira_comment_json(deep_adf_json(200)))
        assert ok.status_code == 202, ok.content
        too_deep = await post("/webhooks/jira", jira_comment_json(deep_adf_json(5000)))
        assert too_deep.status_code == 400 and "deeper than" in too_deep.json()["error"]
        assert published(rec) == ACCEPTED


# -- 4. Slack's timestamp is whole seconds or nothing ---------------------------------------------------


@pytest.mark.parametrize("stamp", ["NaN", "nan", "inf", "-inf", "Infinity", "1e400", "1e9", "abc", "1718000000.5", " 1718000000", "٣"])
def test_a_slack_timestamp_that_is_not_whole_seconds_fails_the_replay_window(stamp: str) -> None:
    body = b'{"type":"event_callback"}'
    signature = "v0=" + hex_hmac("s", f"v0:{stamp}:".encode() + body)
    req = InboundRequest(source="slack", body=body, headers={"x-slack-signature": signature, "x-slack-request-timestamp": stamp})
    assert verify_slack("s", req, now=time.time()) == "X-Slack-Request-Timestamp is not a whole number of seconds"


async def test_a_correctly_signed_slack_delivery_stamped_nan_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    set_secrets(monkeypatch)
    body = body_of(slack_dm())
    secret = SECRETS["slack"][1]
    headers = {"X-Slack-Request-Timestamp": "NaN", "X-Slack-Signature": "v0=" + hex_hmac(secret, b"v0:NaN:" + body)}
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post("/webhooks/slack", body, headers=headers)
        assert resp.status_code == 401 and "whole number of seconds" in resp.json()["error"]
        assert rec.seen == []


# -- 5. a verified surface with no secret is named at start --------------------------------------------


async def test_a_verified_surface_whose_secret_is_unset_is_named_at_start_by_its_variable_and_never_a_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {env: value for source, (env, value) in SECRETS.items() if source != "slack"}
    caplog.set_level(logging.INFO)
    async with memory_queues("n1") as (_, (q,)):
        notify = NotifyService(q, holder(company(verify=True)), environ=environ, prune_interval_s=0)
        await notify.start()
        try:
            with engine_here(q, services={NOTIFY: notify}):
                missing = [r for r in caplog.records if r.getMessage() == "webhook_secret_missing"]
                assert [(r.surface, r.variable, r.levelno) for r in missing] == [("slack", "SLACK_SIGNING_SECRET", logging.WARNING)]
                resp = await post("/webhooks/slack", body_of(slack_dm()))
                assert resp.status_code == 401
                assert "set SLACK_SIGNING_SECRET (its webhook secret is not configured on this server)" in resp.json()["error"]
        finally:
            await notify.stop()
    logged = caplog.text + "".join(str(vars(r)) for r in caplog.records)
    assert not [value for value in environ.values() if value in logged]


async def test_every_surface_verified_and_configured_warns_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    environ = {env: value for env, value in SECRETS.values()}
    async with memory_queues("n1") as (_, (q,)):
        notify = NotifyService(q, holder(company(verify=True)), environ=environ, prune_interval_s=0)
        await notify.start()
        await notify.stop()
    assert "webhook_secret_missing" not in [r.getMessage() for r in caplog.records]


# -- 6. the router: the payload's fault is a skip and an ack; any other failure one short line ---------


async def _router_on(q: Any) -> NotifyRouter:
    for handle in ("ada", "linus"):
        await q.ensure_subscription(topics.agent_inbox(handle), topics.agent_inbox_group(handle))
    return NotifyRouter(q, holder(), valve=RateValve())


def _once(ev: Any) -> Delivery:
    return Delivery(event=ev, topic=topics.NOTIFICATIONS_INBOUND, remaining=MAX_DELIVERIES - 1)


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize(
    "payload, where",
    [
        (slack_dm(text=f"<@W111> hi {SURROGATE}"), "body"),
        ({**slack_dm(), "event_id": f"Ev{NUL}1"}, "delivery_id"),
        (slack_dm(channel=f"D0{NUL}X"), "message_id"),
    ],
)
async def test_an_unstorable_delivery_already_in_the_stream_is_skipped_as_parse_failed_and_acked(payload: dict[str, Any], where: str) -> None:
    async with memory_queues("n1") as (_, (q,)):
        rec = Recorder().attach(q)
        router = await _router_on(q)
        assert await router._handle(_once(raw_delivery("slack", body_of(payload)))) == Outcome.ACK
        skips = [ev for ev in rec.of("notification_skipped")]
        assert [s.data.reason for s in skips] == [SKIP_PARSER_REFUSED]
        assert skips[0].data.detail.startswith(where) and ("lone surrogate" in skips[0].data.detail or "NUL" in skips[0].data.detail)
        assert rec.of("external_notification") == []


@pytest.mark.django_db(transaction=True, databases=["default"])
async def test_a_deep_delivery_already_in_the_stream_is_skipped_as_unreadable_and_a_deep_adf_within_the_limit_routes() -> None:
    async with memory_queues("n1") as (_, (q,)):
        rec = Recorder().attach(q)
        router = await _router_on(q)
        assert await router._handle(_once(raw_delivery("jira", jira_comment_json(deep_adf_json(5000))))) == Outcome.ACK
        assert [(s.data.reason, s.data.detail) for s in rec.of("notification_skipped")] == [
            (SKIP_PAYLOAD_UNREADABLE, f"not JSON: the JSON nests deeper than {MAX_JSON_DEPTH} levels")
        ]
        assert await router._handle(_once(raw_delivery("jira", jira_comment_json(deep_adf_json(250))))) == Outcome.ACK
        wakes = [ev for topic, ev in rec.seen if topic == topics.agent_inbox("ada")]
        assert [w.data.seat for w in wakes] == ["ada"] and wakes[0].data.body.endswith("deep words@Ada")


@pytest.mark.django_db(transaction=True, databases=["default"])
async def test_a_poison_delivery_on_the_inbound_stream_is_handled_once_not_dead_lettered() -> None:
    async with memory_queues("n1") as (_, (q,)):
        rec = Recorder().attach(q)
        router = await _router_on(q)
        await router.start()
        try:
            await q.publish(topics.NOTIFICATIONS_INBOUND, raw_delivery("slack", body_of(slack_dm(text=f"x {SURROGATE}"))))
            await eventually(lambda: len(rec.of("notification_skipped")) == 1, what="the poison delivery's skip")

            async def drained() -> bool:
                return await q.backlog(topics.NOTIFICATIONS_INBOUND, router.group) == 0 and q.in_flight() == 0

            await eventually(drained, what="the inbound backlog drained")
            assert await q.dead_letters() == []
            assert len(rec.of("notification_skipped")) == 1
        finally:
            await router.stop()


@pytest.mark.django_db(transaction=True, databases=["default"])
async def test_a_failed_routing_attempt_is_one_short_warning_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async with memory_queues("n1") as (broker, (q,)):
        router = await _router_on(q)
        broker.go_away()
        caplog.set_level(logging.DEBUG)
        body = body_of(slack_dm())
        assert await router._handle(_once(raw_delivery("slack", body))) == Outcome.NAK
        broker.come_back()
    failed = [r for r in caplog.records if r.getMessage() == "notify_route_failed"]
    assert len(failed) == 1
    assert failed[0].exc_info is None and failed[0].levelno == logging.WARNING
    assert failed[0].error.startswith("Unavailable: ") and len(failed[0].error) <= 300
    assert not [r for r in caplog.records if r.exc_info]  # no traceback anywhere for this delivery


def test_unstorable_walks_a_deep_value_without_recursion() -> None:
    value: Any = f"bottom{NUL}"
    for _ in range(50_000):
        value = [value]
    problem = unstorable({"a": value}) or ""
    assert problem.startswith("a[0][0][0]") and problem.endswith("contains a NUL character (\\u0000), which the database cannot store")


# -- all of it through a real `manage.py up` ---------------------------------------------------------------

UP_TOKEN = "hardening-edge-operator-token-0123456789"
UP_SLACK_SECRET = "up-slack-signing-secret-4711"
UP_MM_TOKEN = "up-mattermost-token-4711"
UP_COMPANY = """\
org: acme
providers: {llm: [{kind: echo}]}
surfaces:
  slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: true}
  github: {secret_env: GITHUB_WEBHOOK_SECRET, verify: true}
  jira: {secret_env: JIRA_WEBHOOK_SECRET, verify: false}
  confluence: {secret_env: CONFLUENCE_WEBHOOK_SECRET, verify: false}
  mattermost: {token_env: MATTERMOST_TOKEN, verify: true}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA, jira: acc-ada, mattermost: mmada}}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE, jira: acc-grace}}
"""


def _http(url: str, body: bytes = b"", headers: Optional[dict[str, str]] = None, method: str = "POST") -> tuple[int, dict[str, Any]]:
    return http_json(method, url, body if method == "POST" else None, headers, empty={})


def _turn_completed(url: str, trace_id: str) -> list[str]:
    return turn_completed(url, trace_id, UP_TOKEN)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_refuses_unstorable_and_too_deep_bodies_with_400_and_runs_a_deep_adf_comments_turn(tmp_path: Path) -> None:
    (tmp_path / "acme.yaml").write_text(UP_COMPANY)
    env = {k: v for k, v in up_env().items() if k not in {e for e, _ in SECRETS.values()}}
    env.update(CREWLET_OPERATOR_TOKEN=UP_TOKEN, SLACK_SIGNING_SECRET=UP_SLACK_SECRET, MATTERMOST_TOKEN=UP_MM_TOKEN)
    with UpProcess(
        tmp_path, "--data-dir", str(tmp_path / "data"), "--company", str(tmp_path / "acme.yaml"), node="edge1", env=env
    ) as up:
        url = up.url + "/"
        # 5. the verified surface with no secret is named at start, by its variable
        up.wait_for("event=webhook_secret_missing surface=github variable=GITHUB_WEBHOOK_SECRET", timeout_s=10)

        def slack(payload: dict[str, Any] | bytes, stamp: Optional[str] = None) -> tuple[int, dict[str, Any]]:
            body = payload if isinstance(payload, bytes) else body_of(payload)
            headers = slack_headers(body, UP_SLACK_SECRET)
            if stamp is not None:
                headers = {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": "v0=" + hex_hmac(UP_SLACK_SECRET, f"v0:{stamp}:".encode() + body)}
            return _http(url + "webhooks/slack", body, {"Content-Type": "application/json", **headers})

        def dm(**event: Any) -> dict[str, Any]:
            payload = slack_message("<@U0ADA> please look", channel="D0ADA", channel_type="im", user="U0GRACE", authorized="U0ADA",
                                    event_id=f"Ev{time.monotonic_ns()}")
            payload["event"].update(event)
            return payload

        # 1. a lone surrogate and a NUL, signed: refused with the reason, after verification
        status, answer = slack(dm(text=f"<@U0ADA> hi {SURROGATE}"))
        assert status == 400 and "event.text contains a lone surrogate" in answer["error"], answer
        status, answer = slack(dm(channel=f"D0{NUL}X"))
        assert status == 400 and "event.channel contains a NUL character" in answer["error"], answer
        assert slack(dm(text=f"hi {SURROGATE}"), stamp="NaN")[0] == 401  # 4. NaN is no timestamp

        # 3. too deep: 400 on an unverified route, and a verified one answers 401 before reading it
        jira = {"Content-Type": "application/json"}
        status, answer = _http(url + "webhooks/jira", nested(5000), jira)
        assert status == 400 and "deeper than" in answer["error"], answer
        assert slack(nested(5000))[0] == 400
        assert _http(url + "webhooks/mattermost", nested(5000), jira)[0] == 401
        status, answer = _http(url + "webhooks/mattermost", nested(5000), {**jira, "Authorization": f"Token {UP_MM_TOKEN}"})
        assert status == 400 and "deeper than" in answer["error"], answer
        # a body token that is a lone surrogate is a token that does not match: 401, never a 500
        status, answer = _http(url + "webhooks/mattermost", b'{"token":"\\ud800"}', jira)
        assert status == 401 and "does not match" in answer["error"], answer

        # 2. a deep ADF comment: 5,000 levels is refused, 200 levels runs ada's turn
        status, answer = _http(url + "webhooks/jira", jira_comment_json(deep_adf_json(5000)), jira)
        assert status == 400 and "deeper than" in answer["error"], answer
        status, answer = _http(url + "webhooks/jira", jira_comment_json(deep_adf_json(200)), jira)
        assert status == 202, answer
        types = _turn_completed(url, answer["trace_id"])
        assert "external_notification" in types and "agent_turn_started" in types

        # 5. the surface whose secret is unset says so
        status, answer = _http(url + "webhooks/github", b"{}", {**jira, "X-GitHub-Event": "issues"})
        assert status == 401 and "set GITHUB_WEBHOOK_SECRET (its webhook secret is not configured on this server)" in answer["error"]

        # a good signed DM still runs its turn
        status, answer = slack(dm())
        assert status == 202, answer
        _turn_completed(url, answer["trace_id"])

        assert up.terminate() == 0, up.stop()[-4000:]
        text = up.stop()
        assert "Traceback" not in text and "status=500" not in text, text[-6000:]
        assert UP_SLACK_SECRET not in text and UP_MM_TOKEN not in text and UP_TOKEN not in text


def test_a_token_holding_a_lone_surrogate_is_a_token_that_does_not_match_never_a_crash() -> None:
    from notifications.sources.base import same

    assert same("\ud800", "up-mattermost-token-4711") is False
    assert same("tok\ud800", "tok\ud800") is True
