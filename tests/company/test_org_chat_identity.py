"""A seat's own chat identity in the company file: ``seats[].slack`` and ``seats[].mattermost``, read and refused field by field."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from crewlet.company.org import MattermostBot, SlackApp
from crewlet.company.parse import parse_company
from company_support import one_line_refusal

ADA_APP = {"app_id": "A0ADA", "signing_secret_env": "ADA_SLACK_SIGNING_SECRET", "bot_token_env": "ADA_SLACK_BOT_TOKEN"}
LINUS_APP = {
    "app_id": "A0LINUS", "signing_secret_env": "LINUS_SLACK_SIGNING_SECRET", "bot_token_env": "LINUS_SLACK_BOT_TOKEN",
    "app_token_env": "LINUS_SLACK_APP_TOKEN",
}


def doc(**changes: Any) -> dict[str, Any]:
    """Two agent seats, each its own Slack app and Mattermost bot, and a person; ``changes`` replace top-level keys."""
    base: dict[str, Any] = {
        "org": "acme",
        "seats": [
            {"handle": "ada", "slack": dict(ADA_APP), "mattermost": {"bot_token_env": "ADA_MM_BOT_TOKEN"}},
            {"handle": "linus", "slack": dict(LINUS_APP), "mattermost": {"bot_token_env": "LINUS_MM_BOT_TOKEN"}},
            {"handle": "grace", "kind": "human"},
        ],
    }
    base.update(copy.deepcopy(changes))
    return base


def with_seat(i: int, **changes: Any) -> dict[str, Any]:
    d = doc()
    d["seats"][i].update(copy.deepcopy(changes))
    return d


def refusal(document: dict[str, Any]) -> str:
    return one_line_refusal(parse_company, document)


def test_each_agent_seat_is_read_with_its_own_slack_app_and_mattermost_bot_and_a_seat_naming_none_has_none() -> None:
    org = parse_company(doc())
    ada, linus, grace = org.seats
    assert ada.slack == SlackApp("A0ADA", "ADA_SLACK_SIGNING_SECRET", "ADA_SLACK_BOT_TOKEN", "")
    assert linus.slack is not None and linus.slack.app_token_env == "LINUS_SLACK_APP_TOKEN"
    assert ada.mattermost == MattermostBot("ADA_MM_BOT_TOKEN")
    assert grace.slack is None and grace.mattermost is None
    assert org.seat_by_slack_app("A0LINUS") is linus and org.seat_by_slack_app("A0NOBODY") is None
    assert ada.own_ids("slack") == ("A0ADA",) and ada.own_ids("github") == ()


@pytest.mark.parametrize(
    ("document", "field", "says"),
    [
        (with_seat(1, slack={**LINUS_APP, "app_id": "A0ADA"}), "seats.linus.slack.app_id='A0ADA'", "already belongs to seat ada"),
        (with_seat(0, slack={k: v for k, v in ADA_APP.items() if k != "app_id"}), "seats[0].slack.app_id=None", "is required"),
        (with_seat(0, slack={**ADA_APP, "app_id": "ada-app"}), "seats[0].slack.app_id='ada-app'", "must be a Slack app ID"),
        (with_seat(0, slack={k: v for k, v in ADA_APP.items() if k != "bot_token_env"}), "seats[0].slack.bot_token_env=None", "is required"),
        (with_seat(0, slack={**ADA_APP, "signing_secret_env": "NOT A NAME"}), "seats[0].slack.signing_secret_env=", "environment variable name"),
        (with_seat(0, slack={**ADA_APP, "team": "T1"}), "seats[0].slack.team='T1'", "unknown key; allowed: app_id, signing_secret_env"),
        (with_seat(0, mattermost={}), "seats[0].mattermost.bot_token_env=None", "is required"),
        (with_seat(0, mattermost={"bot_token_env": "ADA_MM_BOT_TOKEN", "server": "https://x"}), "seats[0].mattermost.server=", "unknown key"),
        (with_seat(0, slack="A0ADA"), "seats[0].slack='A0ADA'", "must be a mapping"),
        (with_seat(2, slack={**ADA_APP, "app_id": "A0GRACE", "signing_secret_env": "G_S", "bot_token_env": "G_B"}), "seats[2].slack=", "applies only to an agent seat"),
        (with_seat(2, mattermost={"bot_token_env": "GRACE_MM"}), "seats[2].mattermost=", "applies only to an agent seat"),
        (with_seat(1, slack={**LINUS_APP, "signing_secret_env": "ADA_SLACK_SIGNING_SECRET"}), "seats.linus.slack.signing_secret_env='ADA_SLACK_SIGNING_SECRET'", "already named by seats.ada.slack.signing_secret_env"),
        (with_seat(1, mattermost={"bot_token_env": "ADA_MM_BOT_TOKEN"}), "seats.linus.mattermost.bot_token_env='ADA_MM_BOT_TOKEN'", "already named by seats.ada.mattermost"),
    ],
    ids=[
        "two seats, one app", "no app_id", "a malformed app_id", "no bot token variable", "a variable that is no name",
        "an unknown key", "a bot with no token variable", "an unknown mattermost key", "not a mapping", "a person's app",
        "a person's bot", "one signing secret for two apps", "one bot token for two bots",
    ],
)
def test_a_seat_identity_the_engine_cannot_serve_is_refused_in_one_line_naming_the_field(document: dict[str, Any], field: str, says: str) -> None:
    text = refusal(document)
    assert field in text and says in text, text


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("signing_secret_env", "8f742231b10e8888abcd99aabbbb85a5"),  # a signing secret's own shape
        ("bot_token_env", "xoxb-1234-5678-abcdefghijkl"),
        ("app_token_env", "xapp-1-A0ADA-1234-abcdef"),
    ],
)
def test_a_secret_written_where_its_variable_is_named_is_refused_without_being_echoed(key: str, value: str) -> None:
    text = refusal(with_seat(0, slack={**ADA_APP, key: value}))
    assert f"seats[0].slack.{key}='[redacted]'" in text and "never the value" in text
    assert value not in text


def test_a_secret_under_a_key_of_its_own_is_refused_as_inline_without_being_echoed() -> None:
    text = refusal(with_seat(0, slack={**ADA_APP, "signing_secret": "8f742231b10e8888abcd99aabbbb85a5"}))
    assert "seats[0].slack.signing_secret='[redacted]'" in text and "8f742231" not in text
    text = refusal(with_seat(0, mattermost={"bot_token": "abcdefghijklmnopqrstuvwxyz"}))
    assert "seats[0].mattermost.bot_token='[redacted]'" in text and "abcdefghij" not in text


def test_a_human_seats_identity_with_an_inline_secret_is_refused_for_the_secret_first() -> None:
    text = refusal(with_seat(2, slack={**ADA_APP, "app_id": "A0GRACE", "bot_token_env": "xoxb-1-2-secretvalue"}))
    assert "seats[2].slack.bot_token_env='[redacted]'" in text and "secretvalue" not in text


def test_a_seats_app_token_lets_surfaces_slack_name_the_web_api_url_its_socket_dials_without_socket_mode() -> None:
    org = parse_company(doc(surfaces={"slack": {"api_url": "http://127.0.0.1:9/api/"}}))
    assert org.surfaces["slack"].server == "http://127.0.0.1:9/api" and org.surfaces["slack"].mode == "webhook"
    # with no seat's app token it is still the Web API the shipped chat tools call
    no_token = doc(surfaces={"slack": {"api_url": "http://127.0.0.1:9/api/"}})
    no_token["seats"][1]["slack"].pop("app_token_env")
    assert parse_company(no_token).surfaces["slack"].server == "http://127.0.0.1:9/api"
    # the socket's own token stays a socket-mode key
    app_token = doc(surfaces={"slack": {"app_token_env": "SLACK_APP_TOKEN"}})
    assert "surfaces.slack.app_token_env='SLACK_APP_TOKEN': is read only with mode: socket" in refusal(app_token)


def test_socket_mode_needs_no_company_level_token_when_the_seats_bring_their_own_and_still_does_without() -> None:
    org = parse_company(doc(surfaces={"mattermost": {"mode": "socket", "server": "https://chat.example.com"}}))
    assert org.surfaces["mattermost"].socket and org.surfaces["mattermost"].token_env == ""
    bots_gone = doc(surfaces={"mattermost": {"mode": "socket", "server": "https://chat.example.com"}})
    for seat in bots_gone["seats"]:
        seat.pop("mattermost", None)
    assert "surfaces.mattermost.bot_token_env=None: is required with mode: socket" in refusal(bots_gone)
    # a company-level token alongside the seats' own is read as before
    both = parse_company(doc(surfaces={"mattermost": {"mode": "socket", "server": "https://chat.example.com", "bot_token_env": "MM_BOT"}}))
    assert both.surfaces["mattermost"].token_env == "MM_BOT"
