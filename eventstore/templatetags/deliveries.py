"""``{% if ev|carries_delivery %}``: whether an event row names a delivery, so the row links to the delivery's page; ``{% delivery_rows %}`` the same rule for a page's script."""
from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import json_script
from django.utils.safestring import SafeString

from eventstore.questions.deliveries import ACCEPTED_CATEGORY, NAMING_TYPES
from eventstore.questions.deliveries import carries_delivery as _carries

register = template.Library()


@register.filter
def carries_delivery(row: Any) -> bool:
    """A listing row (``type``, ``category``) whose body names a ``delivery_id``."""
    if not isinstance(row, dict):
        return False
    return _carries(str(row.get("type") or ""), str(row.get("category") or ""))


@register.simple_tag
def delivery_rows() -> SafeString:
    """The same rule for the page's script (rows the live socket adds): ``<script id="delivery-rows">``."""
    return json_script({"types": list(NAMING_TYPES), "category": ACCEPTED_CATEGORY}, "delivery-rows")
