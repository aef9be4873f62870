"""The node's copy of the memory of the seats it holds: apply writes (the newer wins), read, search.

Blocking calls on the ``events`` database (the node's own store); the async
side calls them through :func:`crewlet.base.db.in_store`. Search is the
store's own full-text search: FTS5 on SQLite (the ``seats_memory_fts`` table
its triggers keep), the generated column ``search`` (``to_tsvector('english',
text)``) under a GIN index on PostgreSQL; each matches any word of the query and ranks by relevance.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from django.db import connections, transaction
from django.db.models import Count

from crewlet.base.db_router import EVENTS_ALIAS
from seats.memory.models import MemoryRow
from seats.memory.rows import RowWrite

#: The words of a query searched for, at most this many.
QUERY_WORDS_MAX = 16
_WORD = re.compile(r"[^\W_]+")
#: Words too common to tell rows apart, left out of a search (PostgreSQL's english configuration drops them
#: itself; FTS5 would rank every row that has one).
STOPWORDS = frozenset(
    "a about an and are as at be but by can did do does for from had has have how i if in into is it its me my "
    "no not of on or our please so than that the their them then there these they this to up us was we were what "
    "when where which who why will with would you your".split()
)


@dataclass(frozen=True)
class Row:
    """One remembered row as a reader sees it."""

    table: str
    key: str
    value: Any
    written_at: str
    written_by: str
    turn_id: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table, "key": self.key, "value": self.value, "written_at": self.written_at,
            "written_by": self.written_by, "turn_id": self.turn_id,
        }


def _words(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _words(v)
    elif isinstance(value, list):
        for v in value:
            yield from _words(v)
    elif value is not None:
        yield str(value)


def row_text(write: RowWrite) -> str:
    """What search reads of a row: its table, key and every word of its value; nothing for a tombstone."""
    if write.deleted:
        return ""
    return " ".join([write.table.replace("_", " "), write.key, *_words(write.data)])


def _fields(write: RowWrite) -> dict[str, Any]:
    return {
        "value": write.value, "text": row_text(write), "deleted": write.deleted, "written_at": write.written_at,
        "event_id": write.event_id, "written_by": write.written_by, "turn_id": write.turn_id,
    }


def _row(model: MemoryRow) -> Row:
    return Row(
        table=model.table, key=model.key, value=json.loads(model.value),
        written_at=model.written_at.isoformat().replace("+00:00", "Z"), written_by=model.written_by, turn_id=model.turn_id,
    )


def _rows() -> Any:
    return MemoryRow.objects.using(EVENTS_ALIAS)


def apply(writes: Sequence[RowWrite]) -> int:
    """Apply each write unless the store already has a newer one of its row; how many changed the store."""
    changed = 0
    with transaction.atomic(using=EVENTS_ALIAS):
        for write in writes:
            have = _rows().filter(seat=write.seat, table=write.table, key=write.key).first()
            if have is None:
                _rows().create(seat=write.seat, table=write.table, key=write.key, **_fields(write))
            elif (have.written_at, have.event_id) < (write.written_at, write.event_id):
                for name, value in _fields(write).items():
                    setattr(have, name, value)
                have.save(using=EVENTS_ALIAS)
            else:
                continue
            changed += 1
    return changed


def replace(seat: str, writes: Sequence[RowWrite]) -> int:
    """The seat's rows become exactly ``writes`` (a replay): what this store had of it goes first. Rows kept."""
    return replace_many({seat: writes})[seat]


#: Seats named in one statement of a batch replay (well inside SQLite's bound on a statement's parameters).
_SEATS_PER_STATEMENT = 500


