"""``{% if ev|carries_delivery %}``: whether an event row names a delivery, so the row links to the delivery's page."""
from __future__ import annotations

from typing import Any

from django import template

from eventstore.questions.deliveries import carries_delivery as _carries

register = template.Library()


@register.filter
def carries_delivery(row: Any) -> bool:
    """A listing row (``type``, ``category``) whose body names a ``delivery_id``."""
    if not isinstance(row, dict):
        return False
    return _carries(str(row.get("type") or ""), str(row.get("category") or ""))
