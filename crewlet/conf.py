"""Typed engine settings (``stream.*``, ``node.*``), validated when they are loaded.

Sources, lowest to highest precedence: field defaults, the YAML file named by
``CREWLET_SETTINGS_FILE`` (or a mapping passed in), environment variables,
then explicit overrides (command-line flags). One exception, from the design:
the node id is ``node.id``, then ``CREWLET_NODE_ID``, then the hostname. A bad value fails the load with
a :class:`SettingsError` that names the dotted field, the value and what is
allowed, so an operator fixes it from one line instead of from a traceback
deep inside the broker.

Every knob is a dataclass field whose metadata carries its range, choices and
environment variable; adding a knob is adding a field.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import socket
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

import yaml

from crewlet.queue.contract import Timings

SETTINGS_FILE_ENV = "CREWLET_SETTINGS_FILE"
#: Keys whose environment variable is a fallback for the file rather than an override.
ENV_YIELDS_TO_FILE = frozenset({"node.id"})
NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
STREAM_TYPES = ("embedded", "nats")
URL_SCHEMES = ("nats", "tls")


class SettingsError(ValueError):
    """A setting that cannot be used: ``<field>=<value>: <what is allowed>``."""

    def __init__(self, field: str, value: Any, reason: str, source: Optional[str] = None) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.source = source
        message = f"{field}={_show(value)}: {reason}"
        if source:
            message += f" (from {source})"
        super().__init__(message)

    def from_source(self, source: Optional[str]) -> SettingsError:
        """The same error, saying where the value came from (a file, an env var, a flag)."""
        if not source or self.source:
            return self
        return SettingsError(self.field, self.value, self.reason, source)


def _show(value: Any) -> str:
    """How a value reads in a message: numbers plainly (0, 720.5), everything else as repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


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
    bounds: Optional[tuple[float, float]] = None,
    choices: Optional[tuple[str, ...]] = None,
    doc: str = "",
) -> Any:
    """A settings field: its default plus what validation and the env loader need to know."""
    return field(default=default, metadata={"env": env, "bounds": bounds, "choices": choices, "doc": doc})


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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SettingsError(name, value, f"must be a number{span}")
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            raise SettingsError(name, value, "must be a string")
    if bounds and not bounds[0] <= value <= bounds[1]:
        raise SettingsError(name, value, f"must be{span}")
    if choices and value not in choices:
        raise SettingsError(name, value, f"must be one of {', '.join(choices)}")
    return value


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
        doc="nats://host:port or tls://host:port; required when stream.type is nats",
    )
    store_dir: str = setting(
        "", env="CREWLET_STREAM_STORE_DIR",
        doc="embedded broker's JetStream directory; empty keeps streams in memory",
    )
    event_retention_hours: float = setting(
        720.0, env="CREWLET_EVENT_RETENTION_HOURS", bounds=(1, 8760),
        doc="age bound of CREWLET_EVENTS and CREWLET_DLQ",
    )

    def check(self) -> None:
        if self.type == "nats" and not self.url:
            raise SettingsError("stream.url", self.url, "required when stream.type is nats (nats://host:port or tls://host:port)")
        if self.url:
            shown = redact_url(self.url)  # an error message ends up in logs: never the password
            parts = urlsplit(self.url)
            try:
                parts.port  # noqa: B018 - raises on a malformed port
            except ValueError:
                raise SettingsError("stream.url", shown, "has an invalid port") from None
            if parts.scheme not in URL_SCHEMES or not parts.hostname:
                raise SettingsError("stream.url", shown, "must start with nats:// or tls:// and name a host")


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

    def check(self) -> None:
        # Empty means "not chosen yet"; load_settings resolves it from the hostname.
        if self.id and not NODE_ID_PATTERN.fullmatch(self.id):
            raise SettingsError(
                "node.id", self.id,
                "must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit",
            )


