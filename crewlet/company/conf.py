"""Typed engine settings (``stream.*``, ``node.*``, ``delivery.*``, ...): frozen pydantic models, validated whenever built.

Every knob is a field: pydantic checks its type and range (``ge``/``le``), a
:class:`Check` its choices or pattern, and the field carries its environment
variable; adding a knob is adding a field. A field whose type is itself a
section (``stream.cluster``) is a nested mapping in the file and a dotted name
everywhere else (``stream.cluster.port``, ``CREWLET_STREAM_CLUSTER_PORT``). A
list setting (``stream.cluster.peers``, ``node.labels``) is a YAML list in the
file and a comma-separated environment variable.

A bad value is a :class:`SettingsError` naming the dotted field, the value and
what is allowed: pydantic's ValidationError is translated into it in one place
(:func:`_refusal`), never shown. Where values come from is :mod:`crewlet.company.loading`.
"""
from __future__ import annotations

import re
import socket
import typing
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Mapping, Optional, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonDict

from crewlet.company.refusal import Check, FieldValueError, locate, one_of, quote_value
from crewlet.queue import topics
from crewlet.queue.contract import Timings

NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
PEER_PATTERN = re.compile(r"(?P<host>[^\s:/@]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")
STREAM_TYPES = ("embedded", "nats")
URL_SCHEMES = ("nats", "tls")
#: What a member's leafnode URL in ``stream.leaf.urls`` may start with: a member's leafnode listener is plain TCP, as its routes are.
LEAF_URL_SCHEMES = ("nats-leaf",)
LEAF_URL_WORDS = "a member's leafnode URL: nats-leaf://host:port, with no credentials (CREWLET_CLUSTER_SECRET is the credential)"
NAME_WORDS = "must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit"
LABEL_WORDS = "a label: 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit"
LISTEN_WORDS = "must be an address to listen on (0.0.0.0, 127.0.0.1, a host name)"
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


def _span(bounds: Optional[Sequence[float]]) -> str:
    return f" between {_show(bounds[0])} and {_show(bounds[1])}" if bounds else ""


def setting(
    default: Any, *, env: str, env_aliases: tuple[str, ...] = (), bounds: Optional[tuple[float, float]] = None, doc: str = ""
) -> Any:
    """A settings field: its default, its range (pydantic's ``ge``/``le``), its variable and older names still read."""
    low, high = bounds or (None, None)
    extra: JsonDict = {"env": env, "env_aliases": list(env_aliases), "bounds": list(bounds) if bounds else None}
    return Field(default, ge=low, le=high, description=doc, json_schema_extra=extra)


def _items(valid: typing.Callable[[str], bool], what: str, noun: str) -> Check:
    """A list setting's rule: each value ``valid`` (else "'x' is not <what>"), and none twice."""
    def problem(values: Strings) -> Optional[str]:
        bad = [v for v in values if not valid(v)]
        twice = len(set(values)) < len(values)
        return f"{quote_value(bad[0])} is not {what}" if bad else f"must not name a {noun} twice" if twice else None
    return Check(problem)


def _leaf_url(value: str) -> bool:
    """Whether ``value`` is a member's leafnode URL with a host, a valid port and no credentials."""
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        return False
    return (
        parts.scheme in LEAF_URL_SCHEMES and bool(parts.hostname) and port is not None
        and "@" not in parts.netloc and parts.path in ("", "/") and not parts.query
    )


def _peer(value: str) -> Optional[tuple[str, int]]:
    """``host:port`` as (host, port), or None when it is not one."""
    m = PEER_PATTERN.fullmatch(value)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        return None
    return m["host"], int(m["port"])


#: A list setting's field type: a list (YAML's) or a tuple of strings, held as a tuple.
_StringList = Annotated[Strings, BeforeValidator(lambda value: tuple(value) if isinstance(value, list) else value)]
#: A node id or cluster name (empty passes: not chosen).
_Name = Annotated[str, Check(lambda v: NAME_WORDS if v and not NODE_ID_PATTERN.fullmatch(v) else None)]
_Peers = Annotated[_StringList, _items(lambda p: _peer(p) is not None, "host:port (a port from 1 to 65535)", "peer")]
_Labels = Annotated[_StringList, _items(lambda v: LABEL_PATTERN.fullmatch(v) is not None, LABEL_WORDS, "label")]
_Listen = Annotated[str, Check(lambda v: None if v and not any(c.isspace() for c in v) else LISTEN_WORDS)]
#: What a value of the wrong type is told, by the field's type.
_TYPE_WORDS: dict[Any, str] = {
    int: "must be an integer", float: "must be a number", str: "must be a string", Strings: "must be a list of strings",
}


