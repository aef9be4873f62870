"""The history reads as questions, and this node's answer to each.

Design (Reading the fleet's history): a read is a question object — its kind,
its filters, the asker's instant, a cursor, the protocol version — answered by
a per-node function, so the fleet read can scatter the same question to every
node and merge what comes back. One node today, and every answer already
carries ``coverage`` and ``at`` so nothing changes shape when there are more.

Rules every answer here keeps:

* The instant is the asker's, read once per question to the microsecond. A
  question without one is refused (:class:`MissingInstant`), never answered
  as of this node's clock; so is a question of another protocol version
  (:class:`UnsupportedVersion`).
* The history is ``[at - retention, at]``, both ends inclusive, for every kind
  (a row exactly at the floor is not older than the bound; retention keeps it too).
* Pages are newest first in (timestamp, id) order, and a cursor is the position
  of the last row handed out, so a walk visits every row exactly once — rows
  sharing a microsecond included.

The answer functions are pure in the sense that matters to the fleet: a
question in, plain JSON-ready dicts out, nothing read from this node's clock.
They run raw SQL (PostgreSQL and SQLite alike) over ``eventstore_event``.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from operator import itemgetter
from typing import Any, Callable, Iterable, Optional, Sequence

from django.db import connections

from crewlet.db_router import EVENTS_ALIAS
from crewlet.events import CATEGORIES, NOT_FED, format_timestamp, parse_timestamp
from eventstore.rows import COLUMNS

PROTOCOL_VERSION = 1

EVENTS = "events"
EVENT = "event"
EVENT_SERIES = "event_series"
TRACE = "trace"
TURNS = "turns"
TURN = "turn"
KINDS: tuple[str, ...] = (EVENTS, EVENT, EVENT_SERIES, TRACE, TURNS, TURN)

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
#: The most bars one series may have: a 30-day window at 1h is 720.
MAX_BARS = 2000
#: A trace or a turn with more rows than this is cut, oldest kept, and says so.
MAX_DETAIL_ROWS = 5000

TABLE = "eventstore_event"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)

#: Columns of a listing row: the tags, never the payload.
LIST_COLUMNS: tuple[str, ...] = tuple(
    c for c in COLUMNS if c not in ("input_tokens", "output_tokens", "body")
)

# The rows a turn is folded from.
TURN_STARTED = "agent_turn_started"
TURN_COMPLETED = "agent_turn_completed"
PHASE_COMPLETED = "agent_phase_completed"
TURN_STOPPED = "agent_turn_stopped"
TURN_FAILURES: tuple[str, ...] = ("turn.guard_breach", "llm_unavailable", "budget_exhausted")
FOLD_TYPES: tuple[str, ...] = (TURN_STARTED, TURN_COMPLETED, PHASE_COMPLETED, TURN_STOPPED, *TURN_FAILURES)
#: The fold reads bodies of these only: a phase's body holds whole prompts.
_BODY_TYPES: tuple[str, ...] = (TURN_STARTED, TURN_COMPLETED)

OUTCOME_OK = "ok"
OUTCOME_FAILED = "failed"
OUTCOME_STOPPED = "stopped"
OUTCOME_SUSPENDED = "suspended"
OUTCOME_RUNNING = "running"


# -- refusals -----------------------------------------------------------------


class QuestionRefused(ValueError):
    """This node will not answer the question; ``reason`` is what the coverage names."""

    reason = "refused"


class UnsupportedVersion(QuestionRefused):
    reason = "protocol version"


class MissingInstant(QuestionRefused):
    reason = "no instant"


class BadQuestion(QuestionRefused):
    """A field the question cannot carry (an unknown kind, a category outside the set, a bad cursor)."""

    reason = "bad question"


# -- the question ---------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """The filters of an events page, a series, and (seat/node/trace/conversation/since/until) a turns page.

    ``since`` is inclusive and ``until`` exclusive. ``feed_only`` keeps out the
    types the activity feed never holds (``crewlet.events.NOT_FED``).
    """

    categories: tuple[str, ...] = ()
    type: str = ""
    seat: str = ""
    trace_id: str = ""
    conversation_key: str = ""
    partition_key: str = ""
    node: str = ""
    since: Optional[datetime] = None
    until: Optional[datetime] = None
    feed_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["categories"] = list(self.categories)
        out["since"] = format_timestamp(self.since) if self.since else None
        out["until"] = format_timestamp(self.until) if self.until else None
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Filters":
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known}
        kwargs["categories"] = tuple(kwargs.get("categories") or ())
        for name in ("since", "until"):
            if kwargs.get(name):
                kwargs[name] = parse_timestamp(kwargs[name])
        return cls(**kwargs)


@dataclass(frozen=True)
class Question:
    """One read, as every node receives it.

    ``at`` is the asker's instant (aware, microseconds), read once per
    question. ``key`` names the event, trace or turn for the kinds that read
    one. ``window_us``/``bucket_us`` shape a series. ``cursor`` is the opaque
    position a previous page returned.
    """

    kind: str
    at: Optional[datetime] = None
    version: int = PROTOCOL_VERSION
    filters: Filters = field(default_factory=Filters)
    cursor: str = ""
    limit: int = DEFAULT_LIMIT
    key: str = ""
    window_us: int = 0
    bucket_us: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The question on the wire (the fleet scatter sends exactly this)."""
        return {
            "kind": self.kind,
            "at": format_timestamp(self.at) if self.at is not None else None,
            "version": self.version,
            "filters": self.filters.to_dict(),
            "cursor": self.cursor,
            "limit": self.limit,
            "key": self.key,
            "window_us": self.window_us,
            "bucket_us": self.bucket_us,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Question":
        at = raw.get("at")
        return cls(
            kind=str(raw.get("kind", "")),
            at=parse_timestamp(at) if isinstance(at, str) and at else None,
            version=int(raw.get("version", 0)),
            filters=Filters.from_dict(raw.get("filters") or {}),
            cursor=str(raw.get("cursor") or ""),
            limit=int(raw.get("limit") or DEFAULT_LIMIT),
            key=str(raw.get("key") or ""),
            window_us=int(raw.get("window_us") or 0),
            bucket_us=int(raw.get("bucket_us") or 0),
        )


@dataclass(frozen=True)
class NodeScope:
    """What a node answers from: its id (named in the coverage), its retention bound, its store."""

    node_id: str
    retention_hours: float = 720.0
    using: str = EVENTS_ALIAS


# -- small pure helpers -------------------------------------------------------------


def to_us(ts: datetime) -> int:
    """Microseconds since the Unix epoch (exact: no float in between)."""
    return (ts - EPOCH) // _US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


_DAY_US = 86_400_000_000
_EPOCH_ORDINAL = EPOCH.toordinal()
#: "00".."59": a table lookup is cheaper than a format spec, per field, per row.
_TWO_DIGITS: tuple[str, ...] = tuple(f"{n:02d}" for n in range(60))
#: "YYYY-MM-DDT" by day since the epoch: a page's rows span a handful of days.
_DAY_PREFIXES: dict[int, str] = {}
_DAY_PREFIXES_MAX = 4096


def _day_prefix(days: int) -> str:
    day = date.fromordinal(_EPOCH_ORDINAL + days)
    prefix = f"{day.year:04d}-{day.month:02d}-{day.day:02d}T"
    if len(_DAY_PREFIXES) >= _DAY_PREFIXES_MAX:
        _DAY_PREFIXES.clear()  # bounded; a refill costs one date per day
    _DAY_PREFIXES[days] = prefix
    return prefix


def format_us(us: int) -> str:
    """``format_timestamp(from_us(us))`` to the byte, by arithmetic: a page formats hundreds.

    The date part is computed once per day and remembered; the time of day is
    divisions and table lookups, no datetime built.
    """
    days, of_day = divmod(us, _DAY_US)
    prefix = _DAY_PREFIXES.get(days) or _day_prefix(days)
    secs, frac = divmod(of_day, 1_000_000)
    mins, sec = divmod(secs, 60)
    hour, minute = divmod(mins, 60)
    two = _TWO_DIGITS
    return f"{prefix}{two[hour]}:{two[minute]}:{two[sec]}.{frac:06d}Z"


def us_sql(vendor: str, expr: str = "ts") -> str:
    """SQL for a timestamp expression as exact microseconds since the epoch.

    Reads return timestamps this way rather than as datetimes: it is exact, it
    is what the cursor and the bars are made of, and it skips a per-row
    timestamp parse in the database driver.
    """
    if vendor == "postgresql":
        return f"(EXTRACT(EPOCH FROM {expr}) * 1000000)::bigint"
    if vendor == "sqlite":
        # Django keeps an SQLite datetime as 'YYYY-MM-DD HH:MM:SS[.ffffff]' (UTC).
        return f"(CAST(strftime('%%s', {expr}) AS INTEGER) * 1000000 + CAST(substr({expr}, 21, 6) AS INTEGER))"
    raise NotImplementedError(f"event store reads on {vendor}")


def _list_sql(vendor: str) -> str:
    return ", ".join(f"{us_sql(vendor)} AS ts_us" if c == "ts" else c for c in LIST_COLUMNS)


def instant(now: Optional[datetime] = None) -> datetime:
    """The asker's instant: the clock read once, UTC, at the store's microsecond resolution."""
    value = now if now is not None else datetime.now(timezone.utc)
    return value.astimezone(timezone.utc)


_DURATION = re.compile(r"([1-9][0-9]{0,5})([smhd])")
_UNIT_US = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}