def replace_many(writes_by_seat: Mapping[str, Sequence[RowWrite]]) -> dict[str, int]:
    """:func:`replace` for several seats in one transaction (a node acquiring its share of a company); rows kept per seat."""
    seats = list(writes_by_seat)
    counts: dict[str, int] = dict.fromkeys(seats, 0)
    with transaction.atomic(using=EVENTS_ALIAS):
        for i in range(0, len(seats), _SEATS_PER_STATEMENT):
            _rows().filter(seat__in=seats[i:i + _SEATS_PER_STATEMENT]).delete()
        _rows().bulk_create(
            [
                MemoryRow(seat=seat, table=w.table, key=w.key, **_fields(w))
                for seat, writes in writes_by_seat.items()
                for w in writes
                if w.seat == seat
            ],
            batch_size=500,
        )
        for i in range(0, len(seats), _SEATS_PER_STATEMENT):
            kept = (
                _rows().filter(seat__in=seats[i:i + _SEATS_PER_STATEMENT], deleted=False)
                .values("seat").annotate(n=Count("id")).values_list("seat", "n")
            )
            counts.update({seat: int(n) for seat, n in kept})
    return counts


#: Seats named in one DELETE: well under SQLite's bound on a statement's parameters.
CLEAR_CHUNK = 500


def clear(seats: Sequence[str]) -> int:
    """Drop this store's copy of the seats' memory (they are no longer this node's), in one transaction.

    A node stopping lets go of its whole share at once: a transaction per
    seat was a commit each, most of a thousand-seat node's stop.
    """
    deleted = 0
    with transaction.atomic(using=EVENTS_ALIAS):
        for at in range(0, len(seats), CLEAR_CHUNK):
            count, _ = _rows().filter(seat__in=list(seats[at : at + CLEAR_CHUNK])).delete()
            deleted += int(count)
    return deleted


def get(seat: str, table: str, key: str) -> Optional[Row]:
    model = _rows().filter(seat=seat, table=table, key=key, deleted=False).first()
    return _row(model) if model is not None else None


def about(seat: str, table: str, keys: Sequence[str]) -> list[Row]:
    """The rows of ``table`` whose keys are ``keys`` (the people of a conversation), in that order."""
    found = {m.key: m for m in _rows().filter(seat=seat, table=table, key__in=list(keys), deleted=False)}
    return [_row(found[k]) for k in keys if k in found]


def listing(seat: str, table: str = "", limit: int = 100) -> list[Row]:
    """The seat's rows, newest first, of one table when ``table`` is given."""
    query = _rows().filter(seat=seat, deleted=False)
    if table:
        query = query.filter(table=table)
    return [_row(m) for m in query.order_by("-written_at", "-id")[: max(0, limit)]]


def count(seat: str) -> int:
    return int(_rows().filter(seat=seat, deleted=False).count())


def query_words(query: str) -> list[str]:
    """The words of ``query`` a search looks for (letters and digits; nothing the search syntax would read)."""
    return [w for w in (w.lower() for w in _WORD.findall(query or "")) if w not in STOPWORDS][:QUERY_WORDS_MAX]


def search(seat: str, query: str, limit: int = 5, *, table: str = "") -> list[Row]:
    """The seat's rows matching any word of ``query``, most relevant first; none for a query with no words."""
    words = query_words(query)
    if not words or limit <= 0:
        return []
    connection = connections[EVENTS_ALIAS]
    where_table = " AND r.\"table\" = %s" if table else ""
    params: list[Any] = []
    if connection.vendor == "sqlite":
        sql = (
            "SELECT r.id FROM seats_memory_fts f JOIN seats_memory_row r ON r.id = f.rowid "
            "WHERE seats_memory_fts MATCH %s AND r.seat = %s AND NOT r.deleted" + where_table + " ORDER BY f.rank LIMIT %s"
        )
        params = [" OR ".join(f'"{w}"' for w in words), seat]
    else:
        sql = (
            "SELECT r.id FROM seats_memory_row r, to_tsquery('english', %s) q "
            "WHERE r.search @@ q AND r.seat = %s AND NOT r.deleted" + where_table
            + " ORDER BY ts_rank(r.search, q) DESC, r.id DESC LIMIT %s"
        )
        params = [" | ".join(words), seat]
    params += ([table] if table else []) + [limit]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
    found = {m.id: m for m in _rows().filter(id__in=ids)}
    return [_row(found[i]) for i in ids if i in found]


__all__ = ["Row", "about", "apply", "clear", "count", "get", "listing", "query_words", "replace", "row_text", "search"]
