"""The company: its seats, providers, surfaces and schedules, as the engine holds and routes by them.

Routing is an org function, not a process-local one: every producer resolves
its recipient from the organization current when it handles an event (a
handle, a role, an agent id or a surface identity to a seat) and never from
which seats this node runs. Agent ids are derived, not assigned
(``agent_id_for`` is a uuid5 over the org name and the handle), so every node
computes the same id with no database.

The company file is read and validated into an :class:`Organization` by
:mod:`crewlet.company.parse`; the running engine holds the current one in a
:class:`CompanyHolder`, swapped whole when a revision applies.
"""
from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Optional, TypedDict

from crewlet.company.budget import NO_BUDGET, Budget
from crewlet.company.thread_bounds import DEFAULT_THREAD_BOUNDS, ThreadBounds
from crewlet.company.episodes import DEFAULT_EPISODES, EpisodeSettings
from crewlet.company.sandbox import SANDBOX_TOOL, SandboxConfig

#: The namespace every node derives agent ids in. Never change it: ids are wire facts.
AGENT_ID_NAMESPACE = uuid.UUID("6f1d7c0e-3b0a-5c55-9d55-6372657765c1")

SEAT_KINDS = ("agent", "human")
#: The company file's surface kinds, and which key names each one's secret
#: variable. notifications.sources registers one webhook source per kind and
#: refuses to load unless the two lists agree.
SURFACE_SECRET_KEYS = {
    "slack": "signing_secret_env",
    "github": "secret_env",
    "jira": "secret_env",
    "confluence": "secret_env",
    "mattermost": "token_env",
}
SURFACES = tuple(SURFACE_SECRET_KEYS)
#: How a surface's deliveries arrive: POSTed to ``/webhooks/<kind>`` (the
#: default), or over a socket this node opens to the vendor (a laptop with no
#: public URL: Slack's Socket Mode, Mattermost's websocket).
MODE_WEBHOOK = "webhook"
MODE_SOCKET = "socket"
SURFACE_MODES = (MODE_WEBHOOK, MODE_SOCKET)
#: The surfaces that may say ``mode: socket``: the variable naming the token
#: the socket authenticates with, and the key naming the vendor's server
#: (required for Mattermost, which is self-hosted; optional for Slack, whose
#: Web API is ``https://slack.com/api/`` unless said otherwise).
SURFACE_SOCKET_TOKEN_KEYS = {"slack": "app_token_env", "mattermost": "bot_token_env"}
#: The key naming each surface's vendor API or server: what its socket dials (Slack, Mattermost) and what the
#: shipped tool server of that surface calls (every one; :mod:`crewlet.company.builtin_servers`).
SURFACE_SERVER_KEYS = {"slack": "api_url", "mattermost": "server", "github": "api_url", "jira": "server", "confluence": "server"}
#: Slack's Web API base when ``surfaces.slack.api_url`` names none (the socket, the chat tools, the working indicator).
SLACK_DEFAULT_API_URL = "https://slack.com/api/"
#: GitHub's REST API when ``surfaces.github.api_url`` names none (GitHub Enterprise Server: ``https://<host>/api/v3``).
GITHUB_DEFAULT_API_URL = "https://api.github.com"
#: The variables a chat tool server reads its bot token from (the shipped ones, and the usual name elsewhere):
#: a seat with its own chat identity feeds its bot token under these names unless its grant maps them itself.
SLACK_BOT_TOKEN_VAR = "SLACK_BOT_TOKEN"
MATTERMOST_BOT_TOKEN_VAR = "MATTERMOST_BOT_TOKEN"
#: The surfaces whose socket needs its server named.
SURFACE_SERVER_REQUIRED = frozenset({"mattermost"})
PROVIDER_KINDS = ("echo", "openai", "anthropic")
#: A seat's ``max_rounds`` when the company names none.
DEFAULT_MAX_ROUNDS = 12
#: The zone a ``cron`` schedule is read in when neither it nor the company (``timezone``) names one.
DEFAULT_TIMEZONE = "UTC"