#: The same rule as the OpenAPI pattern of ``window`` and ``bucket``.
DURATION_PATTERN = "^" + _DURATION.pattern + "$"


def parse_duration(text: str) -> int:
    """``15m``, ``1h``, ``24h``, ``7d`` as microseconds; anything else is a ValueError.

    Exactly :data:`DURATION_PATTERN` (no surrounding blanks): the schema and the
    server accept the same strings.
    """
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError("must be a whole number followed by s, m, h or d (for example 15m, 1h, 7d)")
    return int(match.group(1)) * _UNIT_US[match.group(2)]


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


def coverage(node_id: str, *, answered: bool = True, error: str = "") -> dict[str, Any]:
    return {"nodes": [{"id": node_id, "answered": answered, "error": error}], "complete": answered}


# -- the answers -------------------------------------------------------------------------


def check(question: Question) -> datetime:
    """Refuse what this node must not answer; returns the instant."""
    if question.version != PROTOCOL_VERSION:
        raise UnsupportedVersion(
            f"question speaks protocol version {question.version}; this node speaks {PROTOCOL_VERSION}"
        )
    if question.at is None:
        raise MissingInstant("a question must carry the asker's instant")
    if question.at.tzinfo is None:
        raise BadQuestion("the instant must carry a time zone")
    if question.kind not in KINDS:
        raise BadQuestion(f"unknown question kind {question.kind!r}")
    bad = [c for c in question.filters.categories if c not in CATEGORIES]
    if bad:
        raise BadQuestion(f"unknown category {bad[0]!r}")
    return question.at.astimezone(timezone.utc)


