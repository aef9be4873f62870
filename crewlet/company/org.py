"""The company: its seats, providers, surfaces and schedules, read from YAML.

Routing is an org function, not a process-local one: every producer resolves
its recipient from the organization current when it handles an event (a
handle, a role, an agent id or a surface identity to a seat) and never from
which seats this node runs. Agent ids are derived, not assigned
(``agent_id_for`` is a uuid5 over the org name and the handle), so every node
computes the same id with no database.

A bad company file is refused at load with the field, the value and what is
allowed, exactly like a bad engine setting, in one bounded line: the file is
read by the settings' guarded YAML loader (:func:`crewlet.company.conf.load_yaml`:
size, encoding, depth, alias expansion and duplicate keys), every number is
finite and inside its range, and every interval has a floor.
"""
from __future__ import annotations

import math
import re
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NoReturn, Optional, TypedDict

from crewlet.company.conf import NODE_ID_PATTERN, FieldValueError, is_finite_number, load_yaml, read_yaml_text
from crewlet.base.jsontext import dotted
from crewlet.base.logfmt import REDACTED, is_secret_name, redact_text
from crewlet.queue.contract import MAX_LINGER_SECONDS

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
SURFACE_SERVER_KEYS = {"slack": "api_url", "mattermost": "server"}
#: The surfaces whose socket needs its server named.
SURFACE_SERVER_REQUIRED = frozenset({"mattermost"})
PROVIDER_KINDS = ("echo", "openai", "anthropic")
#: A seat's ``max_rounds`` when the company names none, and the range it may name.
DEFAULT_MAX_ROUNDS = 12
MAX_ROUNDS_RANGE = (1, 100)
#: An echo script step: one tool call, several at once, or the answer that ends the turn.
ECHO_STEP_KEYS = ("tool", "arguments", "calls", "answer")
COALESCE_WINDOW_RANGE = (0.0, float(MAX_LINGER_SECONDS))
COALESCE_MAX_BATCH_RANGE = (1, 100)
#: ``notification_rate_limit``, wakes per seat per second, when it is not 0 (off). A rate below one per
#: second widens the valve's window to 1/rate seconds, so the floor bounds that window (10,000 s); above
#: the ceiling the valve would never shut.
RATE_LIMIT_RANGE = (0.0001, 1000.0)
#: A schedule's ``every``, in seconds: each firing is a whole turn of a seat and a row in the
#: coordination store, so a minute is the shortest cadence (cron's own); a year the longest.
SCHEDULE_EVERY_RANGE_S = (60.0, 365 * 86400.0)
#: A model provider's ``timeout_s`` and the echo model's ``delay_s``, in seconds.
PROVIDER_TIMEOUT_RANGE_S = (0.1, 3600.0)
ECHO_DELAY_RANGE_S = (0.0, 3600.0)
MAX_CONCURRENT_RANGE = (1, 64)
EXAMPLE_COMPANY = Path(__file__).resolve().parent.parent / "companies" / "example.yaml"

#: The tool built into the engine that a seat is granted by name in ``seats[].tools``, beside MCP server names.
A2A_ASK_TOOL = "a2a_ask"
BUILTIN_TOOLS: tuple[str, ...] = (A2A_ASK_TOOL,)
#: How the engine reaches an MCP server: a child process over stdio, or streamable HTTP.
MCP_STDIO = "stdio"
MCP_HTTP = "http"
#: An MCP server's name is the prefix of every tool the model sees from it (``<server>__<tool>``), so it
#: stays short and within the vendors' tool-name alphabet, and never holds the ``__`` separator itself.
_MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,31}")
#: Values that are credentials by their shape, whatever they are called: chat, forge and model vendors' token prefixes.
_SECRET_VALUE = re.compile(r"^(?:xox[a-z]-|xapp-|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|sk-|sk_live_|AKIA[0-9A-Z]{12})")

