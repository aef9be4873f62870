"""Two agent seats that are two Slack apps and two Mattermost bots, through one real ``manage.py up``.

ada and linus each have their own Slack app (their own signing secret, bot
token and app-level token) and their own Mattermost bot; the company keeps a
company-level Slack app beside them. Signed deliveries are POSTed to
``/webhooks/slack``; each app's Socket Mode socket and each bot's websocket
is dialled by ``up`` at the local vendor servers (:mod:`chat_servers_support`).
Which seat woke is read back from ``/api/events``, as an operator reads it.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from chat_servers_support import MattermostBots, SlackApps
from notifications.parsers import FORM_MEDIA
from notifications_support import ADA_MM_ID, LINUS_MM_ID, slack_headers
from seat_apps_support import (
    ADA_APP, ADA_BOT, ADA_SECRET, COMPANY_APP, LINUS_APP, LINUS_BOT, LINUS_SECRET, SECRETS, body_of, dm, env_of, seat_apps_yaml,
    slash_to,
)
from surfaces_support import mm_posted
from tests.up_support import UpProcess, http_call, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "seat-apps-up-operator-token-0123456789abcdef"
GRACE_MM_ID = "gracegracegracegracegrace1"
#: Left unset on purpose: start-up names it, and nothing else is affected.
UNSET = "LINUS_SLACK_BOT_TOKEN"


class Up:
    def __init__(self, process: UpProcess, slack: SlackApps, mattermost: MattermostBots) -> None:
        self.process, self.slack, self.mattermost = process, slack, mattermost

    def events(self, query: str) -> list[dict[str, Any]]:
        return list(self.process.api(f"/api/events?{query}")["events"])

    def post(self, body: bytes, secret: str, content_type: str = "application/json") -> tuple[int, dict[str, str], Any]:
        status, headers, raw = http_call(
            "POST", f"{self.process.url}/webhooks/slack", body, {"Content-Type": content_type, **slack_headers(body, secret)}
        )
        return status, headers, json.loads(raw) if raw else None

    def completed(self, query: str) -> list[dict[str, Any]]:
        """The rows ``query`` lists, once one of them is a completed turn."""
        def rows() -> list[dict[str, Any]]:
            found = self.events(query)
            return found if any(row["type"] == "agent_turn_completed" for row in found) else []

        return wait_until(rows, 60, f"a completed turn among {query}")

    def woken_in_trace(self, trace_id: str) -> set[str]:
        """The seats whose turns the delivery of ``trace_id`` ran, once one completed."""
        return {row["seat"] for row in self.completed(f"trace_id={trace_id}") if row["type"] == "agent_turn_started"}

    def woken_in(self, conversation: str) -> set[str]:
        """The seats whose turns worked a conversation, once one completed."""
        return {row["seat"] for row in self.completed(f"conversation_key={conversation}") if row["type"] == "agent_turn_started"}

    def readyz(self) -> dict[str, Any]:
        return self.process.readyz()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("seat-apps-up")
    slack_tokens = {SECRETS["ADA_SLACK_APP_TOKEN"]: ADA_APP, SECRETS["LINUS_SLACK_APP_TOKEN"]: LINUS_APP}
    mm_tokens = {SECRETS["ADA_MM_BOT_TOKEN"]: ADA_MM_ID, SECRETS["LINUS_MM_BOT_TOKEN"]: LINUS_MM_ID}
    with SlackApps(slack_tokens) as slack, MattermostBots(mm_tokens) as mattermost:
        surfaces = (
            f'{{slack: {{signing_secret_env: SLACK_SIGNING_SECRET, api_url: "{slack.api_url}"}}, '
            f'mattermost: {{mode: socket, server: "{mattermost.url}"}}}}'
        )
        (tmp / "acme.yaml").write_text(seat_apps_yaml(surfaces=surfaces, app_tokens=True))
        env = up_env(
            CREWLET_VAR_DIR=str(tmp / "data"), CREWLET_OPERATOR_TOKEN=TOKEN, **env_of(without={UNSET}),
            CREWLET_SOCKET_RETRY_MIN_S="0.05", CREWLET_SOCKET_RETRY_MAX_S="0.5", CREWLET_SOCKET_PING_S="0.5",
        )
        with UpProcess(tmp, "--company", str(tmp / "acme.yaml"), node="apps1", env=env) as process:
            yield Up(process, slack, mattermost)
            assert process.terminate() == 0, process.output()
            text = process.output()
            assert "Traceback" not in text, text[-6000:]
            assert all(value not in text for value in SECRETS.values())


def test_a_signed_dm_to_each_app_wakes_that_apps_own_seat(up: Up) -> None:
    for app, bot, secret, seat in ((ADA_APP, ADA_BOT, ADA_SECRET, "ada"), (LINUS_APP, LINUS_BOT, LINUS_SECRET, "linus")):
        status, _, answer = up.post(body_of(dm(app, bot, "how is the release going?", event_id=f"EvUpDm{seat}", channel=f"D0UP{seat}")), secret)
        assert status == 202, answer
        assert up.woken_in_trace(answer["trace_id"]) == {seat}


def test_a_delivery_signed_with_the_other_apps_secret_is_refused_401_and_reaches_nobody(up: Up) -> None:
    status, _, answer = up.post(body_of(dm(ADA_APP, ADA_BOT, "forged", event_id="EvUpForged", channel="D0FORGED")), LINUS_SECRET)
    assert status == 401
    assert answer == {"error": "X-Slack-Signature does not match the body (checked with the signing secret of the Slack app A0ADA of seat ada)"}
    status, _, answer = up.post(body_of(dm("A0STRANGER", "U0X", "hi", event_id="EvUpStranger", channel="D0STR")), SECRETS["SLACK_SIGNING_SECRET"])
    assert status == 202  # an app no seat has is the company-level app's, verified with its secret
    assert up.events("conversation_key=slack:D0FORGED") == []


def test_the_company_level_app_beside_the_seats_apps_still_takes_its_own_signed_slash_command(up: Up) -> None:
    body = slash_to(COMPANY_APP, "@linus look at the flaky test", trigger="up.company.1")
    status, headers, answer = up.post(body, SECRETS["SLACK_SIGNING_SECRET"], FORM_MEDIA)
    assert (status, answer) == (200, {"response_type": "ephemeral", "text": "Sent to linus."})
    assert up.woken_in_trace(headers["X-Crewlet-Trace-Id"]) == {"linus"}
    assert up.post(body, ADA_SECRET, FORM_MEDIA)[0] == 401


def test_each_app_has_its_own_socket_mode_connection_and_a_dm_over_it_wakes_its_seat(up: Up) -> None:
    def both_connected() -> dict[str, Any]:
        found = up.readyz()
        ok = all(found.get(f"surface_socket:slack:{seat}", {}).get("ok") for seat in ("ada", "linus"))
        return found if ok else {}

    components = wait_until(both_connected, 30, "both apps' sockets connected on /readyz")
    assert components["surface_socket:slack:ada"]["seat"] == "ada" and components["surface_socket:slack:ada"]["state"] == "connected"
    assert "surface_socket:slack" not in components  # the company-level app is a webhook one
    assert sorted(set(up.slack.opened)) == [ADA_APP, LINUS_APP] and up.slack.refused == []
    for app, bot, seat in ((ADA_APP, ADA_BOT, "ada"), (LINUS_APP, LINUS_BOT, "linus")):
        envelope = up.slack.send(app, "events_api", dm(app, bot, "over the socket", event_id=f"EvUpSock{seat}", channel=f"D0SOCK{seat}"))
        wait_until(lambda: up.slack.acks.get(envelope) == app, 30, f"{app}'s envelope acknowledged on its own socket")
        assert up.woken_in(f"slack:D0SOCK{seat}") == {seat}


def test_each_mattermost_bot_has_its_own_socket_and_a_dm_to_it_wakes_its_seat(up: Up) -> None:
    wait_until(lambda: up.mattermost.bot_connected(ADA_MM_ID) and up.mattermost.bot_connected(LINUS_MM_ID), 30, "both bots' sockets open")
    components = up.readyz()
    assert components["surface_socket:mattermost:ada"]["ok"] and components["surface_socket:mattermost:linus"]["ok"]
    assert "surface_socket:mattermost" not in components  # no company-level bot: the seats' own suffice
    for bot, seat in ((ADA_MM_ID, "ada"), (LINUS_MM_ID, "linus")):
        frame = mm_posted(f"postdm{seat}", "can you take this?", channel=f"dm-{seat}", user=GRACE_MM_ID, mentions=())
        frame["data"].update(channel_type="D", channel_name=f"{GRACE_MM_ID}__{bot}", channel_display_name="@grace")
        up.mattermost.post(bot, frame)
        assert up.woken_in(f"mattermost:dm-{seat}") == {seat}


def test_start_up_names_the_seat_identitys_unset_variable_and_never_a_value(up: Up) -> None:
    line = up.process.wait_for("event=seat_identity_variable_missing", timeout_s=10)
    assert f"variable={UNSET}" in line and "key=seats.linus.slack.bot_token_env" in line
    assert all(value not in up.process.output_so_far() for value in SECRETS.values())
    assert up.process.output_so_far().count("event=seat_identity_variable_missing") == 1
