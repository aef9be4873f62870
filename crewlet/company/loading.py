"""Engine settings loaded from their sources, each value refused in one line that says where it came from.

Sources, lowest to highest precedence: field defaults, the YAML file named by
``CREWLET_SETTINGS_FILE`` (or a mapping passed in), environment variables,
then explicit overrides (command-line flags). One exception, from the design:
the node id is ``node.id``, then ``CREWLET_NODE_ID``, then the hostname. A bad value fails the load with
a :class:`~crewlet.company.conf.SettingsError` that names the dotted field, the
value, what is allowed and the file, variable or flag it came from.

One secret is not a setting: ``CREWLET_CLUSTER_SECRET``, which authenticates
the routes between clustered members, is read from the environment only, is
never part of :class:`~crewlet.company.conf.EngineSettings` (whose repr reaches
logs and tracebacks), and is required when ``stream.cluster.peers`` is set.
"""
from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Mapping, Optional, Sequence

from crewlet.company.conf import (
    EngineSettings,
    SettingsError,
    Strings,
    _Section,
    _section_type,
    _sections,
    _span,
    default_node_id,
    known_settings,
)
from crewlet.company.yamlfile import load_yaml, read_yaml_text

log = logging.getLogger(__name__)

SETTINGS_FILE_ENV = "CREWLET_SETTINGS_FILE"
#: The shared secret of the routes between clustered embedded members (environment only, never logged).
CLUSTER_SECRET_ENV = "CREWLET_CLUSTER_SECRET"
#: Keys whose environment variable is a fallback for the file rather than an override.
ENV_YIELDS_TO_FILE = frozenset({"node.id"})
#: Old dotted names still read, each as the setting that replaced it.
RENAMED = {"delivery.ack_wait_s": "stream.ack_wait_s"}


def _parse_env(name: str, kind: type, raw: str, bounds: Optional[Sequence[float]]) -> Any:
    """Turn an environment string into the field's type; the range is checked later, with the rest."""
    span = _span(bounds)
    text = raw.strip()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # os.environ holds undecodable bytes as lone surrogates, which no store, path or log line can carry.
        raise SettingsError(name, raw, "is not UTF-8 text") from None
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise SettingsError(name, raw, "must be true or false")
        return text.lower() == "true"
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


def _read_file(path: str) -> Mapping[str, Any]:
    text = read_yaml_text(path, document=SETTINGS_FILE_ENV, error=SettingsError)
    data = load_yaml(text, document=SETTINGS_FILE_ENV, name=path, error=SettingsError)
    return {} if data is None else data


def _flatten(
    prefix: str, cls: type[_Section], body: Any, source: Optional[str], values: dict[str, tuple[Any, Optional[str]]]
) -> None:
    """One section's mapping into ``values`` under dotted names; a nested section recurses."""
    if body is None:
        return
    if not isinstance(body, Mapping):
        raise SettingsError(prefix, body, "must be a mapping", source)
    kinds = cls.model_fields
    for name, value in body.items():
        dotted = f"{prefix}.{name}"
        if dotted in RENAMED:
            log.warning("setting_renamed", extra={"setting": dotted, "use": RENAMED[dotted]})
            values[RENAMED[dotted]] = (value, source)
            continue
        if name not in kinds:
            listed = ", ".join(f"{prefix}.{n}" for n in kinds)
            raise SettingsError(dotted, value, f"unknown setting; known: {listed}", source)
        inner = _section_type(kinds[name])
        if inner is not None:
            _flatten(dotted, inner, value, source, values)
        else:
            values[dotted] = (value, source)


def _build(values: Mapping[str, tuple[Any, Optional[str]]]) -> EngineSettings:
    """The settings from the dotted ``values``, nested back into sections; a refusal names its value's source."""
    nested: dict[str, Any] = {}
    for dotted, (value, _) in values.items():
        *path, leaf = dotted.split(".")
        at = nested
        for name in path:
            at = at.setdefault(name, {})
        at[leaf] = value
    try:
        return EngineSettings(**nested)
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

    if values.get("node.id", ("", None))[0] == "":
        values["node.id"] = (default_node_id(hostname), None)
    settings = _build(values)
    if settings.stream.cluster.peers and not env.get(CLUSTER_SECRET_ENV, ""):
        raise SettingsError(
            CLUSTER_SECRET_ENV, "(unset)",
            "required when stream.cluster.peers is set: the same secret on every member authenticates their routes",
        )
    if settings.stream.leaf.urls and not env.get(CLUSTER_SECRET_ENV, ""):
        raise SettingsError(
            CLUSTER_SECRET_ENV, "(unset)",
            "required when stream.leaf.urls is set: the members' secret authenticates a leaf's connection to them",
        )
    return settings
