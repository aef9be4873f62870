"""Webhook bodies: a provider's delivery as the edge took it, and as it was presented to one seat."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from crewlet.events.labels import delivery_label
from crewlet.events.registry import WEBHOOK, register
from crewlet.events.types.base import EventBody, _DeliveryTags, _s, _SeatBody
from crewlet.events.types.phrases import BODY_TEXT, _decode_body, _encode_body

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@dataclass
class _DeliveryBody(EventBody, _DeliveryTags):
    """A delivery as the provider sent it: ``body`` is the provider's exact bytes.

    As UTF-8 text when they were (``body_encoding`` ""), else base64
    (``body_encoding`` "base64"); ``raw_bytes()`` gives the bytes back either way.
    """

    surface: str = ""  # webhook | forge | socket (see labels.SURFACES)
    provider: str = ""
    route: str = ""
    content_type: str = ""
    body: str = ""
    body_encoding: str = BODY_TEXT

    def raw_bytes(self) -> bytes:
        return _decode_body(self.body, self.body_encoding)

    def set_raw_bytes(self, raw: bytes) -> None:
        self.body, self.body_encoding = _encode_body(raw)

    def label(self) -> str:
        return delivery_label(self.surface, self.event_name)


@register("inbound_delivery", category=WEBHOOK)
class InboundDelivery(_DeliveryBody, _SeatBody):
    """One delivery presented to one seat, counted once across the fleet.

    Its row is filed under the delivery's own label (``webhook:<event>``,
    ``forge:<event>``, ``socket:posted``; ``categories.store_label``) with
    the provider's exact bytes as the payload.
    """

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(self.provider) or (_s(event.source) if event is not None else "")
        frm = f" from {app}" if app else ""
        return f"{self._seat()} received {self.label()}{frm}"


@register("raw_webhook", category=WEBHOOK, stored=False)
class RawWebhook(_DeliveryBody):
    """Not stored: the delivery as the edge took it (its row is the inbound_delivery beside it)."""

    headers: dict[str, str] = field(default_factory=dict)

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(self.provider) or (_s(event.source) if event is not None else "")
        return f"{app or 'a provider'} delivered {self.label()}"
