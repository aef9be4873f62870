"""Form-encoded deliveries and the generic source through a real ``manage.py up``: accepted, answered as expected, a turn.

One ``up`` serves the whole module (SQLite, the embedded broker, the echo
model); each test reads the turn its delivery started from ``/api/events``.
"""
from __future__ import annotations

import json
from typing import Iterator

import pytest

from notifications.parsers import FORM_MEDIA
from notifications_support import SECRETS, fixture_bytes, hex_hmac, hub256_headers, slack_headers
from notifications_support import block_actions, github_form, interaction, slash
from tests.up_support import UpProcess, http_call, http_json, serve, turn_completed, up_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: The operator token the module reads /api/events with, and the two webhook secrets ``up`` is given.
TOKEN, SLACK_SECRET, GITHUB_SECRET = (f"up-surfaces-{what}-0123456789abcdef" for what in ("operator-token", "slack", "github"))

#: Slack and GitHub verified with their secrets; the three sources no test here sends to unverified, so up warns of no missing secret.
COMPANY = """\
org: acme
providers: {llm: [{kind: echo}]}
surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET}, github: {secret_env: GITHUB_WEBHOOK_SECRET},
           jira: {verify: false}, confluence: {verify: false}, mattermost: {verify: false}}
seats:
  - {handle: ada, kind: agent, role: engineer, identities: {slack: U0ADA, github: octocat}}
  - {handle: linus, kind: agent, role: reviewer, identities: {slack: U0LINUS, github: Codertocat}}
  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("surfaces")
    (tmp / "acme.yaml").write_text(COMPANY)
    env = {k: v for k, v in up_env().items() if k not in {e for e, _ in SECRETS.values()}}
    env.update(
        # Exactly the room two agent seats need (an inbox and a control mailbox each): the company fills the
        # agent stream's limit, and every turn below (the reviewer's is the last seat's) runs under it.
        CREWLET_STREAM_MAX_CONSUMERS="4",
        CREWLET_OPERATOR_TOKEN=TOKEN, CREWLET_VAR_DIR=str(tmp / "data"),
        SLACK_SIGNING_SECRET=SLACK_SECRET, GITHUB_WEBHOOK_SECRET=GITHUB_SECRET,
    )
    yield from serve(UpProcess(tmp, "--company", str(tmp / "acme.yaml"), node="surfaces1", env=env))


def post(up: UpProcess, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    return http_call("POST", f"{up.url}{path}", body, headers)


def turn_of(up: UpProcess, trace_id: str) -> list[str]:
    return turn_completed(up.url + "/", trace_id, TOKEN)


def test_up_takes_githubs_form_content_type_signed_over_the_raw_form_and_runs_the_reviewers_turn(up: UpProcess) -> None:
    body = github_form(fixture_bytes("github", "pull_request-opened.json"))
    headers = {
        "Content-Type": FORM_MEDIA, "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "up-form-1",
        **hub256_headers(body, GITHUB_SECRET),
    }
    status, _, raw = post(up, "/webhooks/github", body, headers)
    answer = json.loads(raw)
    assert status == 202 and answer["event"] == "pull_request", answer
    types = turn_of(up, answer["trace_id"])
    assert "external_notification" in types and "agent_turn_started" in types
    # signed over the JSON instead of the form GitHub sends: refused
    forged = {**headers, **hub256_headers(fixture_bytes("github", "pull_request-opened.json"), GITHUB_SECRET)}
    assert post(up, "/webhooks/github", body, forged)[0] == 401


def test_up_acknowledges_a_slash_command_at_once_then_runs_the_named_seats_turn(up: UpProcess) -> None:
    body = slash("@ada summarise the failing build", trigger="up.slash.1")
    status, headers, raw = post(up, "/webhooks/slack", body, {"Content-Type": FORM_MEDIA, **slack_headers(body, SLACK_SECRET)})
    assert status == 200 and json.loads(raw) == {"response_type": "ephemeral", "text": "Sent to ada."}
    types = turn_of(up, headers["X-Crewlet-Trace-Id"])
    assert "external_notification" in types and "webhook:slash_command" in types
    # the same command signed with another secret never reaches a seat
    stamp = slack_headers(body, SLACK_SECRET)["X-Slack-Request-Timestamp"]
    forged = {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": "v0=" + hex_hmac("wrong", f"v0:{stamp}:".encode() + body)}
    assert post(up, "/webhooks/slack", body, {"Content-Type": FORM_MEDIA, **forged})[0] == 401


def test_up_acknowledges_a_button_click_with_an_empty_200_and_runs_the_message_authors_turn(up: UpProcess) -> None:
    body = interaction(block_actions(author="U0LINUS", trigger="up.click.1"))
    status, headers, raw = post(up, "/webhooks/slack", body, {"Content-Type": FORM_MEDIA, **slack_headers(body, SLACK_SECRET)})
    assert status == 200 and raw == b""
    assert "agent_turn_started" in turn_of(up, headers["X-Crewlet-Trace-Id"])


def test_up_refuses_a_form_to_a_source_that_takes_only_json_with_415_naming_what_it_takes(up: UpProcess) -> None:
    status, _, raw = post(up, "/webhooks/jira", b"payload=%7B%7D", {"Content-Type": FORM_MEDIA})
    assert status == 415
    assert json.loads(raw)["error"] == f"content type '{FORM_MEDIA}' is not accepted: send application/json"


#: The source tokens the module minted, for the last test's look at the output.
MINTED: list[str] = []


def generic(up: UpProcess, seat: str, token: str, body: dict[str, str], key: str = "") -> tuple[int, dict[str, str], dict[str, str]]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}", **({"Idempotency-Key": key} if key else {})}
    status, answer_headers, raw = post(up, f"/webhooks/generic/{seat}", json.dumps(body).encode(), headers)
    return status, answer_headers, json.loads(raw)


def test_up_wakes_a_seat_from_the_generic_source_with_a_token_minted_by_the_command_and_a_replay_is_no_second_turn(
    up: UpProcess,
) -> None:
    out = up.manage("source_token", "ada")
    token = out.strip()
    MINTED.append(token)
    assert out == token + "\n" and token.startswith("crws_")  # the token alone, on its own line

    status, _, answer = generic(up, "ada", token, {"text": "the nightly build failed", "sender": "ci"}, key="up-gen-1")
    assert status == 202 and answer["delivery_id"] == "ada:up-gen-1", answer
    types = turn_of(up, answer["trace_id"])
    assert "webhook:message" in types and "external_notification" in types

    # the job retries with the same key: accepted, and routed as the duplicate it is
    status, _, replay = generic(up, "ada", token, {"text": "the nightly build failed", "sender": "ci"}, key="up-gen-1")
    assert status == 202 and replay["delivery_id"] == "ada:up-gen-1"
    up.wait_for("event=notification_duplicate_delivery source=generic delivery_id=ada:up-gen-1")
    # the replay's 202 names the first try's trace, which /api/traces/ answers; it woke nobody
    assert replay["trace_id"] == answer["trace_id"]
    status, traced = http_json("GET", f"{up.url}/api/traces/{replay['trace_id']}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and traced["trace_id"] == answer["trace_id"], traced
    assert turn_of(up, answer["trace_id"]).count("external_notification") == 1


def test_up_refuses_a_generic_post_on_another_seat_with_403_and_a_bad_or_revoked_token_with_401(up: UpProcess) -> None:
    token = up.manage("source_token", "linus").strip()
    MINTED.append(token)
    status, _, answer = generic(up, "ada", token, {"text": "hi"})
    assert status == 403 and "another seat's route, not ada's" in answer["error"]
    assert generic(up, "linus", "crws_made-up", {"text": "hi"})[0] == 401
    assert generic(up, "linus", token, {"text": "hi"})[0] == 202
    assert up.manage("source_token", "linus", "--revoke").strip() == "revoked the source token of seat linus"
    status, _, answer = generic(up, "linus", token, {"text": "hi"})
    assert status == 401 and answer["error"] == "the bearer token is no source token: unknown, or revoked"


def test_no_secret_of_the_module_is_in_ups_output(up: UpProcess) -> None:
    """Whatever the deliveries of the module did (in any order), nothing they were signed or authorized with was logged.

    The case makes one authorized delivery of its own first, so it asserts on a log that holds one however the
    module's cases were ordered.
    """
    token = up.manage("source_token", "ada", "--rotate").strip()  # ada may hold one from a case before
    MINTED.append(token)
    assert generic(up, "ada", token, {"text": "log nothing of me", "sender": "ci"})[0] == 202
    up.wait_for("event=webhook_accepted")
    up.manage("source_token", "ada", "--revoke")  # leaves ada as it found no token, for the cases after it
    text = up.output_so_far()
    for secret in (TOKEN, SLACK_SECRET, GITHUB_SECRET, *MINTED):
        assert secret not in text