#: The tools built into the engine that a seat is granted by name in ``seats[].tools``, beside MCP server names.
A2A_ASK_TOOL = "a2a_ask"
#: The seat's memory: remember, recall, search and forget rows (one grant, four tools).
MEMORY_TOOL = "memory"
#: :data:`~crewlet.company.sandbox.SANDBOX_TOOL` starts a coding run; only a company with a ``sandbox`` section grants it.
BUILTIN_TOOLS: tuple[str, ...] = (A2A_ASK_TOOL, MEMORY_TOOL, SANDBOX_TOOL)
#: ``seats[].reflection``: no post-turn reflection; reflection on every completed turn; or only on a turn
#: that talked with a person, writing only what it learned about them (the ``counterparty`` table).
REFLECTION_OFF = "off"
REFLECTION_ON = "on"
REFLECTION_LIMITED = "limited"
REFLECTION_MODES: tuple[str, ...] = (REFLECTION_OFF, REFLECTION_ON, REFLECTION_LIMITED)
#: How the engine reaches an MCP server: a child process over stdio, or streamable HTTP.
MCP_STDIO = "stdio"
MCP_HTTP = "http"
#: What a seat handle looks like (a whole-string match), for whoever validates one from outside.
HANDLE_PATTERN: str = r"[a-z0-9][a-z0-9_-]{0,62}"


def agent_id_for(org: str, handle: str) -> str:
    """The seat's agent id: the same on every node, derived from names alone."""
    return str(uuid.uuid5(AGENT_ID_NAMESPACE, f"{org}/{handle}"))


@dataclass(frozen=True)
class Provider:
    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """A stable name for fallback events: kind, and model where there is one."""
        model = self.options.get("model")
        return f"{self.kind}:{model}" if model else self.kind


@dataclass(frozen=True)
class McpServer:
    """One MCP server of the company, named once under ``mcp_servers`` and granted per seat.

    Exactly one of ``command`` (a child process spoken to over stdio) and
    ``url`` (streamable HTTP). Secrets never sit here: ``env_from`` names
    variables of the node's environment passed through to the child, and
    ``headers_from`` maps an HTTP header to the variable holding its value,
    so the company file (stored, diffed, shown in the admin) holds names only.
    ``env`` is for plain settings (a directory, a log level). ``builtin``
    names the shipped chat server it runs (``slack``, ``mattermost``;
    :mod:`crewlet.company.builtin_servers`), empty for a company's own.
    """

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    env_from: tuple[str, ...] = ()
    url: str = ""
    headers_from: Mapping[str, str] = field(default_factory=dict)
    builtin: str = ""

    @property
    def transport(self) -> str:
        return MCP_STDIO if self.command else MCP_HTTP


@dataclass(frozen=True)
class ToolGrant:
    """A seat's grant of one MCP server with credentials of its own: ``seats[].tools: [{server, env?, headers?}]``.

    ``env`` maps a variable the server declares in ``env_from`` to the node
    variable this seat's child reads it from; ``headers`` maps a header the
    server declares in ``headers_from`` to the node variable holding this
    seat's value. Names only, like the server's own, so two seats granted one
    server act under two identities without a secret in the company file.
    """

    server: str
    env: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GrantedServer:
    """An MCP server as one seat is granted it: which node variable each of its variables and headers is read from.

    Compared whole (server and both mappings), so a session opened for one
    grant is never kept for a changed one, nor shared with another seat's.
    """

    server: McpServer
    #: The child's variable -> the node variable holding this seat's value (every ``env_from`` name).
    env_from: Mapping[str, str] = field(default_factory=dict)
    #: The header -> the node variable holding this seat's value (every ``headers_from`` header).
    headers_from: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.server.name

    @property
    def transport(self) -> str:
        return self.server.transport

    def variables(self) -> list[str]:
        """The node variables this grant reads, each once (names, never values)."""
        return sorted({*self.env_from.values(), *self.headers_from.values()})


@dataclass(frozen=True)
class Surface:
    """One surface kind as the company configures it.

    ``secret_env`` names the variable holding what a webhook delivery is
    verified with; in ``socket`` mode, ``token_env`` names the token the
    socket authenticates with. ``server`` is the vendor's server in either
    mode: where the socket connects, and what the shipped chat tools and the
    working indicator call.
    """

    name: str
    secret_env: str = ""
    verify: bool = True
    mode: str = MODE_WEBHOOK
    token_env: str = ""
    server: str = ""
    #: Whether the company file names this surface under ``surfaces``: start-up warns only about those.
    configured: bool = False

    @property
    def socket(self) -> bool:
        return self.mode == MODE_SOCKET


class SeatLabels(TypedDict):
    """The seat, role and agent id an event body carries for the seat it concerns."""

    seat: str
    role: str
    agent_id: str


