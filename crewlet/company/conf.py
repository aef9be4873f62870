"""Typed engine settings (``stream.*``, ``node.*``), validated when they are loaded.

Sources, lowest to highest precedence: field defaults, the YAML file named by
``CREWLET_SETTINGS_FILE`` (or a mapping passed in), environment variables,
then explicit overrides (command-line flags). One exception, from the design:
the node id is ``node.id``, then ``CREWLET_NODE_ID``, then the hostname. A bad value fails the load with
a :class:`SettingsError` that names the dotted field, the value and what is
allowed, so an operator fixes it from one line instead of from a traceback
deep inside the broker.

Every knob is a dataclass field whose metadata carries its range, choices and
environment variable; adding a knob is adding a field. A field whose type is
itself a section (``stream.cluster``) is a nested mapping in the file and a
dotted name everywhere else (``stream.cluster.port``, ``CREWLET_STREAM_CLUSTER_PORT``).
A list setting (``stream.cluster.peers``, ``node.labels``) is a YAML list in the
file and a comma-separated environment variable.

One secret is not a setting: ``CREWLET_CLUSTER_SECRET``, which authenticates
the routes between clustered members, is read from the environment only, is
never part of :class:`EngineSettings` (whose repr reaches logs and tracebacks),
and is required when ``stream.cluster.peers`` is set.

The settings file and the company file are read by one guarded YAML loader
(:func:`read_yaml_text`, :func:`load_yaml`): a file past :data:`YAML_MAX_BYTES`
or not UTF-8 is refused before it is parsed, and a document nesting deeper than
:data:`YAML_MAX_DEPTH`, holding more than :data:`YAML_MAX_VALUES` values once
its aliases are expanded, or giving one key twice in a mapping is refused while
it is composed, before anything is built from it. A refusal quotes at most
:data:`~crewlet.base.jsontext.QUOTE_LIMIT` characters of a value (:func:`quote_value`),
so no value, however large or however aliased, makes a large message.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
import reprlib
import socket
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union
from urllib.parse import urlsplit

import yaml

from crewlet.base.jsontext import QUOTE_LIMIT, storable_text
from crewlet.queue.contract import Timings

log = logging.getLogger(__name__)

SETTINGS_FILE_ENV = "CREWLET_SETTINGS_FILE"
#: The shared secret of the routes between clustered embedded members (environment only, never logged).
CLUSTER_SECRET_ENV = "CREWLET_CLUSTER_SECRET"
#: Keys whose environment variable is a fallback for the file rather than an override.
ENV_YIELDS_TO_FILE = frozenset({"node.id"})
#: Old dotted names still read, each as the setting that replaced it.
RENAMED = {"delivery.ack_wait_s": "stream.ack_wait_s"}
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
#: The shortest spacing a retry may be given (a redelivery, an MCP server's restart): a spacing of
#: zero doubles to zero, and a failing message or server would spin at full speed.
MIN_BACKOFF_S = 0.01
#: The most bytes a settings or company file may hold; a larger one is refused before it is parsed.
YAML_MAX_BYTES = 1024 * 1024
#: How deep a settings or company file may nest (a mapping's value or a list's item is one level down).
#: PyYAML composes a document recursively, so a deeper one would exhaust the interpreter's stack.
YAML_MAX_DEPTH = 64
#: How many values (scalars, lists and mappings) a settings or company file may hold once every alias
#: is expanded: an alias costs what it names, so nine levels of nine aliases count as 9**9, not 81.
YAML_MAX_VALUES = 100_000
#: How much of what is allowed, and of a field's name, one refusal message carries.
ALLOWED_LIMIT = 1000
#: The tag PyYAML gives a merge key (``<<: *defaults``), whose overrides are not duplicate keys.
_YAML_MERGE_TAG = "tag:yaml.org,2002:merge"
#: A character that would end a one-line message, or hide in one.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class _Quoting(reprlib.Repr):
    """reprlib's repr sized for one line of a refusal: a few levels, a few items, and text clipped before it is quoted.

    The standard ``repr`` of a refused value is built whole before anything
    could clip it — a YAML alias bomb's expansion, a 5 MB string — so a
    refusal quotes through this instead, which never looks past its limits.
    """

    #: How much of a string nested in a list or a mapping is quoted (the value itself gets QUOTE_LIMIT).
    NESTED_STRING = 40
    #: Integers wider than this are named by their width: the repr of a huge one is slow, and refused past
    #: ``sys.get_int_max_str_digits()``.
    MAX_INT_BITS = 256

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxdict = 4
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 6
        self.maxstring = self.maxother = QUOTE_LIMIT
        self.maxlong = 60

    def repr_str(self, x: str, level: int) -> str:
        limit = self.maxstring if level == self.maxlevel else self.NESTED_STRING
        if len(x) <= limit:
            return repr(x)
        return repr(x[:limit]) + "…"

    def repr_bytes(self, x: bytes, level: int) -> str:
        return repr(x) if len(x) <= self.NESTED_STRING else repr(x[: self.NESTED_STRING]) + "…"

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > self.MAX_INT_BITS:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_QUOTING = _Quoting()


def quote_value(value: Any) -> str:
    """``value`` as a refusal quotes it: its repr, bounded to QUOTE_LIMIT characters, storable and on one line."""
    return one_line(_QUOTING.repr(value), QUOTE_LIMIT)


def one_line(text: str, limit: int) -> str:
    """``text`` clipped to ``limit`` characters, with every line break and control character written as its escape."""
    clipped = storable_text(text, limit)
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), clipped)


class FieldValueError(ValueError):
    """A configured value refused: ``<field>=<value>: <what is allowed> (<where> <source>)``.

    Settings and the company file refuse a value in the same words, so an
    operator reads one shape whichever file was wrong. The message is one
    line and bounded whatever was refused (:func:`quote_value`): the admin's
    revision form shows it, and a value crafted to make it large must not
    take the node's memory.
    """

    #: How the source is introduced in the message ("from" an env var, "in" a file).
    where = "from"

    def __init__(self, field: str, value: Any, allowed: str, source: Optional[str] = None) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        self.source = source
        message = f"{one_line(field, QUOTE_LIMIT)}={self.show(value)}: {one_line(allowed, ALLOWED_LIMIT)}"
        if source:
            message += f" ({self.where} {one_line(source, QUOTE_LIMIT)})"
        super().__init__(message)

    @staticmethod
    def show(value: Any) -> str:
        return quote_value(value)


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


def is_finite_number(value: Any) -> bool:
    """An int or a finite float, never a bool: NaN passes every range check by failing every comparison.

    An int is finite however large (``math.isfinite`` would overflow converting one past a float's range).
    """
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


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


@dataclass(frozen=True)
class ToolSettings(_Section):
    """How this node runs its seats' MCP tool servers: call and start time limits, and restart spacing.

    A tool that outlives ``call_timeout_s`` is a failed tool result the model
    sees, not a turn that hangs; a server that has not answered its handshake
    within ``start_timeout_s`` is reported unavailable and the seat's turn runs
    without it; a server that died is started again after a backoff doubling
    from ``restart_backoff_s`` (up to a minute, or that setting when larger).
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


def _parse_env(name: str, kind: type, raw: str, bounds: Optional[tuple[float, float]]) -> Any:
    """Turn an environment string into the field's type; the range is checked later, with the rest."""
    span = _span(bounds)
    text = raw.strip()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # os.environ holds undecodable bytes as lone surrogates, which no store, path or log line can carry.
        raise SettingsError(name, raw, "is not UTF-8 text") from None
    if kind is int:
        if not re.fullmatch(r"[+-]?\d+", text):
            raise SettingsError(name, raw, f"must be an integer{span}")
        return int(text)
    if kind is float:
        try:
            value = float(text)
        except ValueError:
            raise SettingsError(name, raw, f"must be a number{span}") from None
        if not math.isfinite(value):
            raise SettingsError(name, raw, f"must be a number{span}")
        return value
    if kind == Strings:
        return tuple(item.strip() for item in text.split(",") if item.strip())
    return text


# ---------------------------------------------------------------------------
# YAML files: the settings file and the company file


class YAMLRefused(yaml.YAMLError):
    """What :class:`GuardedLoader` will not build: the dotted ``field`` ("" for the whole document), its value and why."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        super().__init__(allowed)
        self.field = field
        self.value = value
        self.allowed = allowed


class _Elided(str):
    """A value shown as itself rather than quoted (``{…}`` for a mapping a refusal does not spell out)."""

    def __repr__(self) -> str:
        return str(self)


_YAMLPath = list[Union[str, int, None]]


def _dotted(path: _YAMLPath) -> str:
    """``seats[0].handle`` from the parts of a path (None, a mapping key being composed, is left out)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part is not None:
            out += f".{part}" if out else part
    return out


class GuardedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what the safe loader takes silently or cannot survive.

    The checks run while the document is composed into nodes, before any
    Python value is built, so a refused document costs no more than its text:

    * depth — past :data:`YAML_MAX_DEPTH` levels (the composer recurses once
      per level, and 20,000 levels were a ``RecursionError``);
    * aliases — an alias counts as every value it names, so a document whose
      expansion passes :data:`YAML_MAX_VALUES` is refused however few
      characters it is (nine levels of nine aliases are 387 million values),
      and an alias inside the value it names (a value containing itself) is
      refused outright;
    * duplicate keys — the safe loader keeps the last of two equal keys without
      a word; here the second is refused, naming its path and both lines (a
      merge key's overrides, ``<<: *defaults``, are not duplicates);
    * unreadable scalars — a date like ``2024-13-45`` or a decimal integer past
      Python's digit limit is a ``ValueError`` inside PyYAML, refused here as
      invalid YAML at its line.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: _YAMLPath = []
        self._values = 0
        #: id(anchored node) -> how many values it expands to, known once it is composed.
        self._expanded: dict[int, int] = {}

    def _spend(self, values: int, mark: Any) -> None:
        self._values += values
        if self._values > YAML_MAX_VALUES:
            raise YAMLRefused(
                "", None, f"holds more than {YAML_MAX_VALUES} values once its aliases are expanded (line {mark.line + 1})"
            )

    @staticmethod
    def _part(parent: Optional[yaml.Node], index: Any) -> Union[str, int, None]:
        if isinstance(index, int):
            return index
        if isinstance(index, yaml.ScalarNode):
            return str(index.value)
        if isinstance(index, yaml.Node):
            return "?"  # a mapping key that is itself a collection
        return None

    def compose_node(self, parent: Optional[yaml.Node], index: Any) -> Optional[yaml.Node]:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is PyYAML's own error
                expanded = self._expanded.get(id(target))
                if expanded is None:
                    raise YAMLRefused(
                        _dotted([*self._path, self._part(parent, index)]), _Elided(f"*{event.anchor}"),
                        f"is an alias inside the value it names (line {event.start_mark.line + 1}); a value cannot contain itself",
                    )
                self._spend(expanded, event.start_mark)
            return super().compose_node(parent, index)
        event = self.peek_event()
        if len(self._path) >= YAML_MAX_DEPTH:
            raise YAMLRefused("", None, f"nests deeper than {YAML_MAX_DEPTH} levels (line {event.start_mark.line + 1})")
        self._path.append(self._part(parent, index))
        before = self._values
        self._spend(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._path.pop()
        if event.anchor is not None and node is not None:
            self._expanded[id(node)] = self._values - before
        return node

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == _YAML_MERGE_TAG:
                continue
            line, same = key.start_mark.line + 1, (key.tag, key.value)
            if same not in first:
                first[same] = line
                continue
            if isinstance(value, yaml.ScalarNode):
                shown: Any = value.value
            else:
                shown = _Elided("[…]" if isinstance(value, yaml.SequenceNode) else "{…}")
            raise YAMLRefused(
                _dotted([*self._path, str(key.value)]), shown,
                f"is given twice, on line {first[same]} and again on line {line}; a key may appear once in a mapping",
            )
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(None, None, f"cannot read this value ({exc})", node.start_mark) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for PyYAML's own error: what it found and where (its str is several lines, with snippets)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [
            f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(what)
            for what, mark in ((exc.context, exc.context_mark), (exc.problem, exc.problem_mark))
            if what
        ]
        return "; ".join(parts) or type(exc).__name__
    if isinstance(exc, yaml.reader.ReaderError):
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return f"{exc.reason}: character {char} at position {exc.position}"
    return str(exc) or type(exc).__name__


def load_yaml(
    text: str, *, document: str, name: Optional[str], error: type[FieldValueError], where: Optional[str] = None
) -> Any:
    """The one YAML document in ``text``, read by :class:`GuardedLoader`; anything refused raises ``error``.

    A refusal about the whole document (too large, too deep, not YAML) names
    ``document`` and the file (``name``, or "text"); a refusal about one key (a
    duplicate) names its dotted path and says the file was ``where`` (default
    ``name``), the way a bad value of that key would.
    """
    shown = name or "text"
    if len(text) > YAML_MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > YAML_MAX_BYTES:
        raise error(document, shown, f"is larger than {YAML_MAX_BYTES} bytes, the most a YAML file here may be")
    loader: Optional[GuardedLoader] = None
    try:
        loader = GuardedLoader(text)  # its reader refuses a character YAML does not allow here already
        return loader.get_single_data()
    except YAMLRefused as exc:
        if exc.field:
            raise error(exc.field, exc.value, exc.allowed, where if where is not None else name) from None
        raise error(document, shown, exc.allowed) from None
    except yaml.YAMLError as exc:
        raise error(document, shown, f"is not valid YAML: {_yaml_problem(exc)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml_text(path: Union[str, Path], *, document: str, error: type[FieldValueError]) -> str:
    """A YAML file's text: refused (``error`` naming ``document`` and the path) when unreadable, too large or not UTF-8.

    At most one byte past :data:`YAML_MAX_BYTES` is read, so a huge file is
    refused without being read into memory. Line ends come back as LF, as a
    file opened in text mode reads them, so the text stored as a revision is
    the same whichever line ends the file was saved with.
    """
    shown = str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(YAML_MAX_BYTES + 1)
    except OSError as exc:
        raise error(document, shown, f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > YAML_MAX_BYTES:
        raise error(document, shown, f"is larger than {YAML_MAX_BYTES} bytes, the most a YAML file here may be")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            document, shown, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_file(path: str) -> Mapping[str, Any]:
    text = read_yaml_text(path, document=SETTINGS_FILE_ENV, error=SettingsError)
    data = load_yaml(text, document=SETTINGS_FILE_ENV, name=path, error=SettingsError)
    return {} if data is None else data


def _flatten(
    prefix: str, cls: type, body: Any, source: Optional[str], values: dict[str, tuple[Any, Optional[str]]]
) -> None:
    """One section's mapping into ``values`` under dotted names; a nested section recurses."""
    if body is None:
        return
    if not isinstance(body, Mapping):
        raise SettingsError(prefix, body, "must be a mapping", source)
    kinds = {f.name: _type_of(cls, f.name) for f in dataclasses.fields(cls)}
    for name, value in body.items():
        dotted = f"{prefix}.{name}"
        if dotted in RENAMED:
            log.warning("setting_renamed", extra={"setting": dotted, "use": RENAMED[dotted]})
            values[RENAMED[dotted]] = (value, source)
            continue
        if name not in kinds:
            listed = ", ".join(f"{prefix}.{n}" for n in kinds)
            raise SettingsError(dotted, value, f"unknown setting; known: {listed}", source)
        if _is_section(kinds[name]):
            _flatten(dotted, kinds[name], value, source, values)
        else:
            values[dotted] = (value, source)


def _build(prefix: str, cls: type, values: Mapping[str, tuple[Any, Optional[str]]]) -> Any:
    """The section ``cls`` at ``prefix`` from the dotted ``values`` (nested sections first)."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}.{f.name}"
        kind = _type_of(cls, f.name)
        if _is_section(kind):
            kwargs[f.name] = _build(dotted, kind, values)
        elif dotted in values:
            kwargs[f.name] = values[dotted][0]
    try:
        return cls(**kwargs)
    except SettingsError as exc:
        raise exc.from_source(values.get(exc.field, (None, None))[1]) from None


def cluster_secret(env: Mapping[str, str] = os.environ) -> str:
    """``CREWLET_CLUSTER_SECRET``: the routes' shared secret (``load_settings`` refuses peers without it)."""
    return env.get(CLUSTER_SECRET_ENV, "")


def load_settings(
    mapping: Optional[Mapping[str, Any]] = None,
    env: Mapping[str, str] = os.environ,
    *,
    overrides: Optional[Mapping[str, Any]] = None,
    hostname: Optional[str] = None,
) -> EngineSettings:
    """Build validated settings from a mapping (else the YAML file), the environment and overrides.

    ``mapping`` stands in for the file's contents (``{"stream": {...}, "node": {...}}``);
    when it is None the file named by ``CREWLET_SETTINGS_FILE`` is read, if set.
    ``overrides`` maps dotted names to typed values (``{"node.id": "n1"}``) and wins
    over everything. An empty environment variable counts as unset. The node id,
    when no source sets it, is derived from the hostname.
    """
    source: Optional[str] = None
    if mapping is None:
        path = env.get(SETTINGS_FILE_ENV, "")
        source = path or None
        mapping = _read_file(path) if path else {}

    sections = _sections()
    if not isinstance(mapping, Mapping):
        raise SettingsError("settings", mapping, "must be a mapping with the sections " + ", ".join(sections), source)

    # dotted name -> (value, where it came from)
    values: dict[str, tuple[Any, Optional[str]]] = {}
    for key, body in mapping.items():
        if key not in sections:
            raise SettingsError(str(key), body, f"unknown setting; known sections: {', '.join(sections)}", source)
        _flatten(str(key), sections[key], body, source, values)

    known = {dotted: (f, kind) for dotted, f, kind in known_settings()}
    for dotted, (f, kind) in known.items():
        if dotted in ENV_YIELDS_TO_FILE and dotted in values:
            continue  # design: node.id, then CREWLET_NODE_ID, then the default
        for var in (f.metadata.get("env"), *f.metadata.get("env_aliases", ())):
            raw = env.get(var, "") if var else ""
            if raw == "":
                continue
            if var != f.metadata.get("env"):
                log.warning("setting_env_renamed", extra={"env": var, "use": f.metadata.get("env")})
            try:
                values[dotted] = (_parse_env(dotted, kind, raw, f.metadata.get("bounds")), var)
            except SettingsError as exc:
                raise exc.from_source(var) from None
            break

    for given, value in (overrides or {}).items():
        dotted = RENAMED.get(given, given)
        if dotted not in known:
            raise SettingsError(dotted, value, f"unknown setting; known: {', '.join(known)}", "overrides")
        values[dotted] = (value, "command line")

    built: dict[str, Any] = {name: _build(name, cls, values) for name, cls in sections.items()}
    secret = env.get(CLUSTER_SECRET_ENV, "")
    stream = typing.cast(StreamSettings, built["stream"])
    if stream.cluster.peers and not secret:
        raise SettingsError(
            CLUSTER_SECRET_ENV, "(unset)",
            "required when stream.cluster.peers is set: the same secret on every member authenticates their routes",
        )
    node = typing.cast(NodeSettings, built["node"])
    if not node.id:
        built["node"] = dataclasses.replace(node, id=default_node_id(hostname))
    return EngineSettings(**built)