_HANDLE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
#: What a seat handle looks like (a whole-string match), for whoever validates one from outside.
HANDLE_PATTERN: str = _HANDLE.pattern
#: What a pinned node id or a node label may be (the node id's own rule).
NODE_ID_RULE = "must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit"
_ORG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class CompanyError(FieldValueError):
    """A company file that cannot be served; names the field, the value and what is allowed."""

    where = "in"


def agent_id_for(org: str, handle: str) -> str:
    """The seat's agent id: the same on every node, derived from names alone."""
    return str(uuid.uuid5(AGENT_ID_NAMESPACE, f"{org}/{handle}"))


def parse_duration_s(
    text: Any, field_name: str, source: Optional[str] = None, bounds_s: tuple[float, float] = SCHEDULE_EVERY_RANGE_S
) -> float:
    """``90s``, ``15m``, ``24h``, ``7d`` (or a number of seconds) as float seconds within ``bounds_s``.

    Finite only: ``.inf`` or a number of digits no float holds would be a
    schedule that never fires, and a wait the scheduler cannot compute.
    """
    lo, hi = bounds_s
    allowed = f"must be a duration like 90s, 15m, 24h or 7d, between {_duration_text(lo)} and {_duration_text(hi)}"
    if is_finite_number(text):
        seconds = float(text) if abs(text) <= hi else math.inf  # an int too large for a float is past the range anyway
    else:
        m = _DURATION.match(text.strip()) if isinstance(text, str) else None
        if not m:
            raise CompanyError(field_name, text, allowed, source)
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not math.isfinite(seconds) or not lo <= seconds <= hi:
        raise CompanyError(field_name, text, allowed, source)
    return seconds


