"""A company whose two agent seats are two Slack apps and two Mattermost bots, and the deliveries Slack sends each app.

ada and linus name no Slack identity: each is known on Slack only as its own
app (``seats[].slack.app_id``), which is what a delivery to it names
(``api_app_id``) and what its bot's posts carry (``bot_profile.app_id``).
Their bot users (:data:`ADA_BOT`, :data:`LINUS_BOT`) are what Slack puts in
a delivery's ``authorizations``.
"""
from __future__ import annotations

import json
from typing import Any, Optional
from urllib.parse import urlencode

from notifications_support import ADA_MM_ID, LINUS_MM_ID

ADA_APP, LINUS_APP, COMPANY_APP = "A0ADA", "A0LINUS", "A0COMPANY"
ADA_BOT, LINUS_BOT = "U0ADABOT", "U0LINUSBOT"
#: Each app's signing secret, bot token and app-level token, by the variable the company file names.
SECRETS = {
    "ADA_SLACK_SIGNING_SECRET": "ada-app-signing-secret-5f1e0c",
    "LINUS_SLACK_SIGNING_SECRET": "linus-app-signing-secret-9a2b7d",
    "ADA_SLACK_BOT_TOKEN": "xoxb-ada-bot-token-for-tests",
    "LINUS_SLACK_BOT_TOKEN": "xoxb-linus-bot-token-for-tests",
    "ADA_SLACK_APP_TOKEN": "xapp-1-A0ADA-app-token-for-tests",
    "LINUS_SLACK_APP_TOKEN": "xapp-1-A0LINUS-app-token-for-tests",
    "ADA_MM_BOT_TOKEN": "mm-ada-bot-token-for-tests",
    "LINUS_MM_BOT_TOKEN": "mm-linus-bot-token-for-tests",
    "SLACK_SIGNING_SECRET": "company-app-signing-secret-3c4d",
}
ADA_SECRET, LINUS_SECRET = SECRETS["ADA_SLACK_SIGNING_SECRET"], SECRETS["LINUS_SLACK_SIGNING_SECRET"]


def seat_apps_yaml(*, surfaces: str = "", app_tokens: bool = False, mattermost_ids: bool = True) -> str:
    """The company file: ada and linus each their own Slack app and Mattermost bot, grace a person.

    ``surfaces`` is the ``surfaces:`` mapping's flow text; ``app_tokens``
    gives each app its Socket Mode token; ``mattermost_ids`` names each
    bot's user id as the seat's Mattermost identity.
    """
    app_token = ", app_token_env: {}_SLACK_APP_TOKEN" if app_tokens else ""
    ids = {"ada": f", identities: {{mattermost: {ADA_MM_ID}}}", "linus": f", identities: {{mattermost: {LINUS_MM_ID}}}"}
    seats = []
    for handle, role, app in (("ada", "engineer", ADA_APP), ("linus", "reviewer", LINUS_APP)):
        upper = handle.upper()
        seats.append(
            f"  - {{handle: {handle}, kind: agent, role: {role}{ids[handle] if mattermost_ids else ''},\n"
            f"     slack: {{app_id: {app}, signing_secret_env: {upper}_SLACK_SIGNING_SECRET, bot_token_env: {upper}_SLACK_BOT_TOKEN"
            f"{app_token.format(upper)}}},\n"
            f"     mattermost: {{bot_token_env: {upper}_MM_BOT_TOKEN}}}}"
        )
    return (
        "org: acme\nproviders: {llm: [{kind: echo}]}\n"
        + (f"surfaces: {surfaces}\n" if surfaces else "")
        + "seats:\n" + "\n".join(seats) + "\n  - {handle: grace, kind: human, role: lead, identities: {slack: U0GRACE}}\n"
    )


def dm(app: str, bot: str, text: str, *, event_id: str, channel: str = "D0DM", ts: str = "1718000000.000100", user: str = "U0GRACE") -> dict[str, Any]:
    """A person's top-level DM to ``app``'s bot, as Slack delivers it to that app (``message.im``)."""
    return {
        "token": "verification_token", "team_id": "T111", "api_app_id": app,
        "event": {"type": "message", "user": user, "text": text, "ts": ts, "channel": channel, "event_ts": ts, "channel_type": "im"},
        "type": "event_callback", "event_id": event_id, "event_time": int(float(ts)),
        "authorizations": [{"team_id": "T111", "user_id": bot, "is_bot": True, "is_enterprise_install": False}],
    }


