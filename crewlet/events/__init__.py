"""Events: the envelope every piece of work and every record travels in.

Importing this package registers every typed event body (``crewlet.events.types``),
so an event decoded anywhere in the engine comes back as its class rather than
as an unknown type. Each type declares its category and whether it is stored
and fed where it is registered (``crewlet.events.registry``);
``crewlet.events.categories`` derives the maps the store and the feed read.
``crewlet.events.trace`` is the trace value and its W3C codec, with no
OpenTelemetry, so building and decoding an event never loads the SDK.
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
)
from crewlet.events.registry import register, registered_type, registered_types, registration
from crewlet.events.trace import Trace

__all__ = [
    "CATEGORIES",
    "CATEGORY_OF",
    "ENVELOPE_KEYS",
    "Event",
    "NOT_FED",
    "NOT_STORED",
    "Trace",
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
    "registration",
    "store_label",
    "types",
    "types_in",
]