def _section_type(info: FieldInfo) -> Optional[type[_Section]]:
    """The section a field holds (``stream.cluster``), or None for a setting."""
    kind = info.annotation
    return kind if isinstance(kind, type) and issubclass(kind, _Section) else None


def _refusal(cls: type[_Section], data: Mapping[str, Any], exc: ValidationError) -> SettingsError:
    """pydantic's first error as the one-line refusal: the dotted field, the value as given (a list item's: the
    list), what is allowed. A validator that knows its words raises the refusal itself, carried back by pydantic."""
    found = locate(cls, data, exc, into_items=False)
    if isinstance(found.cause, SettingsError):
        return found.cause
    owner = typing.cast(type[_Section], found.owner)
    dotted, value, info = ".".join(filter(None, [cls.SECTION, *map(str, found.path)])), found.value, found.field
    if info is None and found.path:
        known = (".".join(filter(None, [owner.SECTION, n])) for n in owner.model_fields)
        return SettingsError(dotted, value, "unknown setting; known: " + ", ".join(known))
    if info is None or found.kind == "model_type":
        return SettingsError(dotted, value, "must be a mapping")
    span = _span(typing.cast(dict[str, Any], info.json_schema_extra)["bounds"])
    if found.kind in ("greater_than_equal", "less_than_equal"):
        return SettingsError(dotted, value, f"must be{span}")
    if found.kind == "check":
        return SettingsError(dotted, value, found.context["allowed"])
    words = _TYPE_WORDS.get(info.annotation, "must be valid")
    return SettingsError(dotted, value, words + span if info.annotation in (int, float) else words)


