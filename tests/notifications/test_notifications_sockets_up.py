"""Both socket transports through one real ``manage.py up``: Slack Socket Mode and Mattermost's websocket wake seats that run turns.

``up`` dials the local vendor servers (:mod:`tests.surfaces_support`) the
company file names; what is asserted is read back as an operator reads it:
the start-up log, ``/readyz``, the dashboard's overview and ``/api/events``.
"""
from __future__ import annotations

import http.cookiejar
import re
import urllib.parse
import urllib.request
from typing import Any, Iterator

import pytest

from notifications_support import ADA_MM_ID, LINUS_MM_ID, slack_message
from surfaces_support import MATTERMOST_BOT_TOKEN, SLACK_APP_TOKEN, MattermostServer, SlackServer, mm_posted
from tests.up_support import UpProcess, up_env
from waiting_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "sockets-up-operator-token-0123456789abcdef"
STAFF, STAFF_PASSWORD = "operator", "sockets-up-staff-password-4711"


class Up:
    def __init__(self, process: UpProcess, slack: SlackServer, mattermost: MattermostServer) -> None:
        self.process, self.slack, self.mattermost = process, slack, mattermost

    def turns(self, seat: str) -> list[dict[str, Any]]:
        """Every completed turn of ``seat`` (newest first)."""
        return list(self.process.api(f"/api/events?type=agent_turn_completed&seat={seat}")["events"])

    def records(self, label: str) -> list[dict[str, Any]]:
        """The stored ``inbound_delivery`` rows filed under ``label`` (``webhook:message``, ``socket:posted``)."""
        return list(self.process.api(f"/api/events?type={label}")["events"])

    def readyz(self) -> dict[str, Any]:
        return self.process.readyz()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("sockets-up")
    with SlackServer() as slack, MattermostServer() as mattermost:
        company = tmp / "acme.yaml"
        company.write_text(f"""\
org: acme
providers: {{llm: [{{kind: echo}}]}}
surfaces:
  slack: {{mode: socket, app_token_env: SLACK_APP_TOKEN, api_url: "{slack.api_url}"}}
  mattermost: {{mode: socket, bot_token_env: MATTERMOST_BOT_TOKEN, server: "{mattermost.url}"}}
seats:
  - {{handle: ada, kind: agent, role: engineer, identities: {{slack: W111, mattermost: {ADA_MM_ID}}}}}
  - {{handle: linus, kind: agent, role: reviewer, identities: {{slack: U0LINUS, mattermost: {LINUS_MM_ID}}}}}
""")
        env = up_env(
            CREWLET_VAR_DIR=str(tmp / "data"), CREWLET_OPERATOR_TOKEN=TOKEN, SLACK_APP_TOKEN=SLACK_APP_TOKEN, MATTERMOST_BOT_TOKEN=MATTERMOST_BOT_TOKEN,
            CREWLET_SOCKET_RETRY_MIN_S="0.05", CREWLET_SOCKET_RETRY_MAX_S="0.5", CREWLET_SOCKET_PING_S="0.5",
        )
        with UpProcess(tmp, "--company", str(company), node="laptop", env=env) as process:
            yield Up(process, slack, mattermost)
            assert process.terminate() == 0, process.output()
            text = process.output()
            assert SLACK_APP_TOKEN not in text and MATTERMOST_BOT_TOKEN not in text and "ticket=" not in text


