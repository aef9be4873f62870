"""A listing row: a stored event's tags, never its payload, as every read and the live feed list it."""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Sequence

from eventstore.questions.sql import us_sql
from eventstore.questions.timefmt import format_us, to_us
from eventstore.rows import COLUMNS

#: Columns of a listing row: the tags, never the payload.
LIST_COLUMNS: tuple[str, ...] = tuple(
    c for c in COLUMNS if c not in ("input_tokens", "output_tokens", "body")
)


def list_sql(vendor: str) -> str:
    return ", ".join(f"{us_sql(vendor)} AS ts_us" if c == "ts" else c for c in LIST_COLUMNS)


_TS_AT = LIST_COLUMNS.index("ts")
#: A listing row's keys before ``timestamp``, which comes last (where ``ts`` popped and re-added put it).
_ROW_KEYS: tuple[str, ...] = tuple(c for c in LIST_COLUMNS if c != "ts")
_pick_row = itemgetter(*(i for i, c in enumerate(LIST_COLUMNS) if c != "ts"))


def list_row(values: Sequence[Any]) -> dict[str, Any]:
    """A listing row: the tags, the summary line and actor, no payload.

    ``values`` are LIST_COLUMNS in order with ``ts`` as microseconds since the
    epoch (how the reads select it). Public because the live projection's feed
    holds exactly the rows ``GET /api/events`` lists: see :func:`listing_of`.
    """
    row = dict(zip(_ROW_KEYS, _pick_row(values)))
    row["failed"] = bool(row["failed"])
    row["timestamp"] = format_us(values[_TS_AT])
    return row


def listing_of(columns: Sequence[Any]) -> dict[str, Any]:
    """The listing row of a row in COLUMNS order (what ``rows.row_for`` derives), before it is read back.

    So a live event becomes, to the byte, the row a read of the store would list.
    """
    by_name = dict(zip(COLUMNS, columns))
    return list_row([to_us(by_name["ts"]) if c == "ts" else by_name[c] for c in LIST_COLUMNS])
