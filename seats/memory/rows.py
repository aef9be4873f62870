"""A memory row on the wire: what a row may be, the ``memory_row`` message it is published as, and back.

The bounds are the one place a row is refused, with a one-line reason naming
the field, the value (clipped) and what is allowed; the tools, the reflection
and the API all write through :func:`written`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from crewlet.events import Event, new
from crewlet.events.tracing import trace_of
from crewlet.events.types import MemoryRow
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue

#: A row's value as JSON text is at most this many bytes.
VALUE_MAX_BYTES = 4096
#: A key is at most this many characters (its subject carries a digest of it, never the key).
KEY_MAX_CHARS = 200
#: A table's name: lowercase letters, digits and underscores, one subject token.
TABLE_RULE = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: The table the people a seat talks to are kept in, keyed by their identity (the wake's sender).
COUNTERPARTY_TABLE = "counterparty"
#: Who wrote a row (``memory_row.written_by``).
BY_TURN = "turn"
BY_REFLECTION = "reflection"
BY_OPERATOR = "operator"


class RowRefused(ValueError):
    """A row outside the bounds; the message is the one-line refusal."""


def _clip(value: Any, n: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= n else text[: n - 1] + "…"


def checked_table(table: Any) -> str:
    if not isinstance(table, str) or not TABLE_RULE.fullmatch(table):
        raise RowRefused(f"table={_clip(table)!r}: must be 1-64 of a-z, 0-9 and _, starting with a letter")
    return table


def checked_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > KEY_MAX_CHARS or any(ord(c) < 32 for c in key):
        raise RowRefused(f"key={_clip(key)!r}: must be 1-{KEY_MAX_CHARS} printable characters")
    return key


def value_text(value: Any) -> str:
    """``value`` as the JSON text it is stored as; refused past VALUE_MAX_BYTES or when it is not JSON."""
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RowRefused(f"value={_clip(value)!r}: must be JSON ({exc})") from exc
    if len(text.encode("utf-8")) > VALUE_MAX_BYTES:
        raise RowRefused(f"value={_clip(text)!r}: is {len(text.encode('utf-8'))} bytes as JSON; at most {VALUE_MAX_BYTES}")
    return text


@dataclass(frozen=True)
class RowWrite:
    """One write of a row as the store applies it: a value's JSON text, or a tombstone."""

    seat: str
    table: str
    key: str
    value: str
    deleted: bool
    written_at: datetime
    event_id: str
    written_by: str = ""
    turn_id: str = ""

    @property
    def data(self) -> Any:
        return None if self.deleted else json.loads(self.value)


def from_event(event: Event) -> Optional[RowWrite]:
    """The write a ``memory_row`` message carries; None for anything else on the stream."""
    body = event.data
    if not isinstance(body, MemoryRow) or not body.seat or not body.table or not body.key:
        return None
    value = "null" if body.deleted else json.dumps(body.value, ensure_ascii=False, sort_keys=True)
    return RowWrite(
        seat=body.seat, table=body.table, key=body.key, value=value, deleted=bool(body.deleted),
        written_at=event.timestamp, event_id=event.id, written_by=body.written_by, turn_id=body.turn_id,
    )


async def written(
    queue: EventQueue,
    seat: str,
    table: str,
    key: str,
    value: Any = None,
    *,
    deleted: bool = False,
    written_by: str,
    turn_id: str = "",
    conversation_key: str = "",
) -> RowWrite:
    """Check the row, publish it on its own subject of CREWLET_MEMORY (a tombstone when ``deleted``); the write."""
    checked_table(table)
    checked_key(key)
    if not deleted:
        value = json.loads(value_text(value))
    body = MemoryRow(
        seat=seat, table=table, key=key, value=None if deleted else value, deleted=deleted,
        written_by=written_by, turn_id=turn_id, conversation_key=conversation_key,
    )
    event = new(body, trace_of())
    await queue.publish(topics.memory(seat, table, key), event)
    write = from_event(event)
    assert write is not None
    return write


__all__ = [
    "BY_OPERATOR",
    "BY_REFLECTION",
    "BY_TURN",
    "COUNTERPARTY_TABLE",
    "KEY_MAX_CHARS",
    "RowRefused",
    "RowWrite",
    "VALUE_MAX_BYTES",
    "checked_key",
    "checked_table",
    "from_event",
    "value_text",
    "written",
]
