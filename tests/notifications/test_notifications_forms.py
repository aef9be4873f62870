"""Form-encoded deliveries through the edge and the router: GitHub's form content type, Slack's slash commands and interactivity."""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any, AsyncIterator, Optional
from urllib.parse import quote

import pytest

from crewlet.queue import topics
from notifications.parsers import FORM_MEDIA, WHY_ADDRESSED, WHY_MENTION, DeliveryMeta
from notifications.sources import PARSERS
from notifications.service import RouteResult
from notifications_support import company, fixture_bytes, fixture_files, github_event_of, hub256_headers, need
from notifications_support import raw_delivery, set_secrets, slack_headers
from notifications_support import block_actions, github_form, interaction, slash
from test_notifications_edge import edge_here, post
from test_notifications_routing import STORE, Routed, only_wake, routing

pytestmark = STORE


@contextlib.asynccontextmanager
async def edge_and_router() -> AsyncIterator[Routed]:
    """The edge (every surface verified, the secrets set) and the router, on one memory-twin client."""
    org = company(verify=True)
    async with routing(org) as r:
        with edge_here(r.queue, org):
            yield r


async def route_last(r: Routed) -> RouteResult:
    """Route the delivery the edge published last, as the notify group would."""
    inbound = [ev for topic, ev in r.rec.seen if topic == topics.NOTIFICATIONS_INBOUND]
    assert inbound, "the edge published no delivery"
    return await r.router.route(inbound[-1])


def inbound_count(r: Routed) -> int:
    return sum(1 for topic, _ in r.rec.seen if topic == topics.NOTIFICATIONS_INBOUND)


async def post_github_form(body: bytes, event: str, delivery: str, *, signed_over: Optional[bytes] = None) -> Any:
    headers = {**hub256_headers(body if signed_over is None else signed_over), "X-GitHub-Event": event, "X-GitHub-Delivery": delivery}
    return await post("/webhooks/github", body, content_type=FORM_MEDIA, headers=headers)


async def post_slack_form(body: bytes, **headers: str) -> Any:
    return await post("/webhooks/slack", body, content_type=FORM_MEDIA, headers={**slack_headers(body), **headers})


# -- GitHub's form content type -----------------------------------------------------------


def _github_fixture_params() -> list[Any]:
    files = [p for p in fixture_files() if p.parent.name == "github"]
    return [pytest.param(p, id=p.name) for p in files] or [pytest.param(None, id="fixtures-missing")]


@pytest.mark.parametrize("path", _github_fixture_params())
async def test_every_github_fixture_in_the_form_content_type_is_accepted_and_parsed_as_its_json_twin(path: Any, monkeypatch) -> None:
    set_secrets(monkeypatch)
    fixture_path = need(path)
    json_body = fixture_path.read_bytes()
    event = github_event_of(fixture_path.name)
    async with edge_and_router() as r:
        body = github_form(json_body)
        resp = await post_github_form(body, event, f"gh-form-{fixture_path.stem}")
        assert resp.status_code == 202, resp.json()
        raw = [ev for topic, ev in r.rec.seen if topic == topics.NOTIFICATIONS_INBOUND][-1].data
        # The provider's exact bytes are kept, with the content type they are read by.
        assert raw.raw_bytes() == body and raw.content_type == FORM_MEDIA and raw.event_name == event
        form_result = await route_last(r)
    twin = PARSERS["github"](json.loads(json_body), DeliveryMeta(event_name=event, delivery_id=f"gh-form-{fixture_path.stem}"))
    assert form_result.parsed == twin


async def test_a_github_form_signed_over_the_json_rather_than_the_form_body_is_refused(monkeypatch) -> None:
    set_secrets(monkeypatch)
    json_body = fixture_bytes("github", "pull_request-opened.json")
    async with edge_and_router() as r:
        resp = await post_github_form(github_form(json_body), "pull_request", "gh-1", signed_over=json_body)
        assert resp.status_code == 401 and resp.json()["error"] == "X-Hub-Signature-256 does not match the body"
        assert inbound_count(r) == 0


