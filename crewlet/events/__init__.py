"""Events: the envelope every piece of work and every record travels in."""
from __future__ import annotations

from crewlet.events.envelope import (
    ENVELOPE_KEYS,
    Event,
    format_timestamp,
    parse_timestamp,
    register,
    registered_type,
    registered_types,
)

__all__ = [
    "ENVELOPE_KEYS",
    "Event",
    "format_timestamp",
    "parse_timestamp",
    "register",
    "registered_type",
    "registered_types",
]