def _duration_text(seconds: float) -> str:
    """A number of seconds in the largest unit that divides it (``60.0`` -> ``1m``), as the file writes one."""
    for unit, size in sorted(_UNIT_S.items(), key=lambda item: -item[1]):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


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
    ``env`` is for plain settings (a directory, a log level).
    """

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    env_from: tuple[str, ...] = ()
    url: str = ""
    headers_from: Mapping[str, str] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return MCP_STDIO if self.command else MCP_HTTP


@dataclass(frozen=True)
class Surface:
    """One surface kind as the company configures it.

    ``secret_env`` names the variable holding what a webhook delivery is
    verified with; in ``socket`` mode, ``token_env`` names the token the
    socket authenticates with and ``server`` where it connects.
    """

    name: str
    secret_env: str = ""
    verify: bool = True
    mode: str = MODE_WEBHOOK
    token_env: str = ""
    server: str = ""

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
    #: Which nodes of a fleet may run the seat (``seats[].placement``).
    placement: Placement = field(default_factory=Placement)

    @property
    def is_agent(self) -> bool:
        return self.kind == "agent"

    def labels(self) -> SeatLabels:
        """The three fields that name this seat on every event about it: ``Body(**seat.labels(), ...)``."""
        return {"seat": self.handle, "role": self.role, "agent_id": self.agent_id}


@dataclass(frozen=True)
class Schedule:
    name: str
    seat: str
    every_s: float
    task: str


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

    def agent_id_for(self, handle: str) -> str:
        return agent_id_for(self.org, handle)

    def seat_by_handle(self, handle: str) -> Optional[Seat]:
        return next((s for s in self.seats if s.handle == handle), None)

    def seat_by_id(self, agent_id: str) -> Optional[Seat]:
        return next((s for s in self.seats if s.agent_id == agent_id), None)

    def seat_by_role(self, role: str) -> Optional[Seat]:
        return next((s for s in self.seats if s.role == role), None)

    def seat_by_identity(self, surface: str, identity: str) -> Optional[Seat]:
        return next((s for s in self.seats if s.identities.get(surface) == identity), None)

    def resolve(self, ref: str) -> Optional[Seat]:
        """A handle, an agent id or a role name to its seat."""
        return self.seat_by_handle(ref) or self.seat_by_id(ref) or self.seat_by_role(ref)

    def agent_seats(self) -> tuple[Seat, ...]:
        return tuple(s for s in self.seats if s.is_agent)

    @property
    def has_provider(self) -> bool:
        return bool(self.providers)

    def mcp_servers_of(self, seat: Seat) -> tuple[McpServer, ...]:
        """The MCP servers ``seat`` is granted, in the order its ``tools`` names them."""
        return tuple(self.mcp_servers[name] for name in seat.tools if name in self.mcp_servers)


# ---------------------------------------------------------------------------
# Parsing


def _mapping(value: Any, name: str, source: Optional[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CompanyError(name, value, "must be a mapping", source)
    return value


def _known(body: Mapping[str, Any], prefix: str, allowed: tuple[str, ...], source: Optional[str]) -> None:
    for key in body:
        if key not in allowed:
            raise CompanyError(f"{prefix}{key}", body[key], f"unknown key; allowed: {', '.join(allowed)}", source)


def _number(value: Any, name: str, lo: float, hi: Optional[float], integer: bool, source: Optional[str]) -> Any:
    """A whole number or a finite number within [lo, hi] (no upper bound when ``hi`` is None).

    NaN compares false with every bound, so it is refused as not a number
    rather than let through a range check; infinity is refused the same way.
    """
    ok = isinstance(value, int) if integer else is_finite_number(value)
    bound = f"between {lo:g} and {hi:g}" if hi is not None else f">= {lo:g}"
    if isinstance(value, bool) or not ok:
        what = "a whole number" if integer else "a number"
        raise CompanyError(name, value, f"must be {what} {bound}", source)
    if value < lo or (hi is not None and value > hi):
        raise CompanyError(name, value, f"must be {bound}", source)
    return int(value) if integer else float(value)


def _rate(value: Any, name: str, source: Optional[str]) -> float:
    """``notification_rate_limit``: 0 (off), or a finite rate within :data:`RATE_LIMIT_RANGE`."""
    lo, hi = RATE_LIMIT_RANGE
    allowed = f"must be 0 (off) or a number of wakes per second between {lo:g} and {hi:g}"
    if not is_finite_number(value):
        raise CompanyError(name, value, allowed, source)
    if value != 0 and not lo <= value <= hi:
        raise CompanyError(name, value, allowed, source)
    return float(value)


def _string(value: Any, name: str, source: Optional[str], pattern: Optional[re.Pattern[str]] = None, what: str = "") -> str:
    if not isinstance(value, str) or not value.strip():
        raise CompanyError(name, value, "must be a non-empty string", source)
    if pattern is not None and not pattern.fullmatch(value):
        raise CompanyError(name, value, what or f"must match {pattern.pattern}", source)
    return value


def _refuse_inline_secret(name: str, allowed: str, source: Optional[str]) -> NoReturn:
    """Refuse a credential written into the company file, naming the field and never echoing the value."""
    raise CompanyError(name, REDACTED, allowed, source)


def _looks_secret(value: str) -> bool:
    """A credential by its shape: a vendor token prefix, or text the log redactor would blank (a bearer, a URL password)."""
    return bool(_SECRET_VALUE.match(value.strip())) or redact_text(value) != value


def _env_names(value: Any, name: str, source: Optional[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise CompanyError(name, value, "must be a list of environment variable names", source)
    names = []
    for i, v in enumerate(value):
        if isinstance(v, str) and _looks_secret(v):
            _refuse_inline_secret(f"{name}[{i}]", "must be an environment variable name, not the secret itself", source)
        names.append(_string(v, f"{name}[{i}]", source, _ENV, "must be an environment variable name"))
    return tuple(names)


def _mcp_server(sname: str, body: Mapping[str, Any], source: Optional[str]) -> McpServer:
    prefix = f"mcp_servers.{sname}"
    allowed_keys = ("command", "env", "env_from", "url", "headers_from")
    for key in body:
        if key not in allowed_keys:
            if key == "headers" or is_secret_name(str(key)):
                _refuse_inline_secret(
                    f"{prefix}.{key}", "is not allowed: give a header through headers_from: {Header: ENV_VAR}, "
                    "a secret variable through env_from: [ENV_VAR]", source,
                )
            raise CompanyError(f"{prefix}.{key}", body[key], f"unknown key; allowed: {', '.join(allowed_keys)}", source)
    has_command, has_url = body.get("command") is not None, body.get("url") is not None
    if has_command == has_url:
        raise CompanyError(
            prefix, "both command and url" if has_command else "neither command nor url",
            "must have exactly one of command: [program, args...] (stdio) or url: http(s)://... (streamable HTTP)", source,
        )
    command: tuple[str, ...] = ()
    url = ""
    if has_command:
        raw = body["command"]
        if not isinstance(raw, list) or not raw:
            raise CompanyError(f"{prefix}.command", raw, "must be a non-empty list: [program, args...]", source)
        parts = []
        for i, part in enumerate(raw):
            part = str(part) if isinstance(part, (int, float)) and not isinstance(part, bool) else part
            part = _string(part, f"{prefix}.command[{i}]", source)
            if _looks_secret(part):
                _refuse_inline_secret(
                    f"{prefix}.command[{i}]", "looks like a credential: pass it through env_from: [ENV_VAR]", source
                )
            parts.append(part)
        command = tuple(parts)
    else:
        url = _string(body["url"], f"{prefix}.url", source)
        if _looks_secret(url):
            _refuse_inline_secret(
                f"{prefix}.url", "carries a credential: give it through headers_from: {Header: ENV_VAR}", source
            )
        if not re.match(r"^https?://", url):
            raise CompanyError(f"{prefix}.url", url, "must be an http:// or https:// URL", source)
    env: dict[str, str] = {}
    for key, value in _mapping(body.get("env"), f"{prefix}.env", source).items():
        key = _string(key, f"{prefix}.env", source, _ENV, "must be an environment variable name")
        text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        if is_secret_name(key) or (isinstance(text, str) and _looks_secret(text)):
            _refuse_inline_secret(
                f"{prefix}.env.{key}",
                f"a secret is never inline: name the variable in env_from: [{key}] and set it in the node's environment",
                source,
            )
        if not isinstance(text, str):
            raise CompanyError(f"{prefix}.env.{key}", value, "must be a string", source)
        env[key] = text
    env_from = _env_names(body.get("env_from"), f"{prefix}.env_from", source)
    headers_from: dict[str, str] = {}
    for header, var in _mapping(body.get("headers_from"), f"{prefix}.headers_from", source).items():
        what = f"{prefix}.headers_from.{header}"
        if isinstance(var, str) and (_looks_secret(var) or (not _ENV.fullmatch(var) and is_secret_name(str(header)))):
            _refuse_inline_secret(what, "must name the environment variable holding the value, not the value", source)
        if not isinstance(var, str) or not _ENV.fullmatch(var):
            raise CompanyError(what, var, "must be an environment variable name", source)
        headers_from[str(header)] = var
    if has_command and headers_from:
        raise CompanyError(f"{prefix}.headers_from", dict(headers_from), "applies only to a url server", source)
    if has_url and (env or env_from):
        raise CompanyError(f"{prefix}.env", "env/env_from", "applies only to a command server", source)
    return McpServer(name=sname, command=command, env=env, env_from=env_from, url=url, headers_from=headers_from)


def _echo_options(options: dict[str, Any], name: str, source: Optional[str]) -> None:
    """The demo model's keys: ``delay_s``, ``fail``, and a ``script`` of rounds (``repeat`` loops it, ``match`` confines it)."""
    _known(options, f"{name}.", ("delay_s", "fail", "script", "repeat", "match"), source)
    if "match" in options:
        _string(options["match"], f"{name}.match", source)
    if "delay_s" in options:
        options["delay_s"] = _number(options["delay_s"], f"{name}.delay_s", *ECHO_DELAY_RANGE_S, False, source)
    for flag in ("fail", "repeat"):
        if flag in options and not isinstance(options[flag], bool):
            raise CompanyError(f"{name}.{flag}", options[flag], "must be true or false", source)
    script = options.get("script", [])
    if not isinstance(script, list):
        raise CompanyError(f"{name}.script", script, "must be a list of steps ({tool, arguments}, {calls}, {answer})", source)
    steps: list[dict[str, Any]] = []
    for j, step in enumerate(script):
        where = f"{name}.script[{j}]"
        body = _mapping(step, where, source)
        _known(body, f"{where}.", ECHO_STEP_KEYS, source)
        if "answer" in body:
            if len(body) != 1 or not isinstance(body["answer"], str):
                raise CompanyError(where, dict(body), "an answer step is {answer: <text>} alone", source)
            steps.append({"answer": body["answer"]})
            continue
        calls = body.get("calls", [body] if "tool" in body else None)
        if not isinstance(calls, list) or not calls:
            raise CompanyError(where, dict(body), "must name a tool, a list of calls, or an answer", source)
        checked: list[dict[str, Any]] = []
        for k, call in enumerate(calls):
            cwhere = where if "tool" in body else f"{where}.calls[{k}]"
            call = _mapping(call, cwhere, source)
            _known(call, f"{cwhere}.", ("tool", "arguments"), source)
            tool = _string(call.get("tool"), f"{cwhere}.tool", source)
            arguments = _mapping(call.get("arguments"), f"{cwhere}.arguments", source)
            _refuse_non_finite(arguments, f"{cwhere}.arguments", source)
            checked.append({"tool": tool, "arguments": dict(arguments)})
        steps.append({"calls": checked})
    if script:
        options["script"] = steps