@dataclass(frozen=True)
class Placement:
    """Where an agent seat may run: pinned to one node, and/or on a node carrying every one of ``labels``.

    The empty placement (the default) lets any live node run the seat.
    """

    node: str = ""
    labels: tuple[str, ...] = ()

    def allows(self, node: str, labels: "tuple[str, ...] | frozenset[str]") -> bool:
        """Whether a node with id ``node`` and ``labels`` may run the seat."""
        if self.node and node != self.node:
            return False
        return set(self.labels) <= set(labels)

    def describe(self) -> str:
        """The placement in the company file's words (for a message about a seat nobody can take)."""
        parts = ([f"node {self.node}"] if self.node else []) + ([f"labels {', '.join(self.labels)}"] if self.labels else [])
        return " and ".join(parts) or "any node"


#: A seat's own chat identity in the company file (``seats[].slack``, ``seats[].mattermost``), key by key.
SEAT_SLACK_KEYS = ("app_id", "signing_secret_env", "bot_token_env", "app_token_env")
SEAT_MATTERMOST_KEYS = ("bot_token_env",)
#: The surfaces a seat's own socket token opens a socket on (the key naming it), and those whose seat
#: sockets open whatever ``surfaces.<kind>.mode`` says: a Slack app-level token serves Socket Mode alone,
#: while a Mattermost bot's token is for acting too, so its socket opens only with ``mode: socket``.
SEAT_SOCKET_TOKEN_KEYS = {"slack": "app_token_env", "mattermost": "bot_token_env"}
SEAT_SOCKET_ANY_MODE = frozenset({"slack"})


@dataclass(frozen=True)
class SlackApp:
    """An agent seat's own Slack app (``seats[].slack``): in Slack every bot is an app of its own.

    A delivery naming ``app_id`` (its ``api_app_id``) is verified with this
    app's signing secret and a DM to its bot reaches this seat. Each field
    but ``app_id`` names an environment variable, never holds the value:
    the signing secret, the bot token (``xoxb-``, what the seat acts with)
    and, for Socket Mode, the app-level token (``xapp-``).
    """

    app_id: str
    signing_secret_env: str
    bot_token_env: str
    app_token_env: str = ""


@dataclass(frozen=True)
class MattermostBot:
    """An agent seat's own Mattermost bot account (``seats[].mattermost``): the variable holding its token."""

    bot_token_env: str


@dataclass(frozen=True)
class Seat:
    handle: str
    kind: str
    role: str
    display_name: str
    identities: Mapping[str, str]
    agent_id: str
    #: What the seat may call in a turn: MCP server names (``mcp_servers``) and built-ins (:data:`BUILTIN_TOOLS`).
    tools: tuple[str, ...] = ()
    #: The most model calls one turn of this seat makes before it is stopped.
    max_rounds: int = DEFAULT_MAX_ROUNDS
    #: The most tokens (input + output, over all rounds) one turn may spend; 0 = no cap.
    turn_token_budget: int = 0
    #: Post-turn reflection (``seats[].reflection``): one of :data:`REFLECTION_MODES`.
    reflection: str = REFLECTION_OFF
    #: Which nodes of a fleet may run the seat (``seats[].placement``).
    placement: Placement = field(default_factory=Placement)
    #: The grants in ``tools`` that map a server's variables or headers to the seat's own, by server name.
    grants: Mapping[str, ToolGrant] = field(default_factory=dict)
    #: The seat's own instructions (``instructions``, or the content of ``instructions_file``), composed into
    #: its system prompt after the engine's framing; "" = none.
    instructions: str = ""
    #: ``instructions_file`` as written (relative to the company file) when the instructions came from one.
    instructions_file: str = ""
    #: The seat's own model chain (``seats[].providers``); empty = the company's ``providers.llm``.
    providers: tuple[Provider, ...] = ()
    #: The seat's own chat identity (``seats[].slack``, ``seats[].mattermost``); None: the company-level one.
    slack: Optional[SlackApp] = None
    mattermost: Optional[MattermostBot] = None
    #: The seat's own token ceilings per calendar day and month (``seats[].budget``); none by default.
    budget: Budget = NO_BUDGET

    @property
    def is_agent(self) -> bool:
        return self.kind == "agent"

    def own_socket_token_env(self, surface: str) -> str:
        """The variable holding the seat's own socket token on ``surface`` (:data:`SEAT_SOCKET_TOKEN_KEYS`); "" when none."""
        if surface == "slack" and self.slack is not None:
            return self.slack.app_token_env
        if surface == "mattermost" and self.mattermost is not None:
            return self.mattermost.bot_token_env
        return ""

    def own_ids(self, surface: str) -> tuple[str, ...]:
        """Every id that is this seat on ``surface``: its identity there and, on Slack, its own app's id."""
        ident = self.identities.get(surface, "")
        app = self.slack.app_id if surface == "slack" and self.slack is not None else ""
        return tuple(i for i in (ident, app) if i)

    def labels(self) -> SeatLabels:
        """The three fields that name this seat on every event about it: ``Body(**seat.labels(), ...)``."""
        return {"seat": self.handle, "role": self.role, "agent_id": self.agent_id}


