"""The label an inbound delivery's rows are filed under: its surface and the provider's event name.

Below both the typed bodies (an ``InboundDelivery`` names its own label) and
the category maps (a row is filed under it), so neither imports the other.
"""
from __future__ import annotations

from typing import Any

SURFACE_WEBHOOK = "webhook"
SURFACE_FORGE = "forge"
SURFACE_SOCKET = "socket"
SURFACES: tuple[str, ...] = (SURFACE_WEBHOOK, SURFACE_FORGE, SURFACE_SOCKET)
SOCKET_EVENT_POSTED = "posted"
UNNAMED_DELIVERY_EVENT = "unknown"


def delivery_label(surface: Any, event_name: Any) -> str:
    """``webhook:<event>``, ``forge:<event>`` or ``socket:posted`` — the label an operator matches.

    A surface outside the known three is filed as ``webhook`` (the generic
    route) rather than minting a label no filter expects; a socket delivery
    names ``posted`` unless it says otherwise; a delivery that names no event
    is ``<surface>:unknown`` rather than an empty suffix.
    """
    surf = surface if isinstance(surface, str) and surface in SURFACES else SURFACE_WEBHOOK
    name = event_name.strip() if isinstance(event_name, str) else ""
    if not name:
        name = SOCKET_EVENT_POSTED if surf == SURFACE_SOCKET else UNNAMED_DELIVERY_EVENT
    return f"{surf}:{name}"


__all__ = [
    "SOCKET_EVENT_POSTED",
    "SURFACES",
    "SURFACE_FORGE",
    "SURFACE_SOCKET",
    "SURFACE_WEBHOOK",
    "UNNAMED_DELIVERY_EVENT",
    "delivery_label",
]
