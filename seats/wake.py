"""A wake as the seats read it: one typed view of the values an inbox event carries.

A wake's values reach a seat in two layers: the typed body (an
``ExternalNotification``'s fields, flat on the envelope) and the free-form
``payload`` map its publisher fills beside them — the routing keys
(``partition_key``, ``conversation_identity``) and the surface values the
body does not declare (``sender_id``, ``digest_body``, ``message_id``,
``direct``, ``recon`` ...). The wire keeps both where they are, so
:class:`Wake` reads each value through ``Event.field``'s one precedence and
hands it back typed: the inbox and the digest ask for ``wake.partition_key``,
and the payload keys the seats read or write are spelled here alone.

Any inbox event is a wake here (an A2A request and a task too): a value its
type does not carry reads as empty.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crewlet.events import Event

# Keys of a wake: typed fields of ExternalNotification and the payload map its publisher fills.
SEAT = "seat"
EVENT_NAME = "event_name"
PARTITION_KEY = "partition_key"
CONVERSATION_IDENTITY = "conversation_identity"
SENDER = "sender"
SENDER_ID = "sender_id"
BODY = "body"
DIGEST_BODY = "digest_body"
TITLE = "title"
URL = "url"
DELIVERY_ID = "delivery_id"
MESSAGE_ID = "message_id"
DIRECT = "direct"
RECON = "recon"
MESSAGES = "messages"
TRIGGER_POSITION = "trigger_position"

# Keys the digest adds to a merged trigger's payload.
TRIGGER_POSITIONS = "trigger_positions"
COALESCED_COUNT = "coalesced_count"
COALESCED_EVENT_IDS = "coalesced_event_ids"
DUPLICATES_COLLAPSED = "duplicates_collapsed"
DELIVERY_IDS = "delivery_ids"

# Keys of one entry of a merged trigger's ``messages`` besides the wake keys above.
MESSAGE_EVENT_ID = "event_id"
MESSAGE_TIMESTAMP = "timestamp"
MESSAGE_SOURCE = "source"
MESSAGE_COLLAPSED = "collapsed"


class WakeValueError(ValueError):
    """A strict read met a wake value of the wrong type (or no ``body``); ``reason`` says which, in words."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(reason)


def as_text(value: Any) -> str:
    """An identifier as text: a string as it is, an integer in digits, anything else (a flag, None) empty."""
    if isinstance(value, bool) or value is None:
        return ""
    return str(value) if isinstance(value, (str, int)) else ""


class _Text:
    """A string value of the wake, read through ``Wake._text`` (so lenient or strict as the wake is)."""

    def __init__(self, name: str, *, required: bool = False) -> None:
        self.name = name
        self.required = required

    def __get__(self, wake: "Wake", owner: type) -> str:
        return wake._text(self.name, required=self.required)


@dataclass(frozen=True)
class Wake:
    """The typed values of one inbox event, each read when asked for.

    Lenient by default: a value that is not a string reads as empty, because
    the inbox only routes by these and a stray type must not stop a delivery.
    ``strict`` is the digest's: a merge must not vouch for a value it cannot
    read, so a present value of the wrong type raises :class:`WakeValueError`,
    as does a wake with no ``body``. Reads are lazy so a caller meets the
    first bad value in the order it asks, not all of them at once.
    """

    event: Event
    strict: bool = False

    seat = _Text(SEAT)
    event_name = _Text(EVENT_NAME)
    #: The partition the publisher filed it under; empty when it names none (it is then never coalesced).
    partition_key = _Text(PARTITION_KEY)
    #: The conversation it belongs to (a turn's ``conversation_key``).
    conversation_identity = _Text(CONVERSATION_IDENTITY)
    #: Who sent it, as a person reads the name.
    sender = _Text(SENDER)
    #: Who sent it, as the surface names them (two people's equal texts are two facts).
    sender_id = _Text(SENDER_ID)
    body = _Text(BODY, required=True)
    #: The lead line a per-source supersede rule shows when a later wake of the partition follows it.
    digest_body = _Text(DIGEST_BODY)
    title = _Text(TITLE)
    url = _Text(URL)

    def _text(self, name: str, *, required: bool = False) -> str:
        value = self.event.field(name)
        if value is None:
            if required and self.strict:
                raise WakeValueError(name, f"it carries no {name}")
            return ""
        if not isinstance(value, str):
            if self.strict:
                raise WakeValueError(name, f"{name} is a {type(value).__name__}, not a string")
            return ""
        return value

    @property
    def delivery_id(self) -> str:
        return as_text(self.event.field(DELIVERY_ID))

    @property
    def message_id(self) -> str:
        return as_text(self.event.field(MESSAGE_ID))

    @property
    def recon(self) -> bool:
        """Only an explicit True: a wake that says nothing is not reconnaissance."""
        return self.event.field(RECON) is True

    @property
    def direct(self) -> bool:
        """Everything but an explicit False: somebody may be waiting on an answer."""
        return self.event.field(DIRECT) is not False

    @property
    def trigger_position(self) -> str:
        """An engine-raised wake's stream position (``stream@generation:sequence``); empty when not a string."""
        value = self.event.field(TRIGGER_POSITION)
        return value if isinstance(value, str) else ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """A merged trigger's constituents; empty for a wake that carries none."""
        value = self.event.field(MESSAGES)
        if value is None:
            return []
        if not isinstance(value, list):
            if self.strict:
                raise WakeValueError(MESSAGES, "messages is not a list")
            return []
        return value


__all__ = [
    "BODY",
    "COALESCED_COUNT",
    "COALESCED_EVENT_IDS",
    "CONVERSATION_IDENTITY",
    "DELIVERY_ID",
    "DELIVERY_IDS",
    "DIGEST_BODY",
    "DIRECT",
    "DUPLICATES_COLLAPSED",
    "EVENT_NAME",
    "MESSAGES",
    "MESSAGE_COLLAPSED",
    "MESSAGE_EVENT_ID",
    "MESSAGE_ID",
    "MESSAGE_SOURCE",
    "MESSAGE_TIMESTAMP",
    "PARTITION_KEY",
    "RECON",
    "SEAT",
    "SENDER",
    "SENDER_ID",
    "TITLE",
    "TRIGGER_POSITION",
    "TRIGGER_POSITIONS",
    "URL",
    "Wake",
    "WakeValueError",
    "as_text",
]