def _refuse_non_finite(value: Any, name: str, source: Optional[str]) -> None:
    """Refuse NaN or infinity anywhere in ``value`` (a tool call's arguments): JSON has neither, so every call would fail.

    Walked with an explicit stack: the loader bounds how many values there
    are, not how deep a walk of them would recurse.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise CompanyError(dotted(at, name), item, "must be a finite number: JSON has no NaN or infinity", source)
        if isinstance(item, Mapping):
            stack.extend((child, (*at, str(key))) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, (*at, i)) for i, child in enumerate(item))


def _model_options(kind: str, options: dict[str, Any], name: str, source: Optional[str]) -> None:
    """A vendor SDK's keys: the model, where it is served, the variable holding its key, and limits."""
    _known(options, f"{name}.", ("base_url", "model", "api_key_env", "timeout_s", "max_tokens"), source)
    if kind == "openai" or "base_url" in options:
        base_url = _string(options.get("base_url"), f"{name}.base_url", source)
        if _looks_secret(base_url):
            _refuse_inline_secret(f"{name}.base_url", "carries a credential: name its variable in api_key_env", source)
        if not re.match(r"^https?://", base_url):
            raise CompanyError(f"{name}.base_url", base_url, "must be an http:// or https:// URL", source)
    _string(options.get("model"), f"{name}.model", source)
    if "api_key_env" in options:
        env = options["api_key_env"]
        if isinstance(env, str) and _looks_secret(env):
            _refuse_inline_secret(f"{name}.api_key_env", "must name the environment variable holding the key, not the key", source)
        _string(env, f"{name}.api_key_env", source, _ENV, "must be an environment variable name")
    if "timeout_s" in options:
        options["timeout_s"] = _number(options["timeout_s"], f"{name}.timeout_s", *PROVIDER_TIMEOUT_RANGE_S, False, source)
    if "max_tokens" in options:
        options["max_tokens"] = _number(options["max_tokens"], f"{name}.max_tokens", 1, 1_000_000, True, source)