#: A scheduled task's turn runs at most this long unless its schedule names its own ``timeout``.
SCHEDULE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Schedule:
    """One ``schedules[]`` entry: every ``every_s`` seconds (aligned to the epoch), or at each ``cron`` instant in ``timezone``."""

    name: str
    seat: str
    every_s: float
    task: str
    #: A five-field cron expression (minute hour day-of-month month day-of-week), or "" for an ``every`` schedule.
    cron: str = ""
    #: The IANA zone ``cron`` is read in (the schedule's own ``timezone``, else the company's).
    timezone: str = DEFAULT_TIMEZONE
    #: How long a turn working one of its tasks may run (``timeout``): past it, a ``scheduled_timeout`` guard breach.
    timeout_s: float = SCHEDULE_TIMEOUT_S

    @property
    def cadence(self) -> str:
        """When it fires, in words: a schedule whose cadence changes is a new schedule to the scheduler."""
        return f"cron {self.cron} {self.timezone}" if self.cron else f"every {self.every_s:g}s"


@dataclass(frozen=True)
class Organization:
    """One validated company; immutable, swapped whole when a revision applies."""

    org: str
    providers: tuple[Provider, ...]
    max_concurrent: int
    coalesce_window_s: float
    coalesce_max_batch: int
    rate_limit_per_s: float
    surfaces: Mapping[str, Surface]
    seats: tuple[Seat, ...]
    schedules: tuple[Schedule, ...]
    source_text: str = ""
    mcp_servers: Mapping[str, McpServer] = field(default_factory=dict)
    #: The files the company includes (``seats[].instructions_file``), by path relative to the company
    #: file: with ``source_text``, the whole content a revision stores.
    source_files: Mapping[str, str] = field(default_factory=dict)
    #: ``providers.reflection``: the chain post-turn reflection calls; empty = each seat's own chain.
    reflection_providers: tuple[Provider, ...] = ()
    #: The company's ``timezone``: what its ``cron`` schedules are read in unless one names its own.
    timezone: str = DEFAULT_TIMEZONE
    #: The company's token ceilings per calendar day and month in ``timezone`` (``budget``), over all its seats.
    budget: Budget = NO_BUDGET
    #: How much of its conversation a turn for a chat or tracker message is shown (``thread_block``).
    thread_block: ThreadBounds = DEFAULT_THREAD_BOUNDS
    #: How many recent episodes a conversation's next turn is given, and the most one weighs (``episodes``).
    episodes: EpisodeSettings = DEFAULT_EPISODES
    #: The job a seat's ``sandbox_run`` starts and its jail (``sandbox``); None: no seat may be granted the tool.
    sandbox: Optional[SandboxConfig] = None

    def agent_id_for(self, handle: str) -> str:
        return agent_id_for(self.org, handle)

    @cached_property
    def _by_handle(self) -> Mapping[str, Seat]:
        """Seats by handle, and by agent id: a lookup per seat (attaching, each delivery) was a walk of every seat."""
        index: dict[str, Seat] = {}
        for seat in reversed(self.seats):  # the first seat of a name wins, as the walk it replaces returned it
            index[seat.handle] = seat
        return index

    @cached_property
    def _by_id(self) -> Mapping[str, Seat]:
        index: dict[str, Seat] = {}
        for seat in reversed(self.seats):
            index[seat.agent_id] = seat
        return index

    def seat_by_handle(self, handle: str) -> Optional[Seat]:
        return self._by_handle.get(handle)

    def seat_by_id(self, agent_id: str) -> Optional[Seat]:
        return self._by_id.get(agent_id)

    def seat_by_role(self, role: str) -> Optional[Seat]:
        return next((s for s in self.seats if s.role == role), None)

    def seat_by_identity(self, surface: str, identity: str) -> Optional[Seat]:
        return next((s for s in self.seats if s.identities.get(surface) == identity), None)

    def seat_by_slack_app(self, app_id: str) -> Optional[Seat]:
        """The seat whose own Slack app (``seats[].slack.app_id``) is ``app_id``."""
        return next((s for s in self.seats if s.slack is not None and s.slack.app_id == app_id), None) if app_id else None

    def resolve(self, ref: str) -> Optional[Seat]:
        """A handle, an agent id or a role name to its seat."""
        return self.seat_by_handle(ref) or self.seat_by_id(ref) or self.seat_by_role(ref)

    def agent_seats(self) -> tuple[Seat, ...]:
        return tuple(s for s in self.seats if s.is_agent)

    @property
    def has_provider(self) -> bool:
        return bool(self.providers)

    def providers_of(self, seat: Seat) -> tuple[Provider, ...]:
        """The model chain ``seat``'s turns call: its own ``providers`` when it names any, else the company's."""
        return seat.providers or self.providers

    def reflection_chain_of(self, seat: Seat) -> tuple[Provider, ...]:
        """The model chain a reflection on ``seat``'s turn calls: ``providers.reflection``, else the seat's own chain."""
        return self.reflection_providers or self.providers_of(seat)

    def has_provider_for(self, handle: str) -> bool:
        """Whether the seat ``handle`` has a model to call (a seat no longer in the company: the company's chain)."""
        seat = self.seat_by_handle(handle)
        return bool(self.providers_of(seat) if seat is not None else self.providers)

    def mcp_servers_of(self, seat: Seat) -> tuple[McpServer, ...]:
        """The MCP servers ``seat`` is granted, in the order its ``tools`` names them."""
        return tuple(self.mcp_servers[name] for name in seat.tools if name in self.mcp_servers)

    def granted_servers(self, seat: Seat) -> tuple[GrantedServer, ...]:
        """The MCP servers ``seat`` is granted, each with the node variables its credentials are read from for this seat."""
        return tuple(
            GrantedServer(server, env_from=grant_env(seat, server), headers_from=grant_headers(seat, server))
            for server in self.mcp_servers_of(seat)
        )


