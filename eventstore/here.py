"""This node as the store's reads see it: its scope (id, retention) and the clock an asker reads.

Both the HTTP reads (:mod:`eventstore.api`) and the live projection's seed
(:mod:`eventstore.projection`) ask as this node, so what they share sits
below both of them rather than in either: neither has to reach into the
other for it. Callers read these through the module (``here.node_scope()``,
``here.clock()``) so a test that replaces one replaces it for every asker.

The scope is the running engine's: its settings are this node's, and the
engine is the process's one holder of state, so nothing here keeps a copy
that outlives it (a test that starts an engine, or changes the settings, is
answered with what it set). A process without an engine reads the settings
when it asks.
"""
from __future__ import annotations

from datetime import datetime, timezone

from django.core.exceptions import ImproperlyConfigured

from crewlet.company.conf import EngineSettings, SettingsError
from crewlet.company.loading import load_settings
from crewlet.engine import runtime
from eventstore.questions import NodeScope


def clock() -> datetime:
    """The wall clock, read once per question (tests replace it)."""
    return datetime.now(timezone.utc)


def scope_of(settings: EngineSettings) -> NodeScope:
    """The node ``settings`` describe, as the per-node answers see it: its id and its retention bound."""
    return NodeScope(node_id=settings.node.id, retention_hours=settings.stream.event_retention_hours)


def node_scope() -> NodeScope:
    """This node as the per-node answers see it: the running engine's settings, else the settings read now."""
    running = runtime.current_engine()
    if running is not None:
        return scope_of(running.settings)
    try:
        settings = load_settings()
    except SettingsError as exc:
        raise ImproperlyConfigured(f"engine settings: {exc}") from None
    return scope_of(settings)


__all__ = ["clock", "node_scope", "scope_of"]
