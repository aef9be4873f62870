"""The MCP servers the engine ships for a surface: ``mcp_servers: {<name>: {builtin: <kind>}}``.

``<kind>`` is ``slack``, ``mattermost``, ``github``, ``jira`` or
``confluence``. A company grants a seat its surface tools like any other MCP
server's; the ``builtin`` form only spares it the command line. Such a server
is the repository's own (``seats/tools/servers/``), started by the engine as a
child over stdio with the interpreter the node runs on
(``python -m <module>``), and told two things through its environment:

* its credentials, under the names the server reads them from
  (``SLACK_BOT_TOKEN``, ``MATTERMOST_BOT_TOKEN``, ``GITHUB_TOKEN``,
  ``JIRA_TOKEN`` with ``JIRA_USER``, ``CONFLUENCE_TOKEN`` with
  ``CONFLUENCE_USER``), passed through from the node's environment like any
  ``env_from`` variable — a seat's grant maps them onto its own variables;
* where the vendor's API is: the surface's server key
  (``surfaces.slack.api_url``, default ``https://slack.com/api/``;
  ``surfaces.mattermost.server``; ``surfaces.github.api_url``, default
  ``https://api.github.com``; ``surfaces.jira.server``;
  ``surfaces.confluence.server``), as ``SLACK_API_URL`` / ``MATTERMOST_URL`` /
  ``GITHUB_API_URL`` / ``JIRA_URL`` / ``CONFLUENCE_URL``. A surface with no
  default (the self-hosted or per-site ones) must name it.

The server's module is named here as text only: the company layer never
imports the seats app that holds it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from crewlet.company.org import (
    GITHUB_DEFAULT_API_URL,
    MATTERMOST_BOT_TOKEN_VAR,
    SLACK_BOT_TOKEN_VAR,
    SLACK_DEFAULT_API_URL,
    SURFACE_SERVER_KEYS,
    McpServer,
    Organization,
    Seat,
    Surface,
)

#: The key of an ``mcp_servers`` entry that names a shipped server instead of a command or a URL.
BUILTIN_KEY = "builtin"
#: The repository's root: a ``python -m`` child finds the server's package from here (its environment is not the node's).
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class BuiltinServer:
    """One shipped server: its module, the surface it speaks to, and the variables it reads."""

    kind: str
    module: str
    #: The variable the server reads its bot token from (what a seat's grant maps its own token onto).
    token_env: str
    #: The variable the server reads the vendor's API base URL from.
    url_env: str
    #: The surface whose server key (``surfaces.<surface>.api_url`` / ``.server``) is that URL.
    surface: str
    #: The URL when the surface names none; empty: the surface must name one.
    default_url: str = ""
    #: Further credentials it reads beside the token (an Atlassian account's user name), optional to set.
    extra_env: tuple[str, ...] = ()

    @property
    def env_from(self) -> tuple[str, ...]:
        """Every variable it reads from the node (what a seat's grant may map onto its own)."""
        return (self.token_env, *self.extra_env)


SLACK = BuiltinServer(
    kind="slack", module="seats.tools.servers.slack", token_env=SLACK_BOT_TOKEN_VAR, url_env="SLACK_API_URL",
    surface="slack", default_url=SLACK_DEFAULT_API_URL,
)
MATTERMOST = BuiltinServer(
    kind="mattermost", module="seats.tools.servers.mattermost", token_env=MATTERMOST_BOT_TOKEN_VAR,
    url_env="MATTERMOST_URL", surface="mattermost",
)
GITHUB = BuiltinServer(
    kind="github", module="seats.tools.servers.github", token_env="GITHUB_TOKEN", url_env="GITHUB_API_URL",
    surface="github", default_url=GITHUB_DEFAULT_API_URL,
)
JIRA = BuiltinServer(
    kind="jira", module="seats.tools.servers.jira", token_env="JIRA_TOKEN", url_env="JIRA_URL", surface="jira",
    extra_env=("JIRA_USER",),
)
CONFLUENCE = BuiltinServer(
    kind="confluence", module="seats.tools.servers.confluence", token_env="CONFLUENCE_TOKEN", url_env="CONFLUENCE_URL",
    surface="confluence", extra_env=("CONFLUENCE_USER",),
)
#: Every shipped server by the name ``builtin:`` gives it.
BUILTIN_SERVERS: Mapping[str, BuiltinServer] = {s.kind: s for s in (SLACK, MATTERMOST, GITHUB, JIRA, CONFLUENCE)}


class BuiltinServerError(ValueError):
    """A ``builtin`` entry the company cannot run; ``field`` is the company-file key to name, ``allowed`` what would do."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: {allowed}")


def api_url(server: BuiltinServer, surface: Optional[Surface]) -> str:
    """The vendor API base the server is pointed at: the surface's, else the server's default ('' when neither)."""
    url = (surface.server if surface is not None else "") or server.default_url
    if server.kind == SLACK.kind and url and not url.endswith("/"):
        url += "/"  # slack_sdk appends the method name to the base as it is
    return url


def builtin_mcp_server(name: str, kind: str, surfaces: Mapping[str, Surface]) -> McpServer:
    """The :class:`McpServer` the company's ``mcp_servers.<name>: {builtin: <kind>}`` runs; raises :class:`BuiltinServerError`."""
    server = BUILTIN_SERVERS.get(kind)
    if server is None:
        raise BuiltinServerError(
            f"mcp_servers.{name}.{BUILTIN_KEY}", kind, f"must be one of {', '.join(BUILTIN_SERVERS)}"
        )
    url = api_url(server, surfaces.get(server.surface))
    if not url:
        raise BuiltinServerError(
            f"mcp_servers.{name}.{BUILTIN_KEY}", kind,
            f"needs surfaces.{server.surface}.{SURFACE_SERVER_KEYS[server.surface]}: the URL of the {server.surface} server its tools call",
        )
    return McpServer(
        name=name,
        command=(sys.executable, "-m", server.module),
        env={server.url_env: url, "PYTHONPATH": _REPO_ROOT},
        env_from=server.env_from,
        builtin=kind,
    )


def builtin_grant(org: Organization, seat: Seat, kind: str) -> Optional[McpServer]:
    """The seat's first granted MCP server that is the shipped ``kind`` server, or None."""
    return next((s for s in org.mcp_servers_of(seat) if s.builtin == kind), None)


__all__ = [
    "BUILTIN_KEY",
    "BUILTIN_SERVERS",
    "BuiltinServer",
    "BuiltinServerError",
    "CONFLUENCE",
    "GITHUB",
    "JIRA",
    "MATTERMOST",
    "SLACK",
    "api_url",
    "builtin_grant",
    "builtin_mcp_server",
]