def grant_env(seat: Seat, server: McpServer) -> dict[str, str]:
    """Each variable ``server`` declares in ``env_from`` -> the node variable ``seat``'s child reads it from.

    A variable is read under its own name unless the seat's grant maps it
    (``seats[].tools: [{server, env: {VAR: SEAT_VAR}}]``). The one place a
    seat's default for a server's variables is decided: a seat with its own
    chat identity (``seats[].slack``, ``seats[].mattermost``) feeds its bot
    token under :data:`SLACK_BOT_TOKEN_VAR` / :data:`MATTERMOST_BOT_TOKEN_VAR`
    to every server that reads one, so the identity is not repeated in each
    grant; the grant's explicit mapping wins over that.
    """
    mapped = {**identity_env(seat), **(seat.grants[server.name].env if server.name in seat.grants else {})}
    return {name: mapped.get(name, name) for name in server.env_from}


def identity_env(seat: Seat) -> dict[str, str]:
    """The seat's chat identity as tool-server variables: the bot token name -> the node variable holding its token."""
    own = {SLACK_BOT_TOKEN_VAR: seat.slack.bot_token_env} if seat.slack is not None else {}
    if seat.mattermost is not None:
        own[MATTERMOST_BOT_TOKEN_VAR] = seat.mattermost.bot_token_env
    return own


def grant_headers(seat: Seat, server: McpServer) -> dict[str, str]:
    """Each header ``server`` declares in ``headers_from`` -> the node variable holding ``seat``'s value for it."""
    mapped = dict(seat.grants[server.name].headers) if server.name in seat.grants else {}
    return {header: mapped.get(header, var) for header, var in server.headers_from.items()}


class CompanyHolder:
    """The organization current right now. Producers call ``current()`` per event, never keep one."""

    def __init__(self, org: Organization) -> None:
        self._org = org
        self._lock = threading.Lock()
        self._epoch = 1

    def current(self) -> Organization:
        return self._org

    @property
    def epoch(self) -> int:
        return self._epoch

    def swap(self, org: Organization) -> Organization:
        with self._lock:
            previous, self._org = self._org, org
            self._epoch += 1
        return previous
