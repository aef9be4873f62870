"""Database routing: the event store lives in ``events``, everything else in ``default``.

``default`` is the coordination store a fleet shares; ``events`` is each node's
own store. Keeping the split from day one makes a fleet a configuration change
rather than a rewrite (ARCHITECTURE.md, Databases).
"""
from __future__ import annotations

from typing import Any, Optional

EVENTS_ALIAS = "events"
#: App labels whose models live in the events database.
EVENT_APPS = frozenset({"eventstore"})


def _alias_for(app_label: str) -> str:
    return EVENTS_ALIAS if app_label in EVENT_APPS else "default"


class EventStoreRouter:
    """Sends the ``eventstore`` app to ``events``; every other app stays on ``default``."""

    def db_for_read(self, model: Any, **hints: Any) -> Optional[str]:
        # None, not "default", for other apps: Django then honours an instance's own database.
        return EVENTS_ALIAS if model._meta.app_label in EVENT_APPS else None

    def db_for_write(self, model: Any, **hints: Any) -> Optional[str]:
        return EVENTS_ALIAS if model._meta.app_label in EVENT_APPS else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> Optional[bool]:
        """A foreign key cannot cross databases, so only same-store relations are allowed."""
        return _alias_for(obj1._meta.app_label) == _alias_for(obj2._meta.app_label)

    def allow_migrate(self, db: str, app_label: str, model_name: Optional[str] = None, **hints: Any) -> Optional[bool]:
        """Each app's tables exist in exactly one of the two databases."""
        return db == _alias_for(app_label)
