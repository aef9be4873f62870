"""Event categories, what the store keeps, what the feed shows, and a row's label.

Design (docs/design.md § Event types): every wire type is filed under one
category from a CLOSED set — the same set the ``GET /events?category=`` filter
and the dashboard's category chips use. Each type declares its category, and
whether it is stored and fed, where its class is registered
(``crewlet.events.types``, ``@register(..., category=..., stored=..., fed=...)``);
this module derives the maps every reader of the store and the feed asks,
rather than keeping a second list of type names:

* ``CATEGORY_OF`` — wire type -> category, in declaration order.
* ``NOT_STORED`` — live-only types, each excluded for the reason its class
  states (the durable record of what they say is another row, or the next
  report supersedes them).
* ``NOT_FED`` — types kept out of the activity feed: the not-stored ones
  (never rows at all) plus ``auxiliary_spend``, which is stored (accounting a
  turn's history and a trace must show) but would push the turns and failures
  a reader is watching out of the feed's ring.
* ``EXTENSIONS`` — the types this build adds to the design's list, each with
  the reason it exists.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, Optional

from crewlet.events import types as _types  # noqa: F401  (every type registered before the maps are read)
from crewlet.events.labels import delivery_label
from crewlet.events.registry import CATEGORIES, CATEGORY_OF, registration, registrations

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event

# The one type whose rows are not filed under its own name (see store_label).
INBOUND_DELIVERY = "inbound_delivery"
AUXILIARY_SPEND = "auxiliary_spend"

#: Types this build adds to the design's list, each with the reason it declared.
EXTENSIONS: Mapping[str, str] = MappingProxyType({r.type_name: r.extension for r in registrations() if r.extension})

#: Live-only: never a row.
NOT_STORED: frozenset[str] = frozenset(r.type_name for r in registrations() if r.category and not r.stored)

#: Never in the activity feed: everything not stored, plus the stored types that are accounting, not activity.
NOT_FED: frozenset[str] = frozenset(r.type_name for r in registrations() if r.category and not r.fed)



def category_of(event_type: str) -> Optional[str]:
    """The category a wire type is filed under, or None for a type this build does not know."""
    return CATEGORY_OF.get(event_type)


def is_known(event_type: str) -> bool:
    return event_type in CATEGORY_OF


def is_stored(event_type: str) -> bool:
    """Whether the event store keeps a row for this type.

    A type this build does not know IS stored: a newer build publishes it, and
    a row an operator can read beats silently losing the record of it.
    """
    known = registration(event_type)
    return known is None or known.stored


def is_fed(event_type: str) -> bool:
    """Whether a row of this type takes a place in the activity feed (``feed_only``)."""
    known = registration(event_type)
    return known is None or known.fed


def types_in(category: str) -> tuple[str, ...]:
    """Every wire type filed under a category, in map order; refuses a category outside the closed set."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown event category {category!r}; the set is closed: {', '.join(CATEGORIES)}")
    return tuple(name for name, cat in CATEGORY_OF.items() if cat == category)


def store_label(event: "Event") -> str:
    """The name a row is filed under: the event's type, except an inbound delivery's own label.

    ``inbound_delivery`` is the one type whose rows do not carry its name: each
    is filed under ``webhook:<event>``, ``forge:<event>`` or ``socket:posted``
    (read from the body's ``surface`` and ``event_name``), because that is what
    an operator matches against their provider's console.
    """
    if event.type != INBOUND_DELIVERY:
        return event.type
    return delivery_label(event.field("surface"), event.field("event_name"))


__all__ = [
    "AUXILIARY_SPEND",
    "CATEGORIES",
    "CATEGORY_OF",
    "EXTENSIONS",
    "INBOUND_DELIVERY",
    "NOT_FED",
    "NOT_STORED",
    "category_of",
    "delivery_label",
    "is_fed",
    "is_known",
    "is_stored",
    "store_label",
    "types_in",
]