def mention(app: str, bot: str, text: str, *, event_id: str, channel: str = "C0TEAM", ts: str = "1718000000.000200") -> dict[str, Any]:
    """A person's ``app_mention`` of ``app``'s bot in a channel, as Slack delivers it to that app."""
    return {
        "token": "verification_token", "team_id": "T111", "api_app_id": app,
        "event": {"type": "app_mention", "user": "U0GRACE", "text": text, "ts": ts, "channel": channel, "event_ts": ts},
        "type": "event_callback", "event_id": event_id, "event_time": int(float(ts)),
        "authorizations": [{"team_id": "T111", "user_id": bot, "is_bot": True, "is_enterprise_install": False}],
    }


def bot_post(
    poster_app: str, poster_bot: str, to_app: str, to_bot: str, text: str, *, event_id: str, channel: str, ts: str,
    thread_ts: str = "", channel_type: str = "channel",
) -> dict[str, Any]:
    """A post by ``poster_app``'s bot, as Slack delivers it to ``to_app`` (a channel member): it names its app."""
    event: dict[str, Any] = {
        "type": "message", "user": poster_bot, "bot_id": f"B{poster_app[1:]}", "app_id": poster_app, "text": text, "ts": ts,
        "channel": channel, "event_ts": ts, "channel_type": channel_type,
        "bot_profile": {"id": f"B{poster_app[1:]}", "app_id": poster_app, "name": poster_app.lower(), "team_id": "T111"},
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return {
        "token": "verification_token", "team_id": "T111", "api_app_id": to_app, "event": event,
        "type": "event_callback", "event_id": event_id, "event_time": int(float(ts)),
        "authorizations": [{"team_id": "T111", "user_id": to_bot, "is_bot": True}],
    }


def slash_to(app: str, text: str, *, command: str = "/ask", trigger: str) -> bytes:
    """A slash command registered on ``app``, as its form body (``api_app_id`` is one of its fields)."""
    return urlencode({
        "token": "verification_token", "team_id": "T111", "channel_id": "C0TEAM", "channel_name": "team", "user_id": "U0GRACE",
        "user_name": "grace", "command": command, "text": text, "api_app_id": app, "trigger_id": trigger,
        "response_url": "https://hooks.slack.com/commands/T111/1/x",
    }).encode("ascii")


def click_on(app: str, bot: str, *, trigger: str) -> bytes:
    """A button click on a message ``app``'s bot posted, as its interaction form body (``payload=`` JSON naming the app)."""
    payload = {
        "type": "block_actions", "api_app_id": app, "trigger_id": trigger, "token": "verification_token",
        "user": {"id": "U0GRACE", "username": "grace", "name": "grace", "team_id": "T111"},
        "container": {"type": "message", "message_ts": "1718000000.000300", "channel_id": "C0TEAM"},
        "channel": {"id": "C0TEAM", "name": "team"},
        "message": {"type": "message", "user": bot, "bot_id": f"B{app[1:]}", "app_id": app, "ts": "1718000000.000300", "text": "Ship it?"},
        "actions": [{"action_id": "ship", "block_id": "b", "text": {"type": "plain_text", "text": "Ship"}, "value": "yes", "type": "button"}],
    }
    return urlencode({"payload": json.dumps(payload)}).encode("ascii")


def url_verification(challenge: str = "seat-app-challenge") -> bytes:
    """The handshake Slack sends when an app's Request URL is set: it names no app."""
    return json.dumps({"token": "verification_token", "challenge": challenge, "type": "url_verification"}).encode()


def body_of(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def env_of(*names: str, without: Optional[set[str]] = None) -> dict[str, str]:
    """The secrets named (all of them when none are), less ``without``."""
    chosen = names or tuple(SECRETS)
    return {name: SECRETS[name] for name in chosen if name not in (without or set())}
