"""The registry of typed event bodies, and what each type declares about itself.

Every wire type is declared once, where its class is (``crewlet.events.types``):
``@register("seat_paused", category=LIFECYCLE)``. The declaration carries
everything the rest of the engine asks about a type — the category it is
filed under, whether the event store keeps its rows, whether the activity
feed shows them, and, for a type this build adds to the design's list, why it
exists — so no second list of type names is kept anywhere. The readers of
those facts (``crewlet.events.categories``) derive their maps from here.

The category set is CLOSED (design: Event Types): the same set the
``GET /events?category=`` filter and the dashboard's chips use, so a category
is a wire contract and an unknown one is refused at registration rather than
becoming a new chip.

This module imports nothing else from the package, so the envelope (which
decodes a registered type as its class) and the typed bodies both build on it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Optional, TypeVar, dataclass_transform

# The closed category set (wire strings).
LIFECYCLE = "lifecycle"
TASK = "task"
A2A = "a2a"
DECISION = "decision"
NOTIFICATION = "notification"
LEARNING = "learning"
SYSTEM = "system"
WEBHOOK = "webhook"

CATEGORIES: tuple[str, ...] = (LIFECYCLE, TASK, A2A, DECISION, NOTIFICATION, LEARNING, SYSTEM, WEBHOOK)


@dataclass(frozen=True)
class Registration:
    """What one wire type declares about itself.

    ``category`` is None only for a type registered outside the build's list
    (a test's own body): such a type decodes as its class but is filed under
    no category. ``stored`` False marks a live-only type, never a row; ``fed``
    False keeps a stored type's rows out of the activity feed (a type that is
    not stored is never fed). ``extension`` is the reason a type this build
    adds to the design's list exists, "" for a design type.
    """

    type_name: str
    cls: type
    category: Optional[str]
    stored: bool
    fed: bool
    extension: str


_REGISTRY: dict[str, Registration] = {}
# Wire type -> category, in registration order; filled only by register().
_CATEGORY_OF: dict[str, str] = {}
#: The category map, read-only: every categorised registered type, in declaration order.
CATEGORY_OF: Mapping[str, str] = MappingProxyType(_CATEGORY_OF)

T = TypeVar("T")


@dataclass_transform()
def register(
    type_name: str,
    *,
    category: Optional[str] = None,
    stored: bool = True,
    fed: Optional[bool] = None,
    extension: str = "",
) -> Callable[[type[T]], type[T]]:
    """Declare ``cls`` as the typed body of ``type_name``, with what the type declares; it becomes a dataclass.

    The class is made a dataclass here (unless it already is one in its own
    right), so a body's declaration is the one decorator and its fields.

    ``fed`` defaults to ``stored``: a row is in the feed unless the type says
    otherwise, and a type that is never a row can never be in it. An extension
    must say why it exists, and must be filed under a category like any type.
    """
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"unknown event category {category!r}; the set is closed: {', '.join(CATEGORIES)}")
    feeds = stored if fed is None else fed
    if feeds and not stored:
        raise ValueError(f"event type {type_name!r} cannot be fed without being stored")
    if extension and category is None:
        raise ValueError(f"extension {type_name!r} must be filed under a category")

    def deco(cls: type[T]) -> type[T]:
        if "__dataclass_fields__" not in cls.__dict__:
            cls = dataclasses.dataclass(cls)
        known = _REGISTRY.get(type_name)
        if known is not None and known.cls is not cls:
            raise ValueError(f"event type {type_name!r} is registered twice")
        _REGISTRY[type_name] = Registration(type_name, cls, category, stored, feeds, extension)
        if category is not None:
            _CATEGORY_OF[type_name] = category
        setattr(cls, "event_type", type_name)
        return cls

    return deco


def registration(type_name: str) -> Optional[Registration]:
    """What ``type_name`` declared, or None for a type this build does not know."""
    return _REGISTRY.get(type_name)


def registrations() -> tuple[Registration, ...]:
    """Every registration, in declaration order."""
    return tuple(_REGISTRY.values())


def registered_type(type_name: str) -> Optional[type]:
    known = _REGISTRY.get(type_name)
    return known.cls if known is not None else None


def registered_types() -> dict[str, type]:
    return {name: r.cls for name, r in _REGISTRY.items()}


__all__ = [
    "A2A",
    "CATEGORIES",
    "CATEGORY_OF",
    "DECISION",
    "LEARNING",
    "LIFECYCLE",
    "NOTIFICATION",
    "Registration",
    "SYSTEM",
    "TASK",
    "WEBHOOK",
    "register",
    "registered_type",
    "registered_types",
    "registration",
    "registrations",
]
