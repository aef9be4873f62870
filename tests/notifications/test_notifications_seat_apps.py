"""Seats that are Slack apps of their own, through the edge and the router: each delivery verified with its app's secret, routed to its app's seat.

The edge and the router share one memory-twin client (the edge publishes,
the test routes what it published, as the notify group would). What a real
``up`` does with the same company: test_notifications_seat_apps_up.py.
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, AsyncIterator, Mapping, Optional

import pytest

from crewlet.company.org import Organization
from crewlet.company.parse import parse_company_text
from crewlet.queue import topics
from notifications.edge import Edge, EdgeResponse
from notifications.parsers import FORM_MEDIA, JSON_MEDIA, WHY_DM, WHY_MENTION
from notifications.seat_identities import missing_seat_variables
from notifications.service import RouteResult
from notifications.sockets import company_sockets
from notifications.sockets.mattermost import MattermostSocket
from notifications.sources.base import InboundRequest
from notifications_support import slack_headers
from seat_apps_support import (
    ADA_APP, ADA_BOT, ADA_SECRET, COMPANY_APP, LINUS_APP, LINUS_BOT, LINUS_SECRET, SECRETS, body_of, bot_post, click_on, dm,
    env_of, mention, seat_apps_yaml, slash_to, url_verification,
)
from test_notifications_routing import STORE, Routed, only_wake, routing
from waiting_support import eventually

pytestmark = STORE


class Apps:
    """The edge (with ``environ`` as its process environment) and the router on one client."""

    def __init__(self, r: Routed, edge: Edge) -> None:
        self.r, self.edge = r, edge

    async def post(self, body: bytes, secret: Optional[str], *, content_type: str = JSON_MEDIA) -> EdgeResponse:
        headers = {"content-type": content_type}
        if secret is not None:
            headers.update({k.lower(): v for k, v in slack_headers(body, secret).items()})
        return await self.edge.receive(InboundRequest(source="slack", body=body, headers=headers, route="/webhooks/slack"))

    async def route_last(self) -> RouteResult:
        inbound = [ev for topic, ev in self.r.rec.seen if topic == topics.NOTIFICATIONS_INBOUND]
        assert inbound, "the edge published no delivery"
        return await self.r.router.route(inbound[-1])

    def published(self) -> int:
        return sum(1 for topic, _ in self.r.rec.seen if topic == topics.NOTIFICATIONS_INBOUND)


def org_of(text: str) -> Organization:
    return parse_company_text(text)


@contextlib.asynccontextmanager
async def apps(org: Optional[Organization] = None, environ: Optional[Mapping[str, str]] = None) -> AsyncIterator[Apps]:
    org = org or org_of(seat_apps_yaml())
    async with routing(org) as r:
        yield Apps(r, Edge(r.queue, r.holder, environ=env_of() if environ is None else environ))


# -- verification: each app's own secret ----------------------------------------------------


async def test_a_dm_to_each_app_is_verified_with_that_apps_secret_and_wakes_that_apps_seat() -> None:
    async with apps() as a:
        for app, bot, secret, seat, event in ((ADA_APP, ADA_BOT, ADA_SECRET, "ada", "EvAda1"), (LINUS_APP, LINUS_BOT, LINUS_SECRET, "linus", "EvLin1")):
            answer = await a.post(body_of(dm(app, bot, "can you look at the build?", event_id=event, channel=f"D{seat}")), secret)
            assert answer.status == 202, answer.body
            wake = only_wake(await a.route_last(), seat)
            assert wake.payload["why"] == WHY_DM and wake.payload["direct"] is True


async def test_a_delivery_signed_with_the_other_apps_secret_is_refused_401_naming_the_app_it_was_checked_against(caplog: pytest.LogCaptureFixture) -> None:
    body = body_of(dm(ADA_APP, ADA_BOT, "pretend to be ada's", event_id="EvForged"))
    caplog.set_level(logging.DEBUG)
    async with apps() as a:
        answer = await a.post(body, LINUS_SECRET)
        assert answer.status == 401 and a.published() == 0
        reason = (answer.body or {})["error"]
        assert reason == "X-Slack-Signature does not match the body (checked with the signing secret of the Slack app A0ADA of seat ada)"
        signature = slack_headers(body, LINUS_SECRET)["X-Slack-Signature"]
        logged = caplog.text
        assert "webhook_refused" in logged and signature[3:] not in logged
        assert all(value not in logged for value in SECRETS.values())


async def test_a_delivery_naming_an_app_the_company_does_not_have_is_refused_with_the_apps_it_has() -> None:
    async with apps() as a:
        answer = await a.post(body_of(dm("A0STRANGER", "U0X", "hello", event_id="EvStranger")), ADA_SECRET)
        assert answer.status == 401 and a.published() == 0
        assert (answer.body or {})["error"] == (
            "the Slack app A0STRANGER is none of this company's (seats[].slack.app_id: A0ADA, A0LINUS) "
            "and no company-level app is configured (surfaces.slack.signing_secret_env)"
        )


async def test_an_apps_secret_variable_unset_refuses_its_deliveries_naming_the_variable_and_the_key() -> None:
    async with apps(environ=env_of(without={"ADA_SLACK_SIGNING_SECRET"})) as a:
        answer = await a.post(body_of(dm(ADA_APP, ADA_BOT, "hi", event_id="EvUnset")), ADA_SECRET)
        assert answer.status == 401
        assert (answer.body or {})["error"].startswith(
            "the Slack app A0ADA of seat ada is not configured: set ADA_SLACK_SIGNING_SECRET (named by seats.ada.slack.signing_secret_env)"
        )
        assert (await a.post(body_of(dm(LINUS_APP, LINUS_BOT, "hi", event_id="EvSet")), LINUS_SECRET)).status == 202


async def test_a_url_verification_naming_no_app_is_answered_for_any_of_the_companys_apps_and_refused_for_a_stranger() -> None:
    async with apps() as a:
        for secret in (ADA_SECRET, LINUS_SECRET):
            answer = await a.post(url_verification("chal-1"), secret)
            assert (answer.status, answer.body) == (200, {"challenge": "chal-1"})
        refused = await a.post(url_verification("chal-2"), "nobody's secret")
        assert refused.status == 401 and "checked with the signing secret of each of the Slack app A0ADA" in (refused.body or {})["error"]


async def test_a_slash_command_and_a_click_name_their_app_in_the_form_and_are_verified_and_routed_by_it() -> None:
    async with apps() as a:
        command = slash_to(LINUS_APP, "review the open PR", command="/review", trigger="trig.1")
        assert (await a.post(command, ADA_SECRET, content_type=FORM_MEDIA)).status == 401
        answer = await a.post(command, LINUS_SECRET, content_type=FORM_MEDIA)
        assert (answer.status, answer.body) == (200, {"response_type": "ephemeral", "text": "Sent to linus."})
        only_wake(await a.route_last(), "linus")  # named by neither its text nor its name: the app's seat
        click = click_on(ADA_APP, ADA_BOT, trigger="trig.2")
        assert (await a.post(click, LINUS_SECRET, content_type=FORM_MEDIA)).status == 401
        assert (await a.post(click, ADA_SECRET, content_type=FORM_MEDIA)).status == 200
        only_wake(await a.route_last(), "ada")  # a click on ada's bot's message


async def test_verify_false_takes_every_apps_deliveries_unsigned_and_still_routes_them_by_app() -> None:
    async with apps(org_of(seat_apps_yaml(surfaces="{slack: {verify: false}}")), environ={}) as a:
        assert (await a.post(body_of(dm(LINUS_APP, LINUS_BOT, "hi", event_id="EvOpen")), None)).status == 202
        only_wake(await a.route_last(), "linus")


async def test_beside_the_seats_apps_the_company_level_app_verifies_what_names_no_seats_app_and_nothing_else() -> None:
    org = org_of(seat_apps_yaml(surfaces="{slack: {signing_secret_env: SLACK_SIGNING_SECRET}}"))
    company_secret = SECRETS["SLACK_SIGNING_SECRET"]
    async with apps(org) as a:
        assert (await a.post(body_of(dm(COMPANY_APP, "U0COBOT", "hi", event_id="EvCo")), company_secret)).status == 202
        assert (await a.post(body_of(dm(ADA_APP, ADA_BOT, "hi", event_id="EvCoAda")), company_secret)).status == 401
        assert (await a.post(url_verification(), company_secret)).status == 200


# -- routing: an app is its seat -------------------------------------------------------------


async def test_a_mention_of_an_apps_bot_delivered_to_that_app_wakes_its_seat_though_no_identity_names_the_bot() -> None:
    async with apps() as a:
        assert (await a.post(body_of(mention(LINUS_APP, LINUS_BOT, f"<@{LINUS_BOT}> please review", event_id="EvMen")), LINUS_SECRET)).status == 202
        wake = only_wake(await a.route_last(), "linus")
        assert wake.payload["why"] == WHY_MENTION


async def test_a_seats_own_bot_post_is_its_own_and_wakes_no_follower_of_the_thread() -> None:
    async with apps() as a:
        root = mention(LINUS_APP, LINUS_BOT, f"<@{LINUS_BOT}> thoughts?", event_id="EvRoot", channel="C0TH", ts="1718000100.000100")
        assert (await a.post(body_of(root), LINUS_SECRET)).status == 202
        only_wake(await a.route_last(), "linus")  # linus now follows the thread
        reply = bot_post(
            ADA_APP, ADA_BOT, LINUS_APP, LINUS_BOT, "I had a look too", event_id="EvBotReply", channel="C0TH",
            ts="1718000100.000200", thread_ts="1718000100.000100",
        )
        assert (await a.post(body_of(reply), LINUS_SECRET)).status == 202
        result = await a.route_last()
        assert result.woken == [] and result.skips == []  # another agent's post reaches a follower only by mention
        own = bot_post(
            LINUS_APP, LINUS_BOT, LINUS_APP, LINUS_BOT, "my own reply", event_id="EvOwn", channel="C0TH",
            ts="1718000100.000300", thread_ts="1718000100.000100",
        )
        assert (await a.post(body_of(own), LINUS_SECRET)).status == 202
        result = await a.route_last()
        assert result.woken == [] and result.skips == []


async def test_a_bot_post_in_its_own_dm_wakes_nobody() -> None:
    async with apps() as a:
        post = bot_post(ADA_APP, ADA_BOT, ADA_APP, ADA_BOT, "done", event_id="EvDmBot", channel="D0ADA", ts="1718000200.000100", channel_type="im")
        assert (await a.post(body_of(post), ADA_SECRET)).status == 202
        result = await a.route_last()
        assert result.woken == [] and result.skips == []


# -- what start-up reads of the seats' identities ---------------------------------------------------


def test_start_up_names_each_unset_variable_of_the_seats_identities_once_and_a_company_with_none_says_nothing() -> None:
    org = org_of(seat_apps_yaml(surfaces="{mattermost: {mode: socket, server: 'http://127.0.0.1:9'}}", app_tokens=True))
    missing = missing_seat_variables(org, env_of(without={"ADA_SLACK_SIGNING_SECRET", "LINUS_SLACK_APP_TOKEN", "ADA_MM_BOT_TOKEN"}))
    assert [(m.seat, m.key, m.variable) for m in missing] == [
        ("ada", "slack.signing_secret_env", "ADA_SLACK_SIGNING_SECRET"),
        ("ada", "mattermost.bot_token_env", "ADA_MM_BOT_TOKEN"),
        ("linus", "slack.app_token_env", "LINUS_SLACK_APP_TOKEN"),
    ]
    assert "socket cannot connect" in missing[1].consequence
    assert missing_seat_variables(org, env_of()) == []
    unverified = org_of(seat_apps_yaml(surfaces="{slack: {verify: false}}"))
    assert [m.variable for m in missing_seat_variables(unverified, {})] == [
        "ADA_SLACK_BOT_TOKEN", "ADA_MM_BOT_TOKEN", "LINUS_SLACK_BOT_TOKEN", "LINUS_MM_BOT_TOKEN",
    ]  # an unverified surface reads no signing secret
    assert missing_seat_variables(org_of("org: acme\nseats: [{handle: ada}]\n"), {}) == []


def test_each_app_token_and_with_socket_mode_each_bot_is_a_socket_and_a_duty_lease_of_its_own() -> None:
    specs = company_sockets(org_of(seat_apps_yaml(surfaces="{mattermost: {mode: socket, server: 'http://127.0.0.1:9'}}", app_tokens=True)))
    assert [(s.name, s.surface.token_env, s.named_by) for s in specs] == [
        ("surface_socket:slack:ada", "ADA_SLACK_APP_TOKEN", "seats.ada.slack.app_token_env"),
        ("surface_socket:mattermost:ada", "ADA_MM_BOT_TOKEN", "seats.ada.mattermost.bot_token_env"),
        ("surface_socket:slack:linus", "LINUS_SLACK_APP_TOKEN", "seats.linus.slack.app_token_env"),
        ("surface_socket:mattermost:linus", "LINUS_MM_BOT_TOKEN", "seats.linus.mattermost.bot_token_env"),
    ]
    assert all(s.surface.socket for s in specs)
    # webhook-mode Mattermost: the bots' tokens are for acting; no app token: no Slack socket
    assert company_sockets(org_of(seat_apps_yaml())) == []
    one_app: Any = company_sockets(org_of("org: acme\nsurfaces: {slack: {mode: socket, app_token_env: SLACK_APP_TOKEN}}\nseats: [{handle: ada}]\n"))
    assert [s.name for s in one_app] == ["surface_socket:slack"]


async def test_a_seats_bot_whose_seat_names_no_mattermost_identity_is_told_once_which_user_id_to_name(caplog: pytest.LogCaptureFixture) -> None:
    surfaces = "{mattermost: {mode: socket, server: 'http://127.0.0.1:9'}}"
    caplog.set_level(logging.WARNING, logger="crewlet.notifications.sockets.mattermost")

    def hello(connection: str) -> bytes:
        return json.dumps({
            "event": "hello", "seq": 0, "data": {"connection_id": connection},
            "broadcast": {"user_id": "8xadabotuserid0000000000aa", "channel_id": "", "team_id": ""},
        }).encode()

    for mattermost_ids, told in ((False, 1), (True, 0)):
        caplog.clear()
        org = org_of(seat_apps_yaml(surfaces=surfaces, mattermost_ids=mattermost_ids))
        spec = next(s for s in company_sockets(org) if s.name == "surface_socket:mattermost:ada")
        async with apps(org) as a:
            client = MattermostSocket(spec.surface, a.edge, environ=env_of(), seat=spec.seat, named_by=spec.named_by, identity=spec.identity)
            await client.frame(hello("conn1"))
            await client.frame(hello("conn2"))  # a new connection later: said once all the same
        lines = [r.getMessage() for r in caplog.records if r.getMessage() == "mattermost_bot_identity_unset"]
        assert len(lines) == told
        if told:
            record = next(r for r in caplog.records if r.getMessage() == "mattermost_bot_identity_unset")
            assert "set seats.ada.identities.mattermost: 8xadabotuserid0000000000aa" in record.__dict__["hint"]


@pytest.mark.integration
async def test_on_two_nodes_each_bots_socket_is_opened_once_under_a_duty_lease_of_its_own() -> None:
    from asgiref.sync import sync_to_async

    from crewlet.fleet.member import FleetMember
    from crewlet.models import DutyLease
    from notifications.sockets import SocketTimings
    from chat_servers_support import MattermostBots
    from notifications_support import ADA_MM_ID, LINUS_MM_ID

    fast = SocketTimings(retry_min_s=0.02, retry_max_s=0.1, ping_s=2.0, deliver_timeout_s=10.0, duty_check_s=0.05)
    tokens = {SECRETS["ADA_MM_BOT_TOKEN"]: ADA_MM_ID, SECRETS["LINUS_MM_BOT_TOKEN"]: LINUS_MM_ID}
    with MattermostBots(tokens) as server:
        org = org_of(seat_apps_yaml(surfaces=f"{{mattermost: {{mode: socket, server: '{server.url}'}}}}"))
        specs = [s for s in company_sockets(org) if s.surface.name == "mattermost"]
        nodes = [FleetMember("node-a", ttl_s=30.0), FleetMember("node-b", ttl_s=30.0)]
        async with apps(org) as a:
            clients = [
                MattermostSocket(s.surface, a.edge, environ=env_of(), timings=fast, hold_duty=n.hold_duty, seat=s.seat, identity=s.identity)
                for n in nodes for s in specs
            ]
            try:
                for client in clients:
                    await client.start()
                await eventually(lambda: server.bot_connected(ADA_MM_ID) and server.bot_connected(LINUS_MM_ID), what="both bots connected")
                await eventually(lambda: sum(c.status.standby for c in clients) == 2, what="one standby per bot")
                assert server.most_open == 2  # each bot's socket once, across both nodes
                holders = await sync_to_async(lambda: dict(DutyLease.objects.filter(name__startswith="surface_socket:mattermost").values_list("name", "holder")))()
                assert sorted(holders) == ["surface_socket:mattermost:ada", "surface_socket:mattermost:linus"]
            finally:
                for client in clients:
                    await client.stop()


def test_a_company_whose_seats_bring_their_own_apps_is_not_warned_of_a_missing_company_level_slack_secret() -> None:
    from notifications.runtime import unconfigured_surfaces

    seats_only = org_of(seat_apps_yaml(surfaces="{github: {verify: false}, jira: {verify: false}, confluence: {verify: false}, mattermost: {verify: false}}"))
    assert unconfigured_surfaces(seats_only, env_of()) == []
    named = org_of(seat_apps_yaml(surfaces="{slack: {signing_secret_env: SLACK_SIGNING_SECRET}}"))
    assert ("slack", "SLACK_SIGNING_SECRET") in unconfigured_surfaces(named, env_of(without={"SLACK_SIGNING_SECRET"}))
