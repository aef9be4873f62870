"""``{{ ts|clock }}``: an instant on a dashboard page, in UTC with its zone until the page's script shows it in the browser's.

The stores hold UTC (``2026-03-10T12:30:00.000500Z``); a page cut to
``12:30:00`` left the reader to guess the zone. The server writes
``<time datetime="…" title="…" data-clock="time">12:30:00 UTC</time>``; the
dashboard's script (``crewlet.localize`` in ``base.html``) rewrites the text
in the browser's zone with the zone's name (``18:00:00 GMT+5:30``), and the
title keeps the UTC instant for a hover.
"""
from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

#: What a ``<time>`` shows: the time of day, or the date and the time (``data-clock``).
FORMS = {"time": slice(11, 19), "datetime": slice(0, 19)}


@register.filter
def clock(timestamp: object, form: str = "time") -> SafeString | str:
    """The instant as a ``<time>`` element (empty text for none); ``form`` is ``time`` or ``datetime``."""
    text = str(timestamp or "")
    if not text:
        return ""
    shown = text[FORMS.get(form, FORMS["time"])].replace("T", " ")
    return format_html('<time datetime="{}" title="{} UTC" data-clock="{}">{} UTC</time>', text, text, form if form in FORMS else "time", shown)