def answer(question: Question, scope: NodeScope) -> dict[str, Any]:
    """This node's answer to ``question``; raises QuestionRefused rather than guessing."""
    at = check(question)
    body = _ANSWERERS[question.kind](question, at, scope)
    body["coverage"] = coverage(scope.node_id)
    body["at"] = format_timestamp(at)
    return body


def refusal(question: Question, scope: NodeScope, exc: QuestionRefused) -> dict[str, Any]:
    """What the asker records for a node that refused: named in the coverage, nothing counted."""
    at = question.at
    return {
        "coverage": coverage(scope.node_id, answered=False, error=f"{exc.reason}: {exc}"),
        "at": format_timestamp(at) if at is not None else None,
    }


class _Sql:
    """A WHERE clause being built, with its parameters in order."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.clauses: list[str] = []
        self.params: list[Any] = []

    def ts(self, value: datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def add(self, clause: str, *params: Any) -> None:
        self.clauses.append(clause)
        self.params.extend(params)

    def history(self, at: datetime, scope: NodeScope, floor: Optional[datetime] = None) -> None:
        """The asker's history: ``[max(at - retention, floor), at]``."""
        lower = at - timedelta(hours=scope.retention_hours)
        if floor is not None and floor > lower:
            lower = floor
        self.add("ts >= %s", self.ts(lower))
        self.add("ts <= %s", self.ts(at))

    def filters(self, f: Filters) -> None:
        if f.categories:
            self.add(f"category IN ({', '.join(['%s'] * len(f.categories))})", *f.categories)
        for column in ("type", "node", "trace_id"):
            value = getattr(f, column)
            if value:
                self.add(f"{column} = %s", value)
        for column in ("seat", "conversation_key", "partition_key"):
            value = getattr(f, column)
            if value:
                # The redundant "> ''" is the partial index's own predicate, so the planner can use it.
                self.add(f"{column} = %s AND {column} > ''", value)
        if f.since is not None:
            self.add("ts >= %s", self.ts(f.since))
        if f.until is not None:
            self.add("ts < %s", self.ts(f.until))
        if f.feed_only and NOT_FED:
            kept_out = sorted(NOT_FED)
            self.add(f"type NOT IN ({', '.join(['%s'] * len(kept_out))})", *kept_out)

    def before(self, ts_column: str, key_column: str, ts: datetime, key: str) -> None:
        """Strictly before (ts, key) in (ts, key) order: the cursor's cut."""
        self.add(f"({ts_column}, {key_column}) < (%s, %s)", self.ts(ts), key)

    @property
    def where(self) -> str:
        return " AND ".join(self.clauses) if self.clauses else "TRUE"


