"""Typed engine settings (``stream.*``, ``node.*``, ``delivery.*``, ...), validated whenever a section is built.

Every knob is a dataclass field whose metadata carries its range, choices and
environment variable; adding a knob is adding a field. A field whose type is
itself a section (``stream.cluster``) is a nested mapping in the file and a
dotted name everywhere else (``stream.cluster.port``, ``CREWLET_STREAM_CLUSTER_PORT``).
A list setting (``stream.cluster.peers``, ``node.labels``) is a YAML list in the
file and a comma-separated environment variable.

A bad value is a :class:`SettingsError` that names the dotted field, the value
and what is allowed, so an operator fixes it from one line instead of from a
traceback deep inside the broker. Where the values come from (the settings
file, the environment, the command line) is :mod:`crewlet.company.loading`.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import socket
import typing
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import urlsplit

from crewlet.company.refusal import FieldValueError, is_finite_number, quote_value
from crewlet.queue import topics
from crewlet.queue.contract import Timings

NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
PEER_PATTERN = re.compile(r"(?P<host>[^\s:/@]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")
STREAM_TYPES = ("embedded", "nats")
URL_SCHEMES = ("nats", "tls")
#: Stream replica counts JetStream can keep a quorum with.
REPLICA_CHOICES = (1, 3, 5)
#: The type of a list setting (a YAML list, or a comma-separated environment variable).
Strings = tuple[str, ...]
#: How long a turn a person stopped may take to reach its next round before it is cancelled where it is
#: (``node.stop_grace_s``): longer than a tool call may take (``tools.call_timeout_s``), so only a round
#: that would never end — a hung provider — is cut.
STOP_GRACE_S = 120.0
#: How long a turn may go without round progress — a provider's answer or a tool's result — before it is a
#: ``stall`` guard breach (``node.turn_stall_s``): longer than a round's chain takes with its retries at the
#: defaults (each entry 60 s × 3 calls plus its waits) and than a tool call may take.
TURN_STALL_S = 900.0
#: The shortest spacing a retry may be given (a redelivery, an MCP server's restart): a spacing of
#: zero doubles to zero, and a failing message or server would spin at full speed.
MIN_BACKOFF_S = 0.01
#: How often a node reports the token budgets' meters and looks again at the seats a spent budget holds.
BUDGET_METERS_EVERY_S = 60.0


class SettingsError(FieldValueError):
    """A setting that cannot be used: ``<field>=<value>: <what is allowed>``."""

    @staticmethod
    def show(value: Any) -> str:
        return _show(value)

    def from_source(self, source: Optional[str]) -> SettingsError:
        """The same error, saying where the value came from (a file, an env var, a flag)."""
        if not source or self.source:
            return self
        return SettingsError(self.field, self.value, self.allowed, source)


def _show(value: Any) -> str:
    """How a value reads in a message: numbers plainly (0, 720.5), everything else as its bounded repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return quote_value(value)


def redact_url(url: str) -> str:
    """``url`` without its credentials (``nats://user:***@host``), safe to log."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***" if parts.password is not None else "***"
    return parts._replace(netloc=f"{user}@{host}").geturl()


def _span(bounds: Optional[tuple[float, float]]) -> str:
    return f" between {_show(bounds[0])} and {_show(bounds[1])}" if bounds else ""


def setting(
    default: Any,
    *,
    env: Optional[str] = None,
    env_aliases: tuple[str, ...] = (),
    bounds: Optional[tuple[float, float]] = None,
    choices: Optional[tuple[Any, ...]] = None,
    doc: str = "",
) -> Any:
    """A settings field: its default plus what validation and the env loader need to know.

    ``env_aliases`` are older variable names still read when ``env`` is unset.
    """
    return field(
        default=default,
        metadata={"env": env, "env_aliases": env_aliases, "bounds": bounds, "choices": choices, "doc": doc},
    )


def section(cls: type) -> Any:
    """A field holding a nested section (``stream.cluster``), defaulting to that section's defaults."""
    return field(default_factory=cls)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_of(cls: type, name: str) -> type:
    return _hints(cls)[name]