class _Section(BaseModel):
    """A settings section, validated however it is built; ``SECTION`` (``stream.cluster``) prefixes its refusals."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False)
    SECTION: ClassVar[str] = ""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _refusal(type(self), data, exc) from None


class ClusterSettings(_Section):
    """This node's embedded broker as one member of a JetStream cluster (empty ``name``: a lone broker)."""

    SECTION: ClassVar[str] = "stream.cluster"

    name: _Name = setting("", env="CREWLET_STREAM_CLUSTER_NAME", doc="the cluster's name, the same on every member; empty: a lone broker")
    host: _Listen = setting("0.0.0.0", env="CREWLET_STREAM_CLUSTER_HOST", doc="the address this member's route listener binds")
    port: int = setting(6222, env="CREWLET_STREAM_CLUSTER_PORT", bounds=(1, 65535), doc="this member's route port")
    peers: _Peers = setting((), env="CREWLET_STREAM_CLUSTER_PEERS", doc="host:port of every other member's route listener")
    form_timeout_s: float = setting(
        60.0, env="CREWLET_STREAM_CLUSTER_FORM_TIMEOUT_S", bounds=(1, 3600),
        doc="how long start-up waits for the cluster to elect its JetStream meta leader",
    )
    leaf_port: int = setting(
        0, env="CREWLET_STREAM_CLUSTER_LEAF_PORT", bounds=(0, 65535),
        doc="this member's leafnode listener on stream.cluster.host, which leaf nodes dial; 0 leaves it off",
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

    @model_validator(mode="after")
    def _members(self) -> ClusterSettings:
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
        if self.leaf_port and not self.name:
            raise SettingsError("stream.cluster.leaf_port", self.leaf_port, "needs stream.cluster.name: only a cluster member accepts leaf nodes")
        if self.leaf_port and self.leaf_port == self.port:
            raise SettingsError("stream.cluster.leaf_port", self.leaf_port, "must differ from stream.cluster.port (the route port)")
        return self


class LeafSettings(_Section):
    """This node's embedded broker as a leaf node of the members' cluster: no JetStream of its own (empty ``urls``: not a leaf)."""

    SECTION: ClassVar[str] = "stream.leaf"

    urls: _StringList = setting(
        (), env="CREWLET_STREAM_LEAF_URLS",
        doc="every member's leafnode URL (nats-leaf://host:stream.cluster.leaf_port); the leaf moves to another when one dies",
    )
    attach_timeout_s: float = setting(
        60.0, env="CREWLET_STREAM_LEAF_ATTACH_TIMEOUT_S", bounds=(1, 3600),
        doc="how long start-up waits for the members' JetStream to answer across the leaf connection",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.urls)

    @field_validator("urls")
    @classmethod
    def _members(cls, urls: Strings) -> Strings:
        shown = [redact_url(u) for u in urls]  # a refusal ends up in logs: never a password someone put in a URL
        bad = [s for u, s in zip(urls, shown) if not _leaf_url(u)]
        if bad:
            raise SettingsError("stream.leaf.urls", shown, f"{quote_value(bad[0])} is not {LEAF_URL_WORDS}")
        if len(set(urls)) < len(urls):
            raise SettingsError("stream.leaf.urls", shown, "must not name a URL twice")
        return urls

    def member_addresses(self) -> list[tuple[str, int]]:
        """Each member's leafnode listener as (host, port); the URLs were checked when the settings were made."""
        return [(typing.cast(str, urlsplit(u).hostname), typing.cast(int, urlsplit(u).port)) for u in self.urls]


class StreamSettings(_Section):
    """Where the broker runs and how long the event stream keeps history."""

    SECTION: ClassVar[str] = "stream"

    type: Annotated[str, one_of(*STREAM_TYPES)] = setting(
        "embedded", env="CREWLET_STREAM_TYPE",
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
        topics.DEFAULT_EVENT_RETENTION_HOURS, env="CREWLET_EVENT_RETENTION_HOURS", bounds=(1, 8760),
        doc="age bound of CREWLET_EVENTS and CREWLET_DLQ",
    )
    replicas: Annotated[int, one_of(*REPLICA_CHOICES)] = setting(
        1, env="CREWLET_STREAM_REPLICAS",
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
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    leaf: LeafSettings = Field(default_factory=LeafSettings)

    def urls(self) -> list[str]:
        """The servers ``stream.url`` names (comma-separated), in order."""
        return [u.strip() for u in self.url.split(",") if u.strip()]

    @field_validator("url")
    @classmethod
    def _servers(cls, value: str) -> str:
        for url in filter(None, map(str.strip, value.split(","))):
            shown = redact_url(url)  # an error message ends up in logs: never the password
            parts = urlsplit(url)
            try:
                parts.port  # noqa: B018 - raises on a malformed port
            except ValueError:
                raise SettingsError("stream.url", shown, "has an invalid port") from None
            if parts.scheme not in URL_SCHEMES or not parts.hostname:
                raise SettingsError("stream.url", shown, "must start with nats:// or tls:// and name a host")
        return value

    @model_validator(mode="after")
    def _placed(self) -> StreamSettings:
        if self.type == "nats" and not self.url:
            raise SettingsError("stream.url", self.url, "required when stream.type is nats (nats://host:port or tls://host:port)")
        if self.leaf.enabled:
            self._leaf_alone()
        elif self.cluster.enabled:
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
        if self.type == "embedded" and not self.leaf.enabled and self.replicas > self.cluster.members:
            members = self.cluster.members
            allowed = ", ".join(str(c) for c in REPLICA_CHOICES if c <= members)
            reason = (
                f"more than the cluster's {members} members (this node and its {members - 1} stream.cluster.peers); allowed: {allowed}"
                if self.cluster.enabled
                else f"a lone embedded broker keeps one copy; allowed: {allowed} (stream.cluster makes this node one member of a cluster)"
            )
            raise SettingsError("stream.replicas", self.replicas, reason)
        return self


    def _leaf_alone(self) -> None:
        """A leaf keeps nothing of the broker's: no cluster membership, no store, no more copies than the members it names."""
        shown = list(self.leaf.urls)
        if self.type != "embedded":
            raise SettingsError(
                "stream.leaf.urls", shown, "applies to the embedded broker only (stream.type embedded): a leaf is this node's own nats-server dialling the members",
            )
        if self.cluster.enabled:
            raise SettingsError(
                "stream.cluster.name", self.cluster.name,
                "must be empty on a leaf (stream.leaf.urls is set): a leaf dials the members and is not one of them",
            )
        if self.store_dir:
            raise SettingsError(
                "stream.store_dir", self.store_dir,
                "must be empty on a leaf (stream.leaf.urls is set): a leaf runs no JetStream and keeps no streams, the members do",
            )
        members = len(self.leaf.urls)
        if self.replicas > members:
            allowed = ", ".join(str(c) for c in REPLICA_CHOICES if c <= members)
            raise SettingsError(
                "stream.replicas", self.replicas,
                f"more than the {members} members stream.leaf.urls names; set the members' stream.replicas (allowed: {allowed})",
            )


class NodeSettings(_Section):
    """This process's identity in the fleet and how much work it runs at once."""

    SECTION: ClassVar[str] = "node"

    id: _Name = setting(  # empty: not chosen yet; load_settings resolves it from the hostname
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
    labels: _Labels = setting(
        (), env="CREWLET_NODE_LABELS",
        doc="what this node offers placement (gpu, eu); a seat's placement may require labels",
    )
    data: bool = setting(
        True, env="CREWLET_NODE_DATA",
        doc="keeps an event store of its own; false makes a stateless node, whose events a data node keeps in custody batches",
    )


class DeliverySettings(_Section):
    """How the queue spaces redeliveries of failed messages.

    The defaults are the queue's production :class:`Timings`; an operator may
    tune them, and the fault suite shrinks them so that a whole delivery budget
    (25 deliveries) is seen in seconds through the same code ``up`` runs. The
    ack clock, once ``delivery.ack_wait_s``, is ``stream.ack_wait_s``.
    """

    SECTION: ClassVar[str] = "delivery"

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

    SECTION: ClassVar[str] = "tools"

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


class HistorySettings(_Section):
    """How long a history read waits for the fleet's other nodes, and how a stateless node's events reach a data node.

    A stateless node (``node.data: false``) hands its rows to a live data node
    in custody batches (:mod:`eventstore.custody`); the data node keeps them
    marked unsettled until its settle pass reads the batch's claim, and fleet
    reads hold such a row once meanwhile (the ``kept`` question).
    """

    SECTION: ClassVar[str] = "history"

    fleet_read_budget_s: float = setting(
        2.0, env="CREWLET_FLEET_READ_BUDGET_S", bounds=(0.05, 60),
        doc="how long a history read waits for every live node's answer",
    )
    custody_timeout_s: float = setting(
        5.0, env="CREWLET_HISTORY_CUSTODY_TIMEOUT_S", bounds=(0.05, 120),
        doc="how long a stateless node waits for a data node to keep a custody batch before it claims a second keeper",
    )
    custody_settle_s: float = setting(
        60.0, env="CREWLET_HISTORY_CUSTODY_SETTLE_S", bounds=(0.05, 3600),
        doc="how often a data node settles the custody batches it has written: kept for good when the claim names it, dropped when it names another",
    )


class FleetSettings(_Section):
    """How long a node's leases (its presence, its seats, its duties) outlive its last renewal.

    A node renews at a third of the TTL, so two missed renewals are survived;
    a node killed outright loses its seats to the others within one TTL plus
    one placement sweep. Shorter moves seats sooner after a crash and costs
    more coordination-store writes.
    """

    SECTION: ClassVar[str] = "fleet"

    lease_ttl_s: float = setting(
        15.0, env="CREWLET_FLEET_LEASE_TTL_S", bounds=(5, 300),
        doc="how long a lease lasts past its last renewal; renewed every third of it",
    )


class EngineSettings(_Section):
    """Everything the engine is configured with: one section per field (a refusal names ``stream.cluster.port`` from here)."""

    stream: StreamSettings = Field(default_factory=StreamSettings)
    node: NodeSettings = Field(default_factory=NodeSettings)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)

    def timings(self) -> Timings:
        """The queue's :class:`Timings`: the redelivery spacing and the ack clock."""
        return Timings(
            backoff_base_s=self.delivery.backoff_base_s,
            backoff_cap_s=self.delivery.backoff_cap_s,
            ack_wait_s=self.stream.ack_wait_s,
        )


def _sections() -> dict[str, type[_Section]]:
    return {name: typing.cast(type[_Section], _section_type(info)) for name, info in EngineSettings.model_fields.items()}


@dataclass(frozen=True)
class KnownSetting:
    """One setting as docs, tests and the loader read it; ``metadata`` holds env, env_aliases, bounds, choices and doc."""

    name: str
    default: Any
    metadata: Mapping[str, Any]


def known_settings(prefix: str = "", cls: type[_Section] = EngineSettings) -> list[tuple[str, KnownSetting, type]]:
    """Every setting as (dotted name, its :class:`KnownSetting`, python type), in declaration order (docs, tests).

    A nested section's settings are listed under their full dotted names
    (``stream.cluster.port``); the section itself is not a setting.
    """
    out: list[tuple[str, KnownSetting, type]] = []
    for name, info in cls.model_fields.items():
        dotted, inner = f"{prefix}.{name}".lstrip("."), _section_type(info)
        if inner is not None:
            out.extend(known_settings(dotted, inner))
            continue
        extra = typing.cast(dict[str, Any], info.json_schema_extra)
        choices = next((m.choices for m in info.metadata if isinstance(m, Check) and m.choices), None)
        metadata = {**extra, "choices": choices, "doc": info.description}
        out.append((dotted, KnownSetting(name, info.default, metadata), typing.cast(type, info.annotation)))
    return out


def default_node_id(hostname: Optional[str] = None) -> str:
    """A node id from the short hostname, reduced to the characters a node id allows."""
    host = (hostname if hostname is not None else socket.gethostname()).split(".")[0]
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", host).strip("-_")[:63].rstrip("-_")
    return slug or "node"
