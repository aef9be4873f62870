"""What every typed body shares: the actor rule, a seat in a sentence, a fallback summary, a seat's fields and a turn's tags.

:class:`EventBody` holds no fields, so it adds nothing to the wire. The
phrase helpers (``_s``, ``_tail``, ``_person``, ``_plural``) are what every
``summary()`` is written with. ``_SeatBody`` and ``_TurnBody`` are here
because bodies of every category build on them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.envelope import default_actor

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


def _s(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _tail(value: Any, prefix: str = ": ") -> str:
    """An optional clause: empty when there is nothing to say (empty, None, zero, a bool)."""
    if value is None or isinstance(value, bool):
        return ""
    text = str(value) if isinstance(value, (int, float)) and value else _s(value)
    return f"{prefix}{text}" if text else ""


def _person(name: Any, seat: Any = "") -> str:
    """A person as a reader knows them: their name, else their seat, else "someone"."""
    return _s(name) or _s(seat) or "someone"


def _plural(n: Any, one: str, many: Optional[str] = None) -> str:
    count = n if isinstance(n, int) and not isinstance(n, bool) else 0
    return f"{count} {one if count == 1 else (many or one + 's')}"


class EventBody:
    """Behaviour every typed body shares: the actor rule and a fallback summary.

    Not a dataclass and holds no fields, so it adds nothing to the wire.
    """

    event_type: str  # set by @register

    def actor(self, event: Optional["Event"] = None) -> str:
        """Role, then the envelope's source, then agent id, then "system"."""
        return default_actor(
            getattr(self, "role", ""),
            event.source if event is not None else "",
            getattr(self, "agent_id", ""),
        )

    def _named(self, name: Any, event: Optional["Event"] = None) -> str:
        """Who the body names (a ``requested_by``, a ``from_seat``), else :meth:`actor`."""
        return _s(name) or self.actor(event)

    def _seat(self) -> str:
        """The seat by its handle ("grace"), or "a seat" when the body names none."""
        return _s(getattr(self, "seat", "")) or "a seat"

    def _seat_ref(self) -> str:
        """The seat as an object of a sentence: "seat grace", or "a seat"."""
        name = _s(getattr(self, "seat", ""))
        return f"seat {name}" if name else "a seat"

    def summary(self, event: Optional["Event"] = None) -> str:  # pragma: no cover - every class overrides
        return f"{self.actor(event)}: {self.event_type.replace('_', ' ')}"


@dataclass
class _ActorTags:
    """Whose an event is, beside the envelope's ``source``: the fields :meth:`EventBody.actor` reads."""

    role: str = ""
    agent_id: str = ""


@dataclass
class _DeliveryTags:
    """The vendor delivery an event is about: the vendor's event name and its delivery id."""

    event_name: str = ""
    delivery_id: str = ""


@dataclass
class _SeatBody(EventBody, _ActorTags):
    """The seat a body is about, and whose it is."""

    seat: str = ""


@dataclass
class _TurnBody(_SeatBody):
    """Fields every event about one seat's turn shares (tags the store promotes)."""

    turn_id: str = ""
    conversation_key: str = ""


@dataclass
class _PhaseBody(_TurnBody):
    """An event inside one phase of a turn."""

    phase: str = ""


@dataclass
class _IterationBody(_PhaseBody):
    """An event inside one iteration of a phase."""

    iteration: int = 0


@dataclass
class _RoundBody(_IterationBody):
    """An event inside one model round of an iteration."""

    round: int = 0


@dataclass
class _Tokens:
    """What a model call or a turn spent, as the vendor bills input (cached tokens at their fraction)."""

    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class _CachedTokens(_Tokens):
    """Spend with the prompt cache's share: the cached tokens themselves, counted raw."""

    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass
class _WorkItemTags:
    """What a turn works on: ``work_item`` is ``{backend, id, key, project}`` or None; ``work_item_basis`` one of WORK_ITEM_BASES.

    ``resumed`` marks a parked coding run's resumed segment under the same ``turn_id``.
    """

    work_item: Optional[dict[str, Any]] = None
    work_item_basis: str = ""
    resumed: bool = False


@dataclass
class _Failure:
    """Why a call failed: ``error_kind`` a fixed phrase, ``error`` the message."""

    error_kind: str = ""
    error: str = ""