def _check_field(section: str, f: dataclasses.Field, cls: type, value: Any) -> Any:
    """Type-, range- and choice-check one value; returns it normalised (an int for a float field becomes float)."""
    name = f"{section}.{f.name}"
    kind = _type_of(cls, f.name)
    bounds = f.metadata.get("bounds")
    choices = f.metadata.get("choices")
    span = _span(bounds)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(name, value, f"must be an integer{span}")
    elif kind is float:
        if not is_finite_number(value):
            raise SettingsError(name, value, f"must be a number{span}")
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            raise SettingsError(name, value, "must be a string")
    elif kind == Strings:
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise SettingsError(name, value, "must be a list of strings")
        value = tuple(value)
    elif _is_section(kind):
        if not isinstance(value, kind):
            raise SettingsError(name, value, "must be a mapping")
        return value
    if choices and value not in choices:
        raise SettingsError(name, value, f"must be one of {', '.join(str(c) for c in choices)}")
    if bounds and not bounds[0] <= value <= bounds[1]:
        raise SettingsError(name, value, f"must be{span}")
    return value


def _is_section(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, _Section)


class _Section:
    """Validation shared by every settings section; runs on construction, however constructed."""

    SECTION = ""
    # Every section is a dataclass; this tells the type checker so (dataclasses.fields accepts it).
    __dataclass_fields__: typing.ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = _check_field(self.SECTION, f, type(self), getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Rules that involve more than one field, or more than a range."""


def _check_name(name: str, value: str) -> None:
    """A node id or cluster name (empty passes: not chosen)."""
    if value and not NODE_ID_PATTERN.fullmatch(value):
        raise SettingsError(name, value, "must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit")


def _check_items(name: str, values: Strings, valid: typing.Callable[[str], bool], what: str, noun: str) -> None:
    """Each of a list setting's values ``valid`` (else "'x' is not <what>"), and none twice."""
    for value in values:
        if not valid(value):
            raise SettingsError(name, list(values), f"{quote_value(value)} is not {what}")
    if len(set(values)) != len(values):
        raise SettingsError(name, list(values), f"must not name a {noun} twice")


def _peer(value: str) -> Optional[tuple[str, int]]:
    """``host:port`` as (host, port), or None when it is not one."""
    m = PEER_PATTERN.fullmatch(value)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        return None
    return m["host"], int(m["port"])


@dataclass(frozen=True)
class ClusterSettings(_Section):
    """This node's embedded broker as one member of a JetStream cluster (empty ``name``: a lone broker)."""

    SECTION = "stream.cluster"

    name: str = setting("", env="CREWLET_STREAM_CLUSTER_NAME", doc="the cluster's name, the same on every member; empty: a lone broker")
    host: str = setting("0.0.0.0", env="CREWLET_STREAM_CLUSTER_HOST", doc="the address this member's route listener binds")
    port: int = setting(6222, env="CREWLET_STREAM_CLUSTER_PORT", bounds=(1, 65535), doc="this member's route port")
    peers: Strings = setting((), env="CREWLET_STREAM_CLUSTER_PEERS", doc="host:port of every other member's route listener")
    form_timeout_s: float = setting(
        60.0, env="CREWLET_STREAM_CLUSTER_FORM_TIMEOUT_S", bounds=(1, 3600),
        doc="how long start-up waits for the cluster to elect its JetStream meta leader",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.name)

    @property
    def members(self) -> int:
        """How many members the cluster has: this one and its peers."""
        return 1 + len(self.peers)

    def peer_addresses(self) -> list[tuple[str, int]]:
        """Each peer as (host, port); the values were checked when the settings were made."""
        return [typing.cast(tuple[str, int], _peer(p)) for p in self.peers]

    def check(self) -> None:
        _check_name("stream.cluster.name", self.name)
        if self.peers and not self.name:
            raise SettingsError("stream.cluster.name", self.name, "required when stream.cluster.peers is set")
        if self.name and not self.peers:
            # nats-server itself refuses a JetStream cluster with no route to another member, but only once
            # started, and in its own words; a lone broker is the empty name.
            raise SettingsError(
                "stream.cluster.name", self.name,
                "needs stream.cluster.peers: a JetStream cluster has at least one other member to route to "
                "(leave stream.cluster.name empty for a lone broker)",
            )
        if not self.host or any(c.isspace() for c in self.host):
            raise SettingsError("stream.cluster.host", self.host, "must be an address to listen on (0.0.0.0, 127.0.0.1, a host name)")
        _check_items("stream.cluster.peers", self.peers, lambda p: _peer(p) is not None, "host:port (a port from 1 to 65535)", "peer")


@dataclass(frozen=True)
class StreamSettings(_Section):
    """Where the broker runs and how long the event stream keeps history."""

    SECTION = "stream"

    type: str = setting(
        "embedded", env="CREWLET_STREAM_TYPE", choices=STREAM_TYPES,
        doc="embedded: a child nats-server on loopback; nats: dial stream.url",
    )
    url: str = setting(
        "", env="CREWLET_STREAM_URL",
        doc="nats://host:port or tls://host:port, several comma-separated; required when stream.type is nats",
    )
    store_dir: str = setting(
        "", env="CREWLET_STREAM_STORE_DIR",
        doc="embedded broker's JetStream directory; empty keeps streams in memory",
    )
    event_retention_hours: float = setting(
        720.0, env="CREWLET_EVENT_RETENTION_HOURS", bounds=(1, 8760),
        doc="age bound of CREWLET_EVENTS and CREWLET_DLQ",
    )
    replicas: int = setting(
        1, env="CREWLET_STREAM_REPLICAS", choices=REPLICA_CHOICES,
        doc="copies of every stream and durable consumer; never more than the cluster's members",
    )
    ack_wait_s: float = setting(
        Timings.ack_wait_s, env="CREWLET_STREAM_ACK_WAIT_S", env_aliases=("CREWLET_DELIVERY_ACK_WAIT_S",), bounds=(5, 86400),
        doc="how long a fetched message may go unacknowledged before the broker redelivers it",
    )
    monitor_port: int = setting(
        0, env="CREWLET_STREAM_MONITOR_PORT", bounds=(0, 65535),
        doc="the embedded broker's monitoring endpoint (/varz, /jsz) on 127.0.0.1 at this port; 0 leaves it off",
    )
    max_consumers: int = setting(
        topics.DEFAULT_MAX_CONSUMERS, env="CREWLET_STREAM_MAX_CONSUMERS", bounds=(2, 1_000_000),
        doc="durable consumers each engine stream may hold; every agent seat needs room for two on CREWLET_AGENT",
    )
    cluster: ClusterSettings = section(ClusterSettings)

    def urls(self) -> list[str]:
        """The servers ``stream.url`` names (comma-separated), in order."""
        return [u.strip() for u in self.url.split(",") if u.strip()]

    def check(self) -> None:
        if self.type == "nats" and not self.url:
            raise SettingsError("stream.url", self.url, "required when stream.type is nats (nats://host:port or tls://host:port)")
        for url in self.urls():
            shown = redact_url(url)  # an error message ends up in logs: never the password
            parts = urlsplit(url)
            try:
                parts.port  # noqa: B018 - raises on a malformed port
            except ValueError:
                raise SettingsError("stream.url", shown, "has an invalid port") from None
            if parts.scheme not in URL_SCHEMES or not parts.hostname:
                raise SettingsError("stream.url", shown, "must start with nats:// or tls:// and name a host")
        if self.cluster.enabled:
            if self.type != "embedded":
                raise SettingsError(
                    "stream.cluster.name", self.cluster.name,
                    "applies to the embedded broker only (stream.type embedded); with stream.type nats the cluster is the one stream.url names",
                )
            if not self.store_dir:
                raise SettingsError(
                    "stream.store_dir", self.store_dir,
                    "required when stream.cluster is set: a member's replicated streams and raft log must survive its restart",
                )
        if self.type == "embedded" and self.replicas > self.cluster.members:
            members = self.cluster.members
            allowed = ", ".join(str(c) for c in REPLICA_CHOICES if c <= members)
            if not self.cluster.enabled:
                reason = f"a lone embedded broker keeps one copy; allowed: {allowed} (stream.cluster makes this node one member of a cluster)"
            else:
                reason = (
                    f"more than the cluster's {members} members (this node and its {members - 1} stream.cluster.peers); "
                    f"allowed: {allowed}"
                )
            raise SettingsError("stream.replicas", self.replicas, reason)


@dataclass(frozen=True)
class NodeSettings(_Section):
    """This process's identity in the fleet and how much work it runs at once."""

    SECTION = "node"

    id: str = setting(
        "", env="CREWLET_NODE_ID",
        doc="stamped on every event this node publishes; empty derives it from the hostname",
    )
    max_concurrent: int = setting(
        4, env="CREWLET_NODE_MAX_CONCURRENT", bounds=(1, 64),
        doc="turns this node runs at the same time",
    )
    stop_grace_s: float = setting(
        STOP_GRACE_S, env="CREWLET_NODE_STOP_GRACE_S", bounds=(0.1, 3600),
        doc="how long a turn a person stopped may take to reach its next round before it is cancelled where it is",
    )
    turn_stall_s: float = setting(
        TURN_STALL_S, env="CREWLET_NODE_TURN_STALL_S", bounds=(0.1, 86400),
        doc="how long a turn may go without a provider's answer or a tool's result before it fails as a stall guard breach",
    )
    budget_meters_every_s: float = setting(
        BUDGET_METERS_EVERY_S, env="CREWLET_NODE_BUDGET_METERS_EVERY_S", bounds=(0.05, 3600),
        doc="how often this node reports budget_meters and looks again at the seats a spent token budget holds",
    )
    labels: Strings = setting(
        (), env="CREWLET_NODE_LABELS",
        doc="what this node offers placement (gpu, eu); a seat's placement may require labels",
    )

    def check(self) -> None:
        # Empty means "not chosen yet"; load_settings resolves it from the hostname.
        _check_name("node.id", self.id)
        _check_items(
            "node.labels", self.labels, lambda v: LABEL_PATTERN.fullmatch(v) is not None,
            "a label: 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit", "label",
        )


@dataclass(frozen=True)
class DeliverySettings(_Section):
    """How the queue spaces redeliveries of failed messages.

    The defaults are the queue's production :class:`Timings`; an operator may
    tune them, and the fault suite shrinks them so that a whole delivery budget
    (25 deliveries) is seen in seconds through the same code ``up`` runs. The
    ack clock, once ``delivery.ack_wait_s``, is ``stream.ack_wait_s``.
    """

    SECTION = "delivery"

    backoff_base_s: float = setting(
        Timings.backoff_base_s, env="CREWLET_DELIVERY_BACKOFF_BASE_S", bounds=(MIN_BACKOFF_S, 3600),
        doc="spacing before the first redelivery of a failed message; doubles per failure",
    )
    backoff_cap_s: float = setting(
        Timings.backoff_cap_s, env="CREWLET_DELIVERY_BACKOFF_CAP_S", bounds=(MIN_BACKOFF_S, 3600),
        doc="the most a redelivery's spacing grows to",
    )
    provider_retry_scale: float = setting(
        1.0, env="CREWLET_DELIVERY_PROVIDER_RETRY_SCALE", bounds=(0.001, 1),
        doc="multiplies every wait before a model provider's call is retried (its Retry-After and the backoff alike)",
    )


@dataclass(frozen=True)
class ToolSettings(_Section):
    """How this node runs its seats' MCP tool servers: call and start time limits, and restart spacing.

    A tool that outlives ``call_timeout_s`` is a failed tool result the model
    sees, not a turn that hangs; a server that has not answered its handshake
    within ``start_timeout_s`` is reported unavailable and the seat's turn runs
    without it; a server that died is started again after a backoff doubling
    from ``restart_backoff_s`` (up to a minute, or that setting when larger).
    The chat working indicator a turn shows (``seats.indicator``) is
    best-effort: each of its calls gives up after ``indicator_timeout_s``,
    and Mattermost's typing event, which clients show for a few seconds, is
    sent again every ``typing_every_s`` while the turn runs.
    """

    SECTION = "tools"

    call_timeout_s: float = setting(
        60.0, env="CREWLET_TOOLS_CALL_TIMEOUT_S", bounds=(0.01, 3600),
        doc="the longest one MCP tool call may take before it is a failed tool result",
    )
    start_timeout_s: float = setting(
        30.0, env="CREWLET_TOOLS_START_TIMEOUT_S", bounds=(0.1, 600),
        doc="the longest an MCP server may take to start and list its tools",
    )
    restart_backoff_s: float = setting(
        1.0, env="CREWLET_TOOLS_RESTART_BACKOFF_S", bounds=(MIN_BACKOFF_S, 3600),
        doc="wait before restarting an MCP server that died or would not start; doubles per failed start, to a minute",
    )
    indicator_timeout_s: float = setting(
        10.0, env="CREWLET_TOOLS_INDICATOR_TIMEOUT_S", bounds=(0.1, 120),
        doc="the longest one call of the chat working indicator (a reaction, a typing event) may take",
    )
    typing_every_s: float = setting(
        4.0, env="CREWLET_TOOLS_TYPING_EVERY_S", bounds=(0.05, 60),
        doc="how often a running turn sends Mattermost's typing event again (clients show it for a few seconds)",
    )


@dataclass(frozen=True)
class HistorySettings(_Section):
    """How long a history read waits for the fleet's other nodes before naming the ones that did not answer."""

    SECTION = "history"

    fleet_read_budget_s: float = setting(
        2.0, env="CREWLET_FLEET_READ_BUDGET_S", bounds=(0.05, 60),
        doc="how long a history read waits for every live node's answer",
    )


@dataclass(frozen=True)
class FleetSettings(_Section):
    """How long a node's leases (its presence, its seats, its duties) outlive its last renewal.

    A node renews at a third of the TTL, so two missed renewals are survived;
    a node killed outright loses its seats to the others within one TTL plus
    one placement sweep. Shorter moves seats sooner after a crash and costs
    more coordination-store writes.
    """

    SECTION = "fleet"

    lease_ttl_s: float = setting(
        15.0, env="CREWLET_FLEET_LEASE_TTL_S", bounds=(5, 300),
        doc="how long a lease lasts past its last renewal; renewed every third of it",
    )


@dataclass(frozen=True)
class EngineSettings:
    """Everything the engine is configured with."""

    stream: StreamSettings = field(default_factory=StreamSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    tools: ToolSettings = field(default_factory=ToolSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)

    def timings(self) -> Timings:
        """The queue's :class:`Timings`: the redelivery spacing and the ack clock."""
        return Timings(
            backoff_base_s=self.delivery.backoff_base_s,
            backoff_cap_s=self.delivery.backoff_cap_s,
            ack_wait_s=self.stream.ack_wait_s,
        )


def _sections() -> dict[str, type[_Section]]:
    return {f.name: _type_of(EngineSettings, f.name) for f in dataclasses.fields(EngineSettings)}


def _leaves(prefix: str, cls: type) -> list[tuple[str, dataclasses.Field, type]]:
    out: list[tuple[str, dataclasses.Field, type]] = []
    for f in dataclasses.fields(cls):
        kind = _type_of(cls, f.name)
        if _is_section(kind):
            out.extend(_leaves(f"{prefix}.{f.name}", kind))
        else:
            out.append((f"{prefix}.{f.name}", f, kind))
    return out


def known_settings() -> list[tuple[str, dataclasses.Field, type]]:
    """Every setting as (dotted name, field, python type), in declaration order (docs, tests).

    A nested section's settings are listed under their full dotted names
    (``stream.cluster.port``); the section itself is not a setting.
    """
    out = []
    for name, cls in _sections().items():
        out.extend(_leaves(name, cls))
    return out


def default_node_id(hostname: Optional[str] = None) -> str:
    """A node id from the short hostname, reduced to the characters a node id allows."""
    host = (hostname if hostname is not None else socket.gethostname()).split(".")[0]
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", host).strip("-_")[:63].rstrip("-_")
    return slug or "node"