def _mcp_servers(value: Any, source: Optional[str]) -> dict[str, McpServer]:
    servers: dict[str, McpServer] = {}
    for sname, body in _mapping(value, "mcp_servers", source).items():
        sname = _string(
            sname, "mcp_servers", source, _MCP_SERVER_NAME,
            "a server name must be 1-32 letters, digits, '-' or '_' (never '__'), starting with a letter or digit",
        )
        if sname in BUILTIN_TOOLS:
            raise CompanyError(f"mcp_servers.{sname}", sname, "is the name of a built-in tool; choose another", source)
        servers[sname] = _mcp_server(sname, _mapping(body, f"mcp_servers.{sname}", source), source)
    return servers


def _placement(value: Any, name: str, kind: str, source: Optional[str]) -> Placement:
    """``seats[].placement``: ``{node: n1}`` pins, ``{labels: [gpu]}`` needs every label; only an agent has one."""
    if value is None:
        return Placement()
    body = _mapping(value, name, source)
    _known(body, f"{name}.", ("node", "labels"), source)
    if body and kind != "agent":
        raise CompanyError(name, dict(body), "applies only to an agent seat (a person runs on no node)", source)
    node = ""
    if body.get("node") is not None:
        node = _string(body["node"], f"{name}.node", source, NODE_ID_PATTERN, NODE_ID_RULE)
    raw = body.get("labels")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise CompanyError(f"{name}.labels", raw, "must be a list of node labels", source)
    labels: list[str] = []
    for i, label in enumerate(raw):
        label = _string(label, f"{name}.labels[{i}]", source, NODE_ID_PATTERN, NODE_ID_RULE)
        if label not in labels:
            labels.append(label)
    return Placement(node=node, labels=tuple(labels))


