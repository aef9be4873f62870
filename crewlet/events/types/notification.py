"""Notification bodies: a surface's notification, a delivery skipped and why, wakes coalesced, a trigger skipped."""
from __future__ import annotations

import uuid
from dataclasses import field
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.registry import NOTIFICATION, register
from crewlet.events.types.base import EventBody, _DeliveryTags, _plural, _s, _SeatBody, _tail, _TurnBody

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@register("external_notification", category=NOTIFICATION)
class ExternalNotification(_SeatBody, _DeliveryTags):
    """Inbound from a third-party app webhook or chat socket, as the wake a seat receives.

    The envelope's ``source`` names the app. Per the design, the partition key
    and the conversation identity ride the free-form ``payload`` map
    (``partition_key``, ``conversation_identity``, and an engine-raised
    notification's ``trigger_position``) — not typed fields here, because
    ``partition_key`` as a promoted tag belongs to notifications_coalesced
    alone.
    """

    sender: str = ""
    title: str = ""
    body: str = ""
    url: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(event.source) if event is not None else ""
        who = _s(self.sender) or app or "someone"
        what = _s(self.title) or _s(self.event_name) or "a notification"
        via = f" via {app}" if app and app != who else ""
        return f"{who} notified {self._seat()}{via}: {what}"


@register("notification_skipped", category=NOTIFICATION)
class NotificationSkipped(EventBody, _DeliveryTags):
    """A delivery addressed to somebody was dropped. ``reason`` is one of SKIP_REASONS; ``detail`` the particulars."""

    reason: str = ""
    detail: str = ""
    seat: str = ""
    recipient: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        app = _s(event.source) if event is not None else ""
        what = f"a {app} delivery" if app else "a delivery"
        to = _s(self.seat) or _s(self.recipient)
        return f"skipped {what}" + _tail(to, " for ") + _tail(self.reason) + _tail(self.detail, " — ")


@register("notifications_coalesced", category=NOTIFICATION)
class NotificationsCoalesced(_SeatBody):
    """N same-partition inbox events merged into one digest trigger.

    Names the PARTITION that merged (``partition_key``), the only event that
    carries one; ``conversation_key`` elsewhere is the conversation identity.
    """

    partition_key: str = ""
    count: int = 0
    event_ids: list[str] = field(default_factory=list)
    duplicates_collapsed: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} merged {_plural(self.count, 'notification')} into one turn" + _tail(
            self.partition_key, " on "
        )


#: Ids of merged triggers are derived from their constituents' ids, so the
#: same partition merged twice (a redelivery) is the same trigger.
COALESCED_ID_NAMESPACE = uuid.UUID("0b8f3f52-6c1e-5d7a-9d2b-636f616c6573")


def coalesced_trigger_id(event_ids: list[str]) -> str:
    """The id of the trigger merged from ``event_ids`` (a ``notifications_coalesced`` record's, in its order).

    The turn a digest wakes names this id as its trigger; a reader that has
    the record derives it the same way the merge made it.
    """
    return str(uuid.uuid5(COALESCED_ID_NAMESPACE, "|".join(event_ids)))


@register("turn_trigger_skipped", category=NOTIFICATION)
class TurnTriggerSkipped(_TurnBody):
    """A trigger not run: already worked (ledger), answered by a later turn in its thread, or abandoned."""

    trigger_event_id: str = ""
    reason: str = ""
    detail: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} skipped a trigger" + _tail(self.reason) + _tail(self.detail, " — ")
