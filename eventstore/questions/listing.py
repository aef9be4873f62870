"""A listing row: a stored event's tags, never its payload, as every read and the live feed list it."""
from __future__ import annotations

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


#: The order :func:`list_row` unpacks a row in: LIST_COLUMNS, checked at import so the two never drift apart.
_UNPACKED: tuple[str, ...] = (
    "id", "ts", "type", "category", "node", "source", "trace_id", "span_id", "parent_span_id", "seat", "turn_id",
    "conversation_key", "partition_key", "actor_seat", "tool", "dir", "delegation_depth", "parent_turn_id", "failed",
    "actor", "summary",
)
if LIST_COLUMNS != _UNPACKED:  # pragma: no cover - a new column needs its place in list_row
    raise ImportError(f"list_row unpacks {_UNPACKED}, but the listing columns are {LIST_COLUMNS}")


def list_row(values: Sequence[Any]) -> dict[str, Any]:
    """A listing row: the tags, the summary line and actor, no payload.

    ``values`` are LIST_COLUMNS in order with ``ts`` as microseconds since the
    epoch (how the reads select it). Public because the live projection's feed
    holds exactly the rows ``GET /api/events`` lists: see :func:`listing_of`.

    A page shapes every one of its rows here, so the row is unpacked and built
    as one dict display (constant keys) rather than zipped key by key; the keys
    keep the order they always had, ``timestamp`` last.
    """
    (id, ts, type, category, node, source, trace_id, span_id, parent_span_id, seat, turn_id, conversation_key,
     partition_key, actor_seat, tool, dir, delegation_depth, parent_turn_id, failed, actor, summary) = values
    return {
        "id": id, "type": type, "category": category, "node": node, "source": source, "trace_id": trace_id,
        "span_id": span_id, "parent_span_id": parent_span_id, "seat": seat, "turn_id": turn_id,
        "conversation_key": conversation_key, "partition_key": partition_key, "actor_seat": actor_seat, "tool": tool,
        "dir": dir, "delegation_depth": delegation_depth, "parent_turn_id": parent_turn_id, "failed": bool(failed),
        "actor": actor, "summary": summary, "timestamp": format_us(ts),
    }


def listing_of(columns: Sequence[Any]) -> dict[str, Any]:
    """The listing row of a row in COLUMNS order (what ``rows.row_for`` derives), before it is read back.

    So a live event becomes, to the byte, the row a read of the store would list.
    """
    by_name = dict(zip(COLUMNS, columns))
    return list_row([to_us(by_name["ts"]) if c == "ts" else by_name[c] for c in LIST_COLUMNS])