def _seat_tools(value: Any, name: str, servers: Mapping[str, McpServer], source: Optional[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    allowed = ", ".join([*servers, *BUILTIN_TOOLS])
    if not isinstance(value, list):
        raise CompanyError(name, value, f"must be a list of tool grants ({allowed})", source)
    tools: list[str] = []
    for i, tool in enumerate(value):
        if not isinstance(tool, str) or (tool not in servers and tool not in BUILTIN_TOOLS):
            raise CompanyError(f"{name}[{i}]", tool, f"must be an mcp_servers name or a built-in tool ({allowed})", source)
        if tool in tools:
            raise CompanyError(f"{name}[{i}]", tool, "is granted twice", source)
        tools.append(tool)
    return tuple(tools)


_TOP_KEYS = (
    "org",
    "providers",
    "node",
    "notification_coalesce_window_seconds",
    "notification_coalesce_max_batch",
    "notification_rate_limit",
    "surfaces",
    "seats",
    "schedules",
    "mcp_servers",
)


def _surface_socket(name: str, body: Mapping[str, Any], source: Optional[str]) -> dict[str, str]:
    """A surface's mode, and in ``socket`` mode the token variable and the server it connects with."""
    mode = body.get("mode", MODE_WEBHOOK)
    if mode not in SURFACE_MODES:
        raise CompanyError(f"surfaces.{name}.mode", mode, f"must be one of {', '.join(SURFACE_MODES)}", source)
    if mode != MODE_SOCKET:
        for key in (SURFACE_SOCKET_TOKEN_KEYS.get(name), SURFACE_SERVER_KEYS.get(name)):
            if key and key in body:
                raise CompanyError(f"surfaces.{name}.{key}", body[key], "is read only with mode: socket", source)
        return {"mode": mode}
    token_key, server_key = SURFACE_SOCKET_TOKEN_KEYS[name], SURFACE_SERVER_KEYS[name]
    if token_key not in body:
        raise CompanyError(f"surfaces.{name}.{token_key}", None, "is required with mode: socket (the variable holding its token)", source)
    token_env = _string(body[token_key], f"surfaces.{name}.{token_key}", source, _ENV, "must be an environment variable name")
    server = body.get(server_key, "")
    if server or name in SURFACE_SERVER_REQUIRED:
        server = _string(server or None, f"surfaces.{name}.{server_key}", source)
        if not re.match(r"^https?://[^/\s]+", server):
            raise CompanyError(f"surfaces.{name}.{server_key}", server, "must be an http:// or https:// URL", source)
    return {"mode": mode, "token_env": token_env, "server": server.rstrip("/")}


def parse_company(data: Any, *, source: Optional[str] = None, text: str = "") -> Organization:
    """Validate a decoded company document; raises :class:`CompanyError`."""
    if not isinstance(data, Mapping):
        raise CompanyError("company", data, "must be a mapping with keys " + ", ".join(_TOP_KEYS), source)
    _known(data, "", _TOP_KEYS, source)
    org = _string(data.get("org"), "org", source, _ORG, "must be 1-63 letters, digits, '.', '_' or '-'")

    providers_body = _mapping(data.get("providers"), "providers", source)
    _known(providers_body, "providers.", ("llm",), source)
    llm = providers_body.get("llm", [])
    if llm is None:
        llm = []
    if not isinstance(llm, list):
        raise CompanyError("providers.llm", llm, "must be a list (empty = a company with no model provider)", source)
    providers = []
    for i, entry in enumerate(llm):
        name = f"providers.llm[{i}]"
        entry = _mapping(entry, name, source)
        kind = entry.get("kind")
        if kind not in PROVIDER_KINDS:
            raise CompanyError(f"{name}.kind", kind, f"must be one of {', '.join(PROVIDER_KINDS)}", source)
        options = {k: v for k, v in entry.items() if k != "kind"}
        for key in options:
            if is_secret_name(str(key)):
                _refuse_inline_secret(
                    f"{name}.{key}",
                    "a secret is never written in the company file: name the environment variable "
                    "that holds it in api_key_env",
                    source,
                )
        if kind == "echo":
            _echo_options(options, name, source)
        else:
            _model_options(kind, options, name, source)
        providers.append(Provider(kind=kind, options=options))

    node_body = _mapping(data.get("node"), "node", source)
    _known(node_body, "node.", ("max_concurrent",), source)
    max_concurrent = _number(node_body.get("max_concurrent", 4), "node.max_concurrent", *MAX_CONCURRENT_RANGE, True, source)

    window = _number(
        data.get("notification_coalesce_window_seconds", 0),
        "notification_coalesce_window_seconds",
        *COALESCE_WINDOW_RANGE,
        False,
        source,
    )
    max_batch = _number(
        data.get("notification_coalesce_max_batch", 20),
        "notification_coalesce_max_batch",
        *COALESCE_MAX_BATCH_RANGE,
        True,
        source,
    )
    rate = _rate(data.get("notification_rate_limit", 0), "notification_rate_limit", source)

    mcp_servers = _mcp_servers(data.get("mcp_servers"), source)

    surfaces_body = _mapping(data.get("surfaces"), "surfaces", source)
    _known(surfaces_body, "surfaces.", SURFACES, source)
    surfaces: dict[str, Surface] = {}
    for name in SURFACES:
        body = _mapping(surfaces_body.get(name), f"surfaces.{name}", source)
        key = SURFACE_SECRET_KEYS[name]
        socket_keys = tuple(k for k in (SURFACE_SOCKET_TOKEN_KEYS.get(name), SURFACE_SERVER_KEYS.get(name)) if k)
        _known(body, f"surfaces.{name}.", (key, "verify", *(("mode", *socket_keys) if socket_keys else ())), source)
        env = body.get(key, "")
        if env:
            _string(env, f"surfaces.{name}.{key}", source, _ENV, "must be an environment variable name")
        verify = body.get("verify", True)
        if not isinstance(verify, bool):
            raise CompanyError(f"surfaces.{name}.verify", verify, "must be true or false", source)
        surfaces[name] = Surface(name=name, secret_env=env or "", verify=verify, **_surface_socket(name, body, source))

    seats_raw = data.get("seats", [])
    if not isinstance(seats_raw, list):
        raise CompanyError("seats", seats_raw, "must be a list of seats", source)
    seats: list[Seat] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(seats_raw):
        name = f"seats[{i}]"
        entry = _mapping(entry, name, source)
        _known(
            entry,
            f"{name}.",
            ("handle", "kind", "role", "display_name", "identities", "tools", "max_rounds", "turn_token_budget", "placement"),
            source,
        )
        handle = _string(
            entry.get("handle"), f"{name}.handle", source, _HANDLE, "must be 1-63 lowercase letters, digits, '_' or '-'"
        )
        if handle in seen:
            raise CompanyError(f"{name}.handle", handle, "must be unique; already used by another seat", source)
        seen[handle] = name
        kind = entry.get("kind", "agent")
        if kind not in SEAT_KINDS:
            raise CompanyError(f"{name}.kind", kind, f"must be one of {', '.join(SEAT_KINDS)}", source)
        role = entry.get("role", "") or ""
        if not isinstance(role, str):
            raise CompanyError(f"{name}.role", role, "must be a string", source)
        display = entry.get("display_name", "") or handle.capitalize()
        if not isinstance(display, str):
            raise CompanyError(f"{name}.display_name", display, "must be a string", source)
        idents = _mapping(entry.get("identities"), f"{name}.identities", source)
        _known(idents, f"{name}.identities.", SURFACES, source)
        identities = {}
        for surface, ident in idents.items():
            identities[surface] = _string(str(ident) if isinstance(ident, int) else ident, f"{name}.identities.{surface}", source)
        seats.append(
            Seat(
                handle=handle,
                kind=kind,
                role=role,
                display_name=display,
                identities=identities,
                agent_id=agent_id_for(org, handle),
                tools=_seat_tools(entry.get("tools"), f"{name}.tools", mcp_servers, source),
                max_rounds=_number(
                    entry.get("max_rounds", DEFAULT_MAX_ROUNDS), f"{name}.max_rounds", *MAX_ROUNDS_RANGE, True, source
                ),
                turn_token_budget=_number(
                    entry.get("turn_token_budget", 0), f"{name}.turn_token_budget", 0, None, True, source
                ),
                placement=_placement(entry.get("placement"), f"{name}.placement", kind, source),
            )
        )
    for surface in SURFACES:
        owners: dict[str, str] = {}
        for seat in seats:
            ident = seat.identities.get(surface)
            if ident is None:
                continue
            if ident in owners:
                raise CompanyError(
                    f"seats.{seat.handle}.identities.{surface}", ident, f"already belongs to seat {owners[ident]}", source
                )
            owners[ident] = seat.handle

    schedules_raw = data.get("schedules", [])
    if not isinstance(schedules_raw, list):
        raise CompanyError("schedules", schedules_raw, "must be a list of schedules", source)
    schedules = []
    names = set()
    for i, entry in enumerate(schedules_raw):
        name = f"schedules[{i}]"
        entry = _mapping(entry, name, source)
        _known(entry, f"{name}.", ("name", "seat", "every", "task"), source)
        sname = _string(entry.get("name"), f"{name}.name", source)
        if sname in names:
            raise CompanyError(f"{name}.name", sname, "must be unique", source)
        names.add(sname)
        seat_handle = _string(entry.get("seat"), f"{name}.seat", source)
        target = next((s for s in seats if s.handle == seat_handle), None)
        if target is None or not target.is_agent:
            agents = ", ".join(s.handle for s in seats if s.is_agent) or "none"
            raise CompanyError(f"{name}.seat", seat_handle, f"must be an agent seat of this company ({agents})", source)
        schedules.append(
            Schedule(
                name=sname,
                seat=seat_handle,
                every_s=parse_duration_s(entry.get("every"), f"{name}.every", source),
                task=_string(entry.get("task"), f"{name}.task", source),
            )
        )

    return Organization(
        org=org,
        providers=tuple(providers),
        max_concurrent=max_concurrent,
        coalesce_window_s=window,
        coalesce_max_batch=max_batch,
        rate_limit_per_s=rate,
        surfaces=surfaces,
        seats=tuple(seats),
        schedules=tuple(schedules),
        source_text=text,
        mcp_servers=mcp_servers,
    )


def parse_company_text(text: str, *, source: Optional[str] = None) -> Organization:
    """Validate the company file's text (a file's, or a revision's when ``source`` is None); raises :class:`CompanyError`."""
    data = load_yaml(text, document="company", name=source, error=CompanyError)
    return parse_company(data, source=source, text=text)


def read_company_text(path: str | Path) -> str:
    """The company file's text; unreadable, larger than the loader takes, or not UTF-8 is a :class:`CompanyError`."""
    return read_yaml_text(path, document="company", error=CompanyError)


def load_company(path: str | Path = EXAMPLE_COMPANY) -> Organization:
    return parse_company_text(read_company_text(path), source=str(path))


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
