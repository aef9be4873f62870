"""Database routing: the event store lives in ``events``, everything else in ``default``.

``default`` is the coordination store a fleet shares; ``events`` is each node's
own store. Keeping the split from day one makes a fleet a configuration change
rather than a rewrite (docs/design.md § Databases).
"""
from __future__ import annotations

from typing import Any, Optional

EVENTS_ALIAS = "events"
#: App labels whose models live in the events database (the event store; the memory of the seats this node holds).
EVENT_APPS = frozenset({"eventstore", "seats_memory"})
#: Single models of other apps that describe the node's own event store (``app_label.model_name``).
EVENT_MODELS = frozenset({"crewlet.storeidentity"})


def _alias_for(app_label: str, model_name: Optional[str] = None) -> str:
    if app_label in EVENT_APPS or f"{app_label}.{model_name}" in EVENT_MODELS:
        return EVENTS_ALIAS
    return "default"


def _model_alias(model: Any) -> Optional[str]:
    return EVENTS_ALIAS if _label(model) == EVENTS_ALIAS else None


def _label(obj: Any) -> str:
    """The alias of a model or an instance (its ``_meta``; a model name is optional, as in a hint)."""
    meta = obj._meta
    return _alias_for(meta.app_label, getattr(meta, "model_name", None))


class EventStoreRouter:
    """Sends the ``eventstore`` app (and the store's identity row) to ``events``; everything else stays on ``default``."""

    def db_for_read(self, model: Any, **hints: Any) -> Optional[str]:
        # None, not "default", for other apps: Django then honours an instance's own database.
        return _model_alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> Optional[str]:
        return _model_alias(model)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> Optional[bool]:
        """A foreign key cannot cross databases, so only same-store relations are allowed."""
        return _label(obj1) == _label(obj2)

    def allow_migrate(self, db: str, app_label: str, model_name: Optional[str] = None, **hints: Any) -> Optional[bool]:
        """Each app's tables exist in exactly one of the two databases."""
        return db == _alias_for(app_label, model_name)
