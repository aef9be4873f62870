"""Start-up's word on the seats' own chat identities (``seats[].slack``, ``seats[].mattermost``).

Each variable a seat's identity names and this process does not have is
said once at start (``seat_identity_variable_missing``), by its NAME and the
key naming it, never a value, with what will not work until it is set. Only
identities the company configures are checked: a company with none says
nothing here.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from crewlet.company.org import Organization

log = logging.getLogger("crewlet.notifications")


@dataclass(frozen=True)
class MissingVariable:
    """One variable a seat's identity names that is unset: whose, under which key, and what it costs."""

    seat: str
    key: str
    variable: str
    consequence: str


def missing_seat_variables(org: Organization, environ: Mapping[str, str]) -> list[MissingVariable]:
    """Each unset variable of each agent seat's own identity, in the company's order."""
    slack = org.surfaces.get("slack")
    mattermost = org.surfaces.get("mattermost")
    found: list[MissingVariable] = []
    for seat in org.agent_seats():
        named: list[tuple[str, str, str]] = []
        if seat.slack is not None:
            app = seat.slack
            if slack is None or slack.verify:
                named.append((
                    "slack.signing_secret_env", app.signing_secret_env,
                    f"every webhook delivery for the Slack app {app.app_id} is refused (401)",
                ))
            named.append(("slack.bot_token_env", app.bot_token_env, "the seat cannot act as its own Slack bot"))
            if app.app_token_env:
                named.append(("slack.app_token_env", app.app_token_env, f"the Socket Mode socket of the Slack app {app.app_id} cannot connect"))
        if seat.mattermost is not None:
            socket = mattermost is not None and mattermost.socket
            named.append((
                "mattermost.bot_token_env", seat.mattermost.bot_token_env,
                "the seat cannot act as its own Mattermost bot" + (", and the bot's socket cannot connect" if socket else ""),
            ))
        found += [
            MissingVariable(seat.handle, key, variable, consequence)
            for key, variable, consequence in named
            if not environ.get(variable, "")
        ]
    return found


def verified_by_seats(org: Organization, surface: str) -> bool:
    """Whether seats' own apps verify ``surface``'s deliveries (Slack), so a company naming no secret of its own lacks none."""
    return surface == "slack" and any(seat.slack is not None for seat in org.seats)


def warn_seat_identities(org: Organization, environ: Mapping[str, str]) -> list[MissingVariable]:
    """Say at start, once per variable and by its name, which of the seats' own identities cannot work yet."""
    missing = missing_seat_variables(org, environ)
    for item in missing:
        log.warning(
            "seat_identity_variable_missing",
            extra={
                "seat": item.seat, "key": f"seats.{item.seat}.{item.key}", "variable": item.variable,
                "hint": f"{item.consequence} until {item.variable} is set in this process's environment",
            },
        )
    return missing


__all__ = ["MissingVariable", "missing_seat_variables", "verified_by_seats", "warn_seat_identities"]
