"""Events: the envelope every piece of work and every record travels in.

Importing this package registers every typed event body (``crewlet.events.types``),
so an event decoded anywhere in the engine comes back as its class rather than
as an unknown type; the category map and the stored/fed classes live beside it
in ``crewlet.events.categories``.
"""
from __future__ import annotations

from crewlet.events import types  # noqa: F401  (registers every typed body)
from crewlet.events.categories import (
    CATEGORIES,
    CATEGORY_OF,
    NOT_FED,
    NOT_STORED,
    category_of,
    delivery_label,
    is_fed,
    is_known,
    is_stored,
    store_label,
    types_in,
)
from crewlet.events.envelope import (
    ENVELOPE_KEYS,
    Event,
    default_actor,
    format_timestamp,
    new,
    parse_timestamp,
    register,
    registered_type,
    registered_types,
)

__all__ = [
    "CATEGORIES",
    "CATEGORY_OF",
    "ENVELOPE_KEYS",
    "Event",
    "NOT_FED",
    "NOT_STORED",
    "category_of",
    "default_actor",
    "delivery_label",
    "format_timestamp",
    "is_fed",
    "is_known",
    "is_stored",
    "new",
    "parse_timestamp",
    "register",
    "registered_type",
    "registered_types",
    "store_label",
    "types",
    "types_in",
]
