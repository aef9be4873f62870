"""The opaque page position: the (timestamp, id) of the last row a page handed out.

A cursor is tagged by the read that wrote it, so one read's cursor is refused
by another rather than misread.
"""
from __future__ import annotations

import functools
import re
from datetime import datetime

from eventstore.questions.model import BadQuestion
from eventstore.questions.timefmt import from_us, to_us


#: The tag of each read's cursors.
EVENTS_CURSOR = "e"
TURNS_CURSOR = "t"
#: The OpenAPI ``format`` of each read's ``cursor`` parameter (a client's generator of them keys on it).
_CURSOR_FORMATS = {EVENTS_CURSOR: "events-cursor", TURNS_CURSOR: "turns-cursor"}


def cursor_format(tag: str) -> str:
    """The OpenAPI ``format`` naming the cursors ``tag``'s read writes."""
    return _CURSOR_FORMATS[tag]


#: The instants a cursor can state, in microseconds since the epoch: years 0005 to 9891, so every
#: cursor its pattern admits decodes to a datetime (the calendar's ends are a little further out).
CURSOR_MIN_US = -61_999_999_999_999_999
CURSOR_MAX_US = 249_999_999_999_999_999
_US_PATTERN = r"(?:[0-9]{1,17}|1[0-9]{17}|2[0-4][0-9]{16}|-(?:[0-9]{1,16}|[0-5][0-9]{16}|6[01][0-9]{15}))"


def cursor_pattern(tag: str) -> str:
    """The OpenAPI ``pattern`` of ``tag``'s cursors: exactly the texts :func:`decode_cursor` takes.

    A cursor is ``<tag><instant in microseconds>.<key>``, the key being the
    last row's id as it is. A client's validator (or a schema-driven generator
    such as schemathesis) tells a cursor from any other text by this pattern
    alone: whatever matches it is a position this read answers from, and
    nothing else is.
    """
    return rf"^{re.escape(tag)}{_US_PATTERN}\.[^\x00]+$"


def encode_cursor(tag: str, ts: datetime | int, key: str) -> str:
    us = ts if isinstance(ts, int) else to_us(ts)
    return f"{tag}{min(max(us, CURSOR_MIN_US), CURSOR_MAX_US)}.{key}"


def decode_cursor(tag: str, text: str) -> tuple[datetime, str]:
    """The (timestamp, id) a cursor stands for; BadQuestion when it is not one of ``tag``'s.

    Exactly what :func:`cursor_pattern` states decodes: ``int`` alone would
    take ``+1_0``, and a key with a NUL would reach PostgreSQL, which cannot
    compare it.
    """
    match = _pattern(tag).fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise BadQuestion("not a cursor this read returned")
    us, key = match.group(1), match.group(2)
    return from_us(int(us)), key


@functools.lru_cache(maxsize=32)
def _pattern(tag: str) -> re.Pattern[str]:
    """``tag``'s cursor as a compiled pattern: a pure function of the tag, and the reads use a handful of tags."""
    return re.compile(rf"{re.escape(tag)}({_US_PATTERN})\.([^\x00]+)", re.DOTALL)
