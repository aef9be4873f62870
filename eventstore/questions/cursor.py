"""The opaque page position: the (timestamp, id) of the last row a page handed out.

A cursor is tagged by the read that wrote it, so one read's cursor is refused
by another rather than misread.
"""
from __future__ import annotations

import base64
import binascii
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


def encode_cursor(tag: str, ts: datetime | int, key: str) -> str:
    us = ts if isinstance(ts, int) else to_us(ts)
    raw = f"{tag}|{us}|{key}".encode("utf-8")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


#: What encode_cursor writes: unpadded URL-safe base64 (the OpenAPI pattern of ``cursor``).
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"
_CURSOR = re.compile(CURSOR_PATTERN[1:-1])
_CURSOR_US = re.compile(r"-?[0-9]{1,19}")


def decode_cursor(tag: str, text: str) -> tuple[datetime, str]:
    """The (timestamp, id) a cursor stands for; BadQuestion when it is not one of ``tag``'s.

    Only what :func:`encode_cursor` can have written decodes: base64's decoder
    would skip stray characters and ``int`` would take ``+1_0``, and a key with
    a NUL would reach PostgreSQL, which cannot compare it.
    """
    try:
        if not isinstance(text, str) or not _CURSOR.fullmatch(text):
            raise ValueError
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")
        got, us, key = raw.split("|", 2)
        if got != tag or not key or "\x00" in key or not _CURSOR_US.fullmatch(us):
            raise ValueError
        return from_us(int(us)), key
    except (ValueError, binascii.Error, UnicodeDecodeError, OverflowError):
        raise BadQuestion("not a cursor this read returned") from None
