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
from typing import Annotated, Any, Iterable, Mapping, Optional

from pydantic import model_validator

from crewlet.base.redact import is_secret_name
from crewlet.company.fields import _ENV, CompanyError
from crewlet.company.shape import FileModel, read_section, refuse_secret, required, secretless, text
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


_VARIABLE_REQUIRED = f"is required: the environment variable holding it ({_ENV_RULE})"
#: A variable a seat's identity names: never the secret itself (a token, a signing secret's 32 hex digits).
_Variable = Annotated[
    str,
    secretless("must name the environment variable holding the value, never the value", _SIGNING_SECRET_SHAPE),
    text(_ENV, _ENV_RULE),
]


class _IdentityFile(FileModel):
    """A seat's own chat identity: a key named like a credential is refused unechoed, before any other key is read."""

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, data: Any) -> Any:
        for key in data if isinstance(data, Mapping) else ():
            if key not in cls.model_fields and is_secret_name(str(key)):
                raise refuse_secret(f"is not allowed: name the variable holding it with one of {', '.join(cls.model_fields)}", str(key))
        return data


class SlackAppFile(_IdentityFile):
    """``seats[].slack``: the seat's own Slack app (:data:`~crewlet.company.org.SEAT_SLACK_KEYS`)."""

    app_id: Annotated[str, text(SLACK_APP_ID, SLACK_APP_ID_RULE)] = required("is required: the app's ID (Basic Information → App ID)")
    signing_secret_env: _Variable = required(_VARIABLE_REQUIRED)
    bot_token_env: _Variable = required(_VARIABLE_REQUIRED)
    app_token_env: Optional[_Variable] = None


class MattermostBotFile(_IdentityFile):
    """``seats[].mattermost``: the seat's own Mattermost bot account (:data:`~crewlet.company.org.SEAT_MATTERMOST_KEYS`)."""

    bot_token_env: _Variable = required(_VARIABLE_REQUIRED)


def _agent_only(body: Mapping[str, Any], where: str, kind: str, source: Optional[str]) -> None:
    """Only an agent has a chat identity of its own (checked once its values are, so the refusal echoes names only)."""
    if kind != "agent":
        raise CompanyError(where, dict(body), "applies only to an agent seat (a person chats as themselves)", source)


def seat_slack(value: Any, where: str, kind: str, source: Optional[str]) -> Optional[SlackApp]:
    """``seats[].slack``: the seat's own Slack app, or None when it names none."""
    if value is None:
        return None
    body = read_section(SlackAppFile, value, where, source)
    _agent_only(value, where, kind, source)
    return SlackApp(
        app_id=body.app_id, signing_secret_env=body.signing_secret_env, bot_token_env=body.bot_token_env,
        app_token_env=body.app_token_env or "",
    )


def seat_mattermost(value: Any, where: str, kind: str, source: Optional[str]) -> Optional[MattermostBot]:
    """``seats[].mattermost``: the seat's own Mattermost bot account, or None when it names none."""
    if value is None:
        return None
    body = read_section(MattermostBotFile, value, where, source)
    _agent_only(value, where, kind, source)
    return MattermostBot(bot_token_env=body.bot_token_env)


def _same_keys(model: type[FileModel], keys: tuple[str, ...]) -> None:
    """The model's keys are the ones :mod:`crewlet.company.org` names (its identities' fields), in the same order."""
    if tuple(model.model_fields) != keys:
        raise RuntimeError(f"{model.__name__} reads {', '.join(model.model_fields)}, org.py names {', '.join(keys)}")


_same_keys(SlackAppFile, SEAT_SLACK_KEYS)
_same_keys(MattermostBotFile, SEAT_MATTERMOST_KEYS)


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