def _fetch(scope: NodeScope, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connections[scope.using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


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


def _answer_events(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    limit = max(1, min(int(question.limit), MAX_LIMIT))
    q = _Sql(connections[scope.using])
    q.history(at, scope)
    q.filters(question.filters)
    if question.cursor:
        ts, key = decode_cursor("e", question.cursor)
        q.before("ts", "id", ts, key)
    sql = f"SELECT {_list_sql(q.connection.vendor)} FROM {TABLE} WHERE {q.where} ORDER BY ts DESC, id DESC LIMIT %s"
    fetched = _fetch(scope, sql, [*q.params, limit + 1])
    rows = [list_row(values) for values in fetched[:limit]]
    next_cursor = None
    if len(fetched) > limit:
        last = fetched[limit - 1]
        next_cursor = encode_cursor("e", last[1], last[0])
    return {"events": rows, "next_cursor": next_cursor}


def _answer_event(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    q = _Sql(connections[scope.using])
    q.add("id = %s", question.key)
    q.history(at, scope)
    fetched = _fetch(scope, f"SELECT {_list_sql(q.connection.vendor)}, body FROM {TABLE} WHERE {q.where}", q.params)
    if not fetched:
        return {"event": None}
    values = fetched[0]
    row = list_row(values[:-1])
    wire = json.loads(values[-1])
    row["wire"] = wire
    if wire.get("type") == "inbound_delivery":
        # The provider's exact bytes, as the operator matches them against their console.
        row["provider_body"] = wire.get("body", "")
        row["provider_body_encoding"] = wire.get("body_encoding", "")
    return {"event": row}


def series_grid(at: datetime, window_us: int, bucket_us: int, retention_hours: float) -> tuple[int, int, int]:
    """(lower_us, origin_us, bars): where counting starts, the first bar's start, how many bars.

    Bars sit on a grid aligned to the Unix epoch; the first is the bucket the
    window's lower edge falls in — the window clipped to the history when it
    reaches past it — and the last is the bucket holding ``at``, cut there.
    """
    at_us = to_us(at)
    lower = max(at_us - window_us, to_us(at - timedelta(hours=retention_hours)))
    origin = lower - lower % bucket_us
    bars = (at_us - at_us % bucket_us - origin) // bucket_us + 1
    return lower, origin, bars


def _bucket_sql(vendor: str) -> str:
    """The bar index of a row's ``ts`` given (origin_us, bucket_us) parameters, in exact integers."""
    return f"({us_sql(vendor)} - %s) / %s"


def _answer_series(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    window_us, bucket_us = question.window_us, question.bucket_us
    if window_us <= 0 or bucket_us <= 0:
        raise BadQuestion("a series needs a positive window and bucket")
    if bucket_us > window_us:
        raise BadQuestion("the bucket must not be longer than the window")
    lower_us, origin_us, count = series_grid(at, window_us, bucket_us, scope.retention_hours)
    if count > MAX_BARS:
        raise BadQuestion(f"{count} bars is more than {MAX_BARS}")
    connection = connections[scope.using]
    q = _Sql(connection)
    q.history(at, scope, floor=from_us(lower_us))
    q.filters(question.filters)
    bucket = _bucket_sql(connection.vendor)
    sql = (
        f"SELECT {bucket} AS bar, category, COUNT(*), SUM(CASE WHEN failed THEN 1 ELSE 0 END)"
        f" FROM {TABLE} WHERE {q.where} GROUP BY 1, 2"
    )
    at_us = to_us(at)
    bars = []
    for i in range(count):
        start = origin_us + i * bucket_us
        bars.append(
            {
                "start": format_timestamp(from_us(start)),
                "end": format_timestamp(from_us(min(start + bucket_us, at_us))),
                "total": 0,
                "failed": 0,
                "by_category": {},
                "partial": i == 0 and lower_us > origin_us,
            }
        )
    for index, category, total, failed in _fetch(scope, sql, [origin_us, bucket_us, *q.params]):
        bar = bars[int(index)]
        bar["total"] += int(total)
        bar["failed"] += int(failed or 0)
        if category in CATEGORIES:
            bar["by_category"][category] = bar["by_category"].get(category, 0) + int(total)
    return {"bars": bars, "window_us": window_us, "bucket_us": bucket_us}


def finish_series(merged: dict[str, Any]) -> dict[str, Any]:
    """The asker's last step: drop a partial first bar, after every node's bars are summed."""
    bars = merged.get("bars") or []
    if bars and bars[0].get("partial"):
        bars = bars[1:]
    merged["bars"] = [{k: v for k, v in bar.items() if k != "partial"} for bar in bars]
    return merged


def _detail_rows(scope: NodeScope, column: str, value: str, at: datetime) -> tuple[list[tuple[Any, ...]], bool]:
    """Every listing row whose ``column`` is ``value``, oldest first, cut at MAX_DETAIL_ROWS."""
    q = _Sql(connections[scope.using])
    q.add(f"{column} = %s", value)
    q.history(at, scope)
    sql = f"SELECT {_list_sql(q.connection.vendor)} FROM {TABLE} WHERE {q.where} ORDER BY ts, id LIMIT %s"
    fetched = _fetch(scope, sql, [*q.params, MAX_DETAIL_ROWS + 1])
    return fetched[:MAX_DETAIL_ROWS], len(fetched) > MAX_DETAIL_ROWS


def span_tree(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Listing rows grouped into spans (``span_id``), hung under their parents (``parent_span_id``).

    A span whose parent is not in the trace is a root; so is any span caught
    in a parent loop, so no row is ever lost from the tree. Events inside a
    span and spans under a parent are in (timestamp, id) order.
    """
    spans: dict[str, dict[str, Any]] = {}
    for row in rows:
        span = spans.get(row["span_id"])
        if span is None:
            span = spans[row["span_id"]] = {
                "span_id": row["span_id"],
                "parent_span_id": row["parent_span_id"],
                "events": [],
                "children": [],
            }
        span["events"].append(row)
    roots: list[dict[str, Any]] = []
    for span_id, span in spans.items():
        parent = span["parent_span_id"]
        if parent and parent != span_id and parent in spans and not _loops(spans, span_id):
            spans[parent]["children"].append(span)
        else:
            roots.append(span)

    def first(span: dict[str, Any]) -> tuple[str, str]:
        head = span["events"][0]
        return head["timestamp"], head["id"]
    for span in spans.values():
        span["children"].sort(key=first)
    roots.sort(key=first)
    return roots



def _loops(spans: dict[str, dict[str, Any]], start: str) -> bool:
    """Whether following parents from ``start`` comes back to it (a malformed trace).

    Every span on such a loop becomes a root; a span whose ancestry merely
    runs into a loop hangs under it as usual.
    """
    seen = {start}
    current = spans[start]["parent_span_id"]
    while current in spans:
        if current == start:
            return True
        if current in seen:
            return False
        seen.add(current)
        current = spans[current]["parent_span_id"]
    return False


def _answer_trace(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    fetched, truncated = _detail_rows(scope, "trace_id", question.key, at)
    rows = [list_row(values) for values in fetched]
    return {"trace_id": question.key, "total": len(rows), "truncated": truncated, "spans": span_tree(rows)}


# -- turns ----------------------------------------------------------------------------------


def fold_turn(turn_id: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One turn, folded from its rows in (timestamp, id) order.

    Each row: ``type``, ``timestamp`` (datetime), ``node``, ``seat``,
    ``conversation_key``, ``trace_id``, ``input_tokens``, ``output_tokens``,
    ``failed``, and ``body`` (the parsed event) for starts and completions.
    A turn resumed after parking on a coding run has several starts and
    completions under one id: it started at the first start and its outcome
    is the last segment's. Tokens are the completions' when they carry any,
    else the sum of the phases'.
    """
    starts = [r for r in rows if r["type"] == TURN_STARTED]
    completions = [r for r in rows if r["type"] == TURN_COMPLETED]
    phases = [r for r in rows if r["type"] == PHASE_COMPLETED]
    first_start = starts[0] if starts else None
    last_start = starts[-1] if starts else None
    last_completion = completions[-1] if completions else None
    since_start = (lambda r: last_start is None or r["timestamp"] >= last_start["timestamp"])

    ended: Optional[datetime] = None
    if last_completion is not None and since_start(last_completion):
        body = last_completion.get("body") or {}
        ended = last_completion["timestamp"]
        if last_completion["failed"] or body.get("failed") is True:
            outcome = OUTCOME_FAILED
        elif body.get("stopped") is True:
            outcome = OUTCOME_STOPPED
        elif body.get("suspended") is True:
            outcome = OUTCOME_SUSPENDED
        else:
            outcome = OUTCOME_OK
    else:
        failures = [r for r in rows if r["type"] in TURN_FAILURES and since_start(r)]
        stops = [r for r in rows if r["type"] == TURN_STOPPED and since_start(r)]
        if failures:
            outcome, ended = OUTCOME_FAILED, failures[-1]["timestamp"]
        elif stops:
            outcome, ended = OUTCOME_STOPPED, stops[-1]["timestamp"]
        else:
            outcome = OUTCOME_RUNNING

    tokens_in = sum(r["input_tokens"] for r in completions)
    tokens_out = sum(r["output_tokens"] for r in completions)
    if tokens_in == 0 and tokens_out == 0:
        tokens_in = sum(r["input_tokens"] for r in phases)
        tokens_out = sum(r["output_tokens"] for r in phases)

    start_body = (first_start or {}).get("body") or {}
    head = first_start or (rows[0] if rows else {})
    started = first_start["timestamp"] if first_start else None
    return {
        "turn_id": turn_id,
        "seat": head.get("seat", ""),
        "nodes": sorted({r["node"] for r in rows if r["node"]}),
        "conversation_key": head.get("conversation_key", ""),
        "trace_id": head.get("trace_id", ""),
        "trigger": {
            "type": start_body.get("trigger_type", ""),
            "event_id": start_body.get("trigger_event_id", ""),
        }
        if first_start
        else None,
        "work_item": start_body.get("work_item"),
        "started": format_timestamp(started) if started else None,
        "ended": format_timestamp(ended) if ended else None,
        "duration_ms": (ended - started) // timedelta(milliseconds=1) if started and ended else None,
        "outcome": outcome,
        "segments": len(starts),
        "phases": len(phases),
        "tokens": {"input": tokens_in, "output": tokens_out, "total": tokens_in + tokens_out},
    }


def _fold_columns(vendor: str) -> str:
    return f"turn_id, type, {us_sql(vendor)}, id, node, seat, conversation_key, trace_id, input_tokens, output_tokens, failed"


def _body_case(params: list[Any]) -> str:
    params.extend(_BODY_TYPES)
    return f"CASE WHEN type IN ({', '.join(['%s'] * len(_BODY_TYPES))}) THEN body END"


def _fold_row(values: Sequence[Any]) -> dict[str, Any]:
    turn_id, etype, ts, eid, node, seat, conv, trace, tin, tout, failed, body = values
    return {
        "turn_id": turn_id,
        "type": etype,
        "timestamp": from_us(ts),
        "id": eid,
        "node": node,
        "seat": seat,
        "conversation_key": conv,
        "trace_id": trace,
        "input_tokens": int(tin or 0),
        "output_tokens": int(tout or 0),
        "failed": bool(failed),
        "body": json.loads(body) if body else None,
    }


def _fold_rows(scope: NodeScope, turn_ids: Sequence[str], at: datetime) -> dict[str, list[dict[str, Any]]]:
    """Every fold row of exactly these turns (whatever the page's filters), grouped by turn."""
    if not turn_ids:
        return {}
    params: list[Any] = []
    body = _body_case(params)
    q = _Sql(connections[scope.using])
    q.add(f"turn_id IN ({', '.join(['%s'] * len(turn_ids))})", *turn_ids)
    q.add("turn_id > ''")
    q.add(f"type IN ({', '.join(['%s'] * len(FOLD_TYPES))})", *FOLD_TYPES)
    q.history(at, scope)
    sql = f"SELECT {_fold_columns(q.connection.vendor)}, {body} FROM {TABLE} WHERE {q.where} ORDER BY ts, id"
    grouped: dict[str, list[dict[str, Any]]] = {t: [] for t in turn_ids}
    for values in _fetch(scope, sql, [*params, *q.params]):
        grouped[values[0]].append(_fold_row(values))
    return grouped


def _answer_turns(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    """A page of turns, newest first by (earliest listed start, turn id), each folded whole."""
    limit = max(1, min(int(question.limit), MAX_LIMIT))
    f = question.filters
    q = _Sql(connections[scope.using])
    q.add("type = %s", TURN_STARTED)
    q.add("turn_id > ''")
    q.history(at, scope)
    q.filters(Filters(seat=f.seat, node=f.node, trace_id=f.trace_id, conversation_key=f.conversation_key, since=f.since, until=f.until))
    having = ""
    params = list(q.params)
    if question.cursor:
        ts, key = decode_cursor("t", question.cursor)
        having = " HAVING (MIN(ts), turn_id) < (%s, %s)"
        params += [q.ts(ts), key]
    sql = (
        f"SELECT turn_id, {us_sql(q.connection.vendor, 'MIN(ts)')} FROM {TABLE} WHERE {q.where}"
        f" GROUP BY turn_id{having} ORDER BY MIN(ts) DESC, turn_id DESC LIMIT %s"
    )
    page = _fetch(scope, sql, [*params, limit + 1])
    listed = [(turn_id, int(started)) for turn_id, started in page[:limit]]
    grouped = _fold_rows(scope, [t for t, _ in listed], at)
    turns = []
    for turn_id, started in listed:
        folded = fold_turn(turn_id, grouped.get(turn_id, []))
        # Paged where this page lists it: the earliest start that passed the filters.
        folded["listed_at"] = format_us(started)
        turns.append(folded)
    next_cursor = None
    if len(page) > limit:
        turn_id, started = listed[-1]
        next_cursor = encode_cursor("t", started, turn_id)
    return {"turns": turns, "next_cursor": next_cursor}


def _answer_turn(question: Question, at: datetime, scope: NodeScope) -> dict[str, Any]:
    params: list[Any] = []
    body = _body_case(params)
    q = _Sql(connections[scope.using])
    q.add("turn_id = %s", question.key)
    q.add("turn_id > ''")
    q.history(at, scope)
    sql = (
        f"SELECT {_list_sql(q.connection.vendor)}, input_tokens, output_tokens, {body} FROM {TABLE}"
        f" WHERE {q.where} ORDER BY ts, id LIMIT %s"
    )
    fetched = _fetch(scope, sql, [*params, *q.params, MAX_DETAIL_ROWS + 1])
    truncated = len(fetched) > MAX_DETAIL_ROWS
    fetched = fetched[:MAX_DETAIL_ROWS]
    if not fetched:
        return {"turn": None}
    events, fold = [], []
    width = len(LIST_COLUMNS)
    for values in fetched:
        row = list_row(values[:width])
        events.append(row)
        if row["type"] in FOLD_TYPES:
            tin, tout, raw = values[width:]
            fold.append(
                {
                    **row,
                    "timestamp": from_us(values[1]),
                    "input_tokens": int(tin or 0),
                    "output_tokens": int(tout or 0),
                    "body": json.loads(raw) if raw else None,
                }
            )
    turn = fold_turn(question.key, fold)
    turn["events"] = events
    turn["truncated"] = truncated
    return {"turn": turn}


_ANSWERERS: dict[str, Callable[[Question, datetime, NodeScope], dict[str, Any]]] = {
    EVENTS: _answer_events,
    EVENT: _answer_event,
    EVENT_SERIES: _answer_series,
    TRACE: _answer_trace,
    TURNS: _answer_turns,
    TURN: _answer_turn,
}
