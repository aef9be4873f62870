"""This node as the store's reads see it: its scope (id, retention) and the clock an asker reads.

Both the HTTP reads (:mod:`eventstore.api`) and the live projection's seed
(:mod:`eventstore.projection`) ask as this node, so what they share sits
below both of them rather than in either: neither has to reach into the
other for it. Callers read these through the module (``here.node_scope()``,
``here.clock()``) so a test that replaces one replaces it for every asker.
"""
from __future__ import annotations

import functools
from datetime import datetime, timezone

from django.core.exceptions import ImproperlyConfigured

from crewlet.company.conf import SettingsError, load_settings
from eventstore.questions import NodeScope


def clock() -> datetime:
    """The wall clock, read once per question (tests replace it)."""
    return datetime.now(timezone.utc)


@functools.lru_cache(maxsize=1)
def _scope_from_settings() -> NodeScope:
    try:
        settings = load_settings()
    except SettingsError as exc:
        raise ImproperlyConfigured(f"engine settings: {exc}") from None
    return NodeScope(node_id=settings.node.id, retention_hours=settings.stream.event_retention_hours)


def node_scope() -> NodeScope:
    """This node as the per-node answers see it: its id and its retention bound."""
    return _scope_from_settings()


__all__ = ["clock", "node_scope"]