async def test_a_github_form_delivery_wakes_the_requested_reviewer_once_though_github_retries_it(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = github_form(fixture_bytes("github", "pull_request-opened.json"))
    async with edge_and_router() as r:
        assert (await post_github_form(body, "pull_request", "gh-retry")).status_code == 202
        wake = only_wake(await route_last(r), "ada")
        assert wake.payload["partition_key"] == "github:Codertocat/Hello-World#2" and wake.payload["delivery_id"] == "gh-retry"
        assert (await post_github_form(body, "pull_request", "gh-retry")).status_code == 202
        retry = await route_last(r)
        assert retry.duplicate and retry.woken == []


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"payload=%7B%7D&payload=%7B%7D", "malformed form body: the form must carry exactly one payload= field, not 2"),
        (b"action=opened", "malformed form body: the form must carry exactly one payload= field, not 0"),
        (b"payload=%5B1%5D", "malformed form body: the payload= field must hold a JSON object, not a list"),
        (b"payload=%FF%FE", "malformed form body: a form field is not UTF-8 (invalid start byte)"),
        (b"payload", "malformed form body: bad query field: 'payload'"),
        (b"payload=%7B%22a%22%3A", "malformed JSON: Expecting value: line 1 column 6 (char 5)"),
        (
            b"payload=" + quote(json.dumps({"repository": {"full_name": "a\u0000b"}})).encode(),
            "repository.full_name contains a NUL character (\\u0000), which the database cannot store;"
            " nothing downstream can store it, so the delivery is refused",
        ),
    ],
    ids=["repeated", "missing", "list", "not-utf8", "no-equals", "bad-json", "nul"],
)
async def test_a_malformed_github_form_is_400_with_the_reason_and_nothing_is_published(body: bytes, reason: str, monkeypatch) -> None:
    set_secrets(monkeypatch)
    async with edge_and_router() as r:
        resp = await post_github_form(body, "issues", "gh-bad")
        assert (resp.status_code, resp.json()["error"]) == (400, reason)
        assert inbound_count(r) == 0


# -- Slack slash commands -----------------------------------------------------------------


@pytest.mark.parametrize(
    "command, text, seat, why, ask",
    [
        ("/ask", "@ada please review the build", "ada", WHY_ADDRESSED, "please review the build"),
        ("/ask", "<@W111|ada> please review the build", "ada", WHY_MENTION, "please review the build"),
        ("/linus", "look at PR 7", "linus", WHY_ADDRESSED, "look at PR 7"),
        ("/ask", "@Linus look at PR 7", "linus", WHY_ADDRESSED, "look at PR 7"),
    ],
    ids=["at-handle", "escaped-mention", "named-command", "handle-any-case"],
)
async def test_a_slash_command_is_acknowledged_at_once_and_wakes_the_seat_it_names(
    command: str, text: str, seat: str, why: str, ask: str, monkeypatch
) -> None:
    set_secrets(monkeypatch)
    async with edge_and_router() as r:
        resp = await post_slack_form(slash(text, command=command, trigger="13345224609.738474920.8088930838d88f008e0"))
        assert resp.status_code == 200 and resp["Content-Type"] == "application/json"
        assert resp.json() == {"response_type": "ephemeral", "text": f"Sent to {seat}."}
        assert resp["X-Crewlet-Trace-Id"]
        raw = [ev for topic, ev in r.rec.seen if topic == topics.NOTIFICATIONS_INBOUND][-1]
        assert raw.data.event_name == "slash_command" and raw.data.delivery_id == "13345224609.738474920.8088930838d88f008e0"
        wake = only_wake(await route_last(r), seat)
        assert wake.payload["body"] == ask and wake.payload["why"] == why and wake.payload["direct"] is True
        assert wake.payload["sender_id"] == "U0GRACE" and wake.data.title == f"Slack {command} in <#C777>"
        assert wake.trace_id == raw.trace_id == resp["X-Crewlet-Trace-Id"]