@dataclass(frozen=True)
class DeliverySettings(_Section):
    """How the queue spaces redeliveries and how long a fetched message may go unacknowledged.

    The defaults are the queue's production :class:`Timings`; an operator may
    tune them, and the fault suite shrinks them so that a whole delivery budget
    (25 deliveries) or a crash's redelivery is seen in seconds through the same
    code ``up`` runs.
    """

    SECTION = "delivery"

    backoff_base_s: float = setting(
        Timings.backoff_base_s, env="CREWLET_DELIVERY_BACKOFF_BASE_S", bounds=(0, 3600),
        doc="spacing before the first redelivery of a failed message; doubles per failure",
    )
    backoff_cap_s: float = setting(
        Timings.backoff_cap_s, env="CREWLET_DELIVERY_BACKOFF_CAP_S", bounds=(0, 3600),
        doc="the most a redelivery's spacing grows to",
    )
    ack_wait_s: float = setting(
        Timings.ack_wait_s, env="CREWLET_DELIVERY_ACK_WAIT_S", bounds=(0.1, 86400),
        doc="how long a fetched message may go unacknowledged before the broker redelivers it",
    )

    def timings(self) -> Timings:
        """These settings as the queue's :class:`Timings`."""
        return Timings(backoff_base_s=self.backoff_base_s, backoff_cap_s=self.backoff_cap_s, ack_wait_s=self.ack_wait_s)


@dataclass(frozen=True)
class EngineSettings:
    """Everything the engine is configured with."""

    stream: StreamSettings = field(default_factory=StreamSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)


def _sections() -> dict[str, type[_Section]]:
    return {f.name: _type_of(EngineSettings, f.name) for f in dataclasses.fields(EngineSettings)}


def known_settings() -> list[tuple[str, dataclasses.Field, type]]:
    """Every setting as (dotted name, field, python type), in declaration order (docs, tests)."""
    out = []
    for section, cls in _sections().items():
        for f in dataclasses.fields(cls):
            out.append((f"{section}.{f.name}", f, _type_of(cls, f.name)))
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
    return text


def _read_file(path: str) -> Mapping[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SettingsError(SETTINGS_FILE_ENV, path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(SETTINGS_FILE_ENV, path, f"is not valid YAML ({exc})") from None
    return {} if data is None else data


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
        if body is None:
            continue
        if not isinstance(body, Mapping):
            raise SettingsError(str(key), body, "must be a mapping", source)
        names = [f.name for f in dataclasses.fields(sections[key])]
        for name, value in body.items():
            if name not in names:
                listed = ", ".join(f"{key}.{n}" for n in names)
                raise SettingsError(f"{key}.{name}", value, f"unknown setting; known: {listed}", source)
            values[f"{key}.{name}"] = (value, source)

    known = {dotted: (f, kind) for dotted, f, kind in known_settings()}
    for dotted, (f, kind) in known.items():
        if dotted in ENV_YIELDS_TO_FILE and dotted in values:
            continue  # design: node.id, then CREWLET_NODE_ID, then the default
        var = f.metadata.get("env")
        raw = env.get(var, "") if var else ""
        if raw != "":
            try:
                values[dotted] = (_parse_env(dotted, kind, raw, f.metadata.get("bounds")), var)
            except SettingsError as exc:
                raise exc.from_source(var) from None

    for dotted, value in (overrides or {}).items():
        if dotted not in known:
            raise SettingsError(dotted, value, f"unknown setting; known: {', '.join(known)}", "overrides")
        values[dotted] = (value, "command line")

    # One value per EngineSettings field, each of that field's section type.
    built: dict[str, Any] = {}
    for section, cls in sections.items():
        kwargs = {d.split(".", 1)[1]: v for d, (v, _) in values.items() if d.split(".", 1)[0] == section}
        try:
            built[section] = cls(**kwargs)
        except SettingsError as exc:
            raise exc.from_source(values.get(exc.field, (None, None))[1]) from None

    node = typing.cast(NodeSettings, built["node"])
    if not node.id:
        built["node"] = dataclasses.replace(node, id=default_node_id(hostname))
    return EngineSettings(**built)