def test_up_says_each_surface_runs_over_its_socket_and_readyz_and_the_overview_show_both_connected(up: Up) -> None:
    up.process.wait_for("event=surface_mode surface=slack mode=socket", timeout_s=10)
    up.process.wait_for("event=surface_mode surface=mattermost mode=socket", timeout_s=10)
    assert "surface=github" not in up.process.output_so_far(), "a surface the company never names is not announced"
    components = wait_until(
        lambda: (c := up.readyz()).get("surface_socket:slack", {}).get("ok") and c.get("surface_socket:mattermost", {}).get("ok") and c,
        30, "both sockets connected on /readyz",
    )
    slack, mattermost = components["surface_socket:slack"], components["surface_socket:mattermost"]
    assert (slack["state"], slack["transport"], slack["last_error"]) == ("connected", "slack socket mode", "")
    assert mattermost["state"] == "connected" and mattermost["last_frame_at"]  # the hello

    up.process.manage("createsuperuser", "--noinput", "--username", STAFF, "--email", "op@example.com",
                      extra_env={"DJANGO_SUPERUSER_PASSWORD": STAFF_PASSWORD})
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = browser.open(up.process.url + "/login/", timeout=30).read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login)
    assert csrf is not None
    form = urllib.parse.urlencode({"username": STAFF, "password": STAFF_PASSWORD, "csrfmiddlewaretoken": csrf.group(1), "next": "/"})
    request = urllib.request.Request(up.process.url + "/login/", data=form.encode(), headers={"Referer": up.process.url + "/login/"})
    overview = browser.open(request, timeout=30).read().decode()
    assert 'id="connections"' in overview
    for name in ("surface_socket:slack", "surface_socket:mattermost"):
        row = re.search(rf'<tr data-connection="{name}">(.*?)</tr>', overview, re.S)
        assert row is not None and 'data-state="connected"' in row.group(1), name


def test_a_slack_mention_over_socket_mode_runs_one_turn_through_a_drop_and_a_redelivery(up: Up) -> None:
    wait_until(up.slack.connected, 30, "up's Slack socket open")
    first_payload = slack_message("<@W111> check the deploy", channel="C900", ts="1718000100.000100", event_id="EvUpSock1")
    first = up.slack.send("events_api", first_payload)
    wait_until(lambda: first in up.slack.acks, 30, "the first envelope acknowledged")
    wait_until(lambda: len(up.turns("ada")) == 1, 60, "ada's turn")

    opens = up.slack.opens
    up.slack.drop()
    second = up.slack.send("events_api", slack_message("<@W111> and the docs", channel="C901", ts="1718000200.000100", event_id="EvUpSock2"))
    wait_until(lambda: second in up.slack.acks, 60, "the envelope sent while the socket was down acknowledged")
    assert up.slack.opens > opens
    wait_until(lambda: len(up.turns("ada")) == 2, 60, "ada's second turn")
    up.slack.redeliver_acked(first, "events_api", first_payload)  # Slack's at-least-once: the first again
    wait_until(lambda: first in up.slack.acks, 30, "the redelivery acknowledged")
    # A later delivery's turn: the redelivery, on the broker before it, has been routed by then.
    third = up.slack.send("events_api", slack_message("<@W111> last one", channel="C902", ts="1718000300.000100", event_id="EvUpSock3"))
    wait_until(lambda: third in up.slack.acks, 30, "the third envelope acknowledged")
    wait_until(lambda: len(up.turns("ada")) >= 3, 60, "ada's third turn")
    assert len(up.turns("ada")) == 3
    assert len(up.records("webhook:message")) == 3  # the redelivery is the same row


def test_a_mattermost_mention_over_the_websocket_runs_one_turn_through_a_drop_and_a_repeated_post(up: Up) -> None:
    wait_until(up.mattermost.connected, 30, "up's Mattermost socket open")
    first = mm_posted("postupsock1", "@linus review please", channel="c-up-1", mentions=(LINUS_MM_ID,))
    up.mattermost.post(first)
    wait_until(lambda: len(up.turns("linus")) == 1, 60, "linus's turn")

    sessions = len(up.mattermost.sessions)
    up.mattermost.drop()
    missed = up.mattermost.post(mm_posted("postupsock2", "@linus and this one", channel="c-up-2", mentions=(LINUS_MM_ID,)))
    wait_until(lambda: len(up.mattermost.sessions) > sessions, 30, "a reconnect")
    assert up.mattermost.sessions[-1]["resumed"] and int(up.mattermost.sessions[-1]["query"]["sequence_number"]) == missed
    wait_until(lambda: len(up.turns("linus")) == 2, 60, "linus's turn for the post sent while the socket was down")
    up.mattermost.post(first)  # the first post again, under a new seq
    up.mattermost.post(mm_posted("postupsock3", "@linus last one", channel="c-up-3", mentions=(LINUS_MM_ID,)))
    wait_until(lambda: len(up.turns("linus")) >= 3, 60, "linus's third turn")
    assert len(up.turns("linus")) == 3
    assert len(up.records("socket:posted")) == 3