async def test_a_slash_command_retried_with_the_same_trigger_id_wakes_the_seat_once(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = slash("@ada once only", trigger="1.2.same")
    async with edge_and_router() as r:
        assert (await post_slack_form(body)).status_code == 200
        only_wake(await route_last(r), "ada")
        assert (await post_slack_form(body)).status_code == 200
        again = await route_last(r)
        assert again.duplicate and again.woken == []


async def test_a_slash_command_in_a_dm_joins_the_dms_conversation(monkeypatch) -> None:
    set_secrets(monkeypatch)
    async with edge_and_router() as r:
        assert (await post_slack_form(slash("@ada hi", channel="D0ADA", channel_name="directmessage"))).status_code == 200
        wake = only_wake(await route_last(r), "ada")
        assert wake.payload["partition_key"] == wake.payload["conversation_identity"] == "slack:D0ADA"


@pytest.mark.parametrize(
    "command, text, answer, reason, recipient",
    [
        ("/ask", "ada do it", "No seat is ask: name one first, as in `/ask @<seat> <what you need>`.", "no seat matches this recipient", "ask"),
        ("/ask", "@nobody hi", "No seat is nobody: name one first, as in `/ask @<seat> <what you need>`.", "no seat matches this recipient", "nobody"),
        ("/ask", "@grace hi", "grace is a person, not an agent seat: nothing was sent.", "human seat", "grace"),
    ],
    ids=["bare-word-is-no-address", "unknown-handle", "human"],
)
async def test_a_slash_command_naming_no_agent_says_so_at_once_and_is_recorded_as_a_skip(
    command: str, text: str, answer: str, reason: str, recipient: str, monkeypatch
) -> None:
    set_secrets(monkeypatch)
    async with edge_and_router() as r:
        resp = await post_slack_form(slash(text, command=command, user="U0ALAN"))  # somebody with no seat
        assert resp.status_code == 200 and resp.json() == {"response_type": "ephemeral", "text": answer}
        result = await route_last(r)
        assert result.woken == [] and result.reasons == [reason]
        assert r.skips()[-1].data.recipient == recipient and r.skips()[-1].data.event_name == "slash_command"


async def test_an_unsigned_or_stale_slash_command_is_refused_and_never_acknowledged(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = slash("@ada hi")
    async with edge_and_router() as r:
        unsigned = await post("/webhooks/slack", body, content_type=FORM_MEDIA)
        assert unsigned.status_code == 401 and "missing X-Slack-Signature" in unsigned.json()["error"]
        stale = await post("/webhooks/slack", body, content_type=FORM_MEDIA, headers=slack_headers(body, at=time.time() - 600))
        assert stale.status_code == 401 and "stale request" in stale.json()["error"]
        wrong = await post("/webhooks/slack", body, content_type=FORM_MEDIA, headers=slack_headers(body, "not-the-secret"))
        assert wrong.status_code == 401 and wrong.json()["error"] == "X-Slack-Signature does not match the body"
        assert inbound_count(r) == 0


@pytest.mark.parametrize(
    "body, reason",
    [
        (slash("@ada hi", trigger="x", user_id=""), "the slash command has no user_id"),
        (b"team_id=T111&text=hi", "malformed form body: a Slack form is a slash command (command=...) or an interaction (payload=...), and this is neither"),
        (b"command=%2Fask&command=%2Fada&trigger_id=1&user_id=U1", "malformed form body: the field command= is repeated"),
        (slash("@ada hi").replace(b"text=", b"text=%00"), "text contains a NUL character (\\u0000), which the database cannot store;"
         " nothing downstream can store it, so the delivery is refused"),
    ],
    ids=["no-user", "neither", "repeated", "nul"],
)
async def test_a_slack_form_that_cannot_be_routed_is_400_with_the_reason(body: bytes, reason: str, monkeypatch) -> None:
    set_secrets(monkeypatch)
    async with edge_and_router() as r:
        resp = await post_slack_form(body)
        assert (resp.status_code, resp.json()["error"]) == (400, reason)
        assert inbound_count(r) == 0


# -- Slack interactivity ------------------------------------------------------------------


async def test_a_button_on_a_seats_message_is_acknowledged_empty_and_wakes_that_seat_in_its_thread(monkeypatch) -> None:
    set_secrets(monkeypatch)
    async with edge_and_router() as r:
        resp = await post_slack_form(interaction(block_actions(thread_ts="1717999999.000001")))
        assert resp.status_code == 200 and resp.content == b""
        wake = only_wake(await route_last(r), "ada")
        assert wake.data.event_name == "block_actions" and wake.data.delivery_id == "111.222.valid"
        assert wake.payload["body"] == "grace chose Deploy (yes) on your message:\n> Deploy the fix?"
        assert wake.payload["why"] == WHY_ADDRESSED and wake.payload["sender_id"] == "U0GRACE"
        assert wake.payload["conversation_identity"] == "slack:C777:1717999999.000001"
        # Slack's retry of the same click (the same trigger_id) is no second wake.
        assert (await post_slack_form(interaction(block_actions(thread_ts="1717999999.000001")))).status_code == 200
        assert (await route_last(r)).duplicate


async def test_an_interaction_that_concerns_no_seat_is_acknowledged_and_filtered_not_recorded(monkeypatch) -> None:
    set_secrets(monkeypatch)
    submission = {"type": "view_submission", "user": {"id": "U0GRACE"}, "trigger_id": "9.9.view", "view": {"id": "V1", "state": {}}}
    async with edge_and_router() as r:
        resp = await post_slack_form(interaction(submission))
        assert resp.status_code == 200 and resp.content == b""
        result = await route_last(r)
        assert result.woken == [] and result.skips == [] and result.filtered == ["unhandled event view_submission"]
        click_on_a_stranger = await post_slack_form(interaction(block_actions(author="U0STRANGER", trigger="7.7.x")))
        assert click_on_a_stranger.status_code == 200
        assert (await route_last(r)).reasons == ["no seat matches this recipient"]


async def test_an_events_api_delivery_to_the_same_route_is_still_answered_202(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = fixture_bytes("slack", "event_callback-app_mention.json")
    async with edge_and_router() as r:
        resp = await post("/webhooks/slack", body, headers=slack_headers(body))
        assert resp.status_code == 202 and resp.json()["accepted"] is True
        only_wake(await route_last(r), "ada")


async def test_a_form_delivery_replayed_from_its_record_routes_the_same(monkeypatch) -> None:
    """The router decodes by the kept content type, so a dead letter replayed later routes as it did."""
    set_secrets(monkeypatch)
    async with routing(company(verify=True)) as r:
        replay = raw_delivery("slack", slash("@ada again", trigger="5.5.replay"))
        replay.data.content_type = FORM_MEDIA
        only_wake(await r.router.route(replay), "ada")
        garbled = raw_delivery("slack", b"command=%2Fask&command=%2Fada", delivery_id="5.5.bad")
        garbled.data.content_type = FORM_MEDIA
        result = await r.router.route(garbled)
        assert result.reasons == ["unreadable delivery payload"]
        assert r.skips()[-1].data.detail == "not a form: the field command= is repeated"
