"""A seat's own chat identity in the company file: ``seats[].slack`` and ``seats[].mattermost``.

In Slack every bot is an app of its own, with its own signing secret, bot
token and app-level token; in Mattermost every agent is a bot account with
its own token. So an agent seat may name its own::

    slack: {app_id: A0ADA, signing_secret_env: ADA_SLACK_SIGNING_SECRET,
            bot_token_env: ADA_SLACK_BOT_TOKEN, app_token_env: ADA_SLACK_APP_TOKEN}
    mattermost: {bot_token_env: ADA_MATTERMOST_BOT_TOKEN}

Every key but ``app_id`` names an environment variable and never holds the
value: a token or a signing secret written inline is refused without being
echoed. Refused too, each in one line naming the field: a person's seat with
one (a person acts as themselves), a missing or malformed ``app_id``, two
seats naming the same app, and two seats naming the same variable (each app
and each bot has credentials of its own).

:func:`seat_socket_kinds` is read before the surfaces are: a seat's own
socket token lets ``surfaces.<kind>`` leave the company-level one out.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional

from crewlet.base.redact import is_secret_name
from crewlet.company.fields import _ENV, CompanyError, _looks_secret, _mapping, _refuse_inline_secret, _string
from crewlet.company.org import (
    SEAT_MATTERMOST_KEYS,
    SEAT_SLACK_KEYS,
    SEAT_SOCKET_TOKEN_KEYS,
    MattermostBot,
    Seat,
    SlackApp,
)

#: A Slack app id as Slack's app settings show it (Basic Information → App ID): ``A`` then capitals and digits.
SLACK_APP_ID = re.compile(r"A[A-Z0-9]{1,31}")
SLACK_APP_ID_RULE = "must be a Slack app ID (Basic Information → App ID): 'A' then capital letters and digits"
#: A Slack signing secret's own shape (32 hex digits): what a variable name never looks like.
_SIGNING_SECRET_SHAPE = re.compile(r"[0-9a-f]{32}")
_ENV_RULE = "must be an environment variable name"


def _variable(body: Mapping[str, Any], key: str, where: str, source: Optional[str], required: bool = True) -> str:
    """The variable ``body[key]`` names: required unless said, never the secret itself."""
    name = f"{where}.{key}"
    value = body.get(key)
    if value is None and not required:
        return ""
    if value is None:
        raise CompanyError(name, None, f"is required: the environment variable holding it ({_ENV_RULE})", source)
    if isinstance(value, str) and (_looks_secret(value) or _SIGNING_SECRET_SHAPE.fullmatch(value.strip())):
        _refuse_inline_secret(name, "must name the environment variable holding the value, never the value", source)
    return _string(value, name, source, _ENV, _ENV_RULE)


def _known_keys(body: Mapping[str, Any], where: str, allowed: tuple[str, ...], source: Optional[str]) -> None:
    """Refuse an unknown key; one named like a credential is refused as an inline secret, unechoed."""
    for key in body:
        if key in allowed:
            continue
        if is_secret_name(str(key)):
            _refuse_inline_secret(
                f"{where}.{key}", f"is not allowed: name the variable holding it with one of {', '.join(allowed)}", source
            )
        raise CompanyError(f"{where}.{key}", body[key], f"unknown key; allowed: {', '.join(allowed)}", source)


def _agent_only(body: Mapping[str, Any], where: str, kind: str, source: Optional[str]) -> None:
    """Only an agent has a chat identity of its own (checked once its values are, so the refusal echoes names only)."""
    if kind != "agent":
        raise CompanyError(where, dict(body), "applies only to an agent seat (a person chats as themselves)", source)


def seat_slack(value: Any, where: str, kind: str, source: Optional[str]) -> Optional[SlackApp]:
    """``seats[].slack``: the seat's own Slack app, or None when it names none."""
    if value is None:
        return None
    body = _mapping(value, where, source)
    _known_keys(body, where, SEAT_SLACK_KEYS, source)
    app_id = body.get("app_id")
    if app_id is None:
        raise CompanyError(f"{where}.app_id", None, "is required: the app's ID (Basic Information → App ID)", source)
    app = SlackApp(
        app_id=_string(app_id, f"{where}.app_id", source, SLACK_APP_ID, SLACK_APP_ID_RULE),
        signing_secret_env=_variable(body, "signing_secret_env", where, source),
        bot_token_env=_variable(body, "bot_token_env", where, source),
        app_token_env=_variable(body, "app_token_env", where, source, required=False),
    )
    _agent_only(body, where, kind, source)
    return app


def seat_mattermost(value: Any, where: str, kind: str, source: Optional[str]) -> Optional[MattermostBot]:
    """``seats[].mattermost``: the seat's own Mattermost bot account, or None when it names none."""
    if value is None:
        return None
    body = _mapping(value, where, source)
    _known_keys(body, where, SEAT_MATTERMOST_KEYS, source)
    bot = MattermostBot(bot_token_env=_variable(body, "bot_token_env", where, source))
    _agent_only(body, where, kind, source)
    return bot


def check_seat_identities(seats: Iterable[Seat], source: Optional[str]) -> None:
    """Across seats: no Slack app twice, and no variable named by two seats' identities."""
    apps: dict[str, str] = {}
    variables: dict[str, str] = {}
    for seat in seats:
        where = f"seats.{seat.handle}"
        if seat.slack is not None:
            if seat.slack.app_id in apps:
                raise CompanyError(
                    f"{where}.slack.app_id", seat.slack.app_id, f"already belongs to seat {apps[seat.slack.app_id]}: one app per seat", source
                )
            apps[seat.slack.app_id] = seat.handle
        named = [(f"slack.{key}", getattr(seat.slack, key)) for key in SEAT_SLACK_KEYS[1:] if seat.slack is not None]
        named += [(f"mattermost.{key}", getattr(seat.mattermost, key)) for key in SEAT_MATTERMOST_KEYS if seat.mattermost is not None]
        for key, variable in named:
            if not variable:
                continue
            if variable in variables:
                raise CompanyError(
                    f"{where}.{key}", variable,
                    f"is already named by {variables[variable]}: each app and each bot has credentials of its own", source,
                )
            variables[variable] = f"seats.{seat.handle}.{key}"


def seat_socket_kinds(seats_raw: Any) -> frozenset[str]:
    """The surface kinds some seat names its own socket token for (read before the seats are validated).

    Lenient by design: a malformed seat is refused when the seats are read,
    so what this reads of it never decides anything on its own.
    """
    kinds: set[str] = set()
    for entry in seats_raw if isinstance(seats_raw, list) else ():
        for kind, key in SEAT_SOCKET_TOKEN_KEYS.items():
            body = entry.get(kind) if isinstance(entry, Mapping) else None
            if isinstance(body, Mapping) and body.get(key):
                kinds.add(kind)
    return frozenset(kinds)


__all__ = ["SLACK_APP_ID", "check_seat_identities", "seat_mattermost", "seat_slack", "seat_socket_kinds"]
