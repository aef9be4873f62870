"""The question a read is, the node it is put to, and the ways a node declines.

A :class:`Question` is what every node receives (its ``to_dict`` is the wire
form the fleet scatter sends); :class:`NodeScope` is what one node answers
from; a :class:`QuestionRefused` is a node declining rather than guessing.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.events import format_timestamp, parse_timestamp
from crewlet.queue.topics import DEFAULT_EVENT_RETENTION_HOURS

#: 2: a question's ``only`` and the ``kept`` question (rows a custody batch holds on two stores for a moment).
PROTOCOL_VERSION = 2

EVENTS = "events"
EVENT = "event"
EVENT_SERIES = "event_series"
TRACE = "trace"
TURNS = "turns"
TURN = "turn"
#: The fleet's own questions (eventstore.fanout): exactly these turns' rows from every node's
#: share; each listed seat's newest turn; the live projection's counters over a window.
TURN_ROWS = "turn_rows"
LAST_TURNS = "last_turns"
COUNTS = "counts"
#: Tokens per model per company day from the phases' rounds (``key`` the company's zone, ``filters.since`` the first day).
MODEL_SPEND = "model_spend"
#: Where a delivery is now (``key`` the delivery id; ``keys`` the triggers its wakes became, on the second round).
DELIVERY = "delivery"
#: Which of ``keys`` (row ids another node named as unsettled) this node keeps settled (eventstore.fanout.kept).
KEPT = "kept"
KINDS: tuple[str, ...] = (
    EVENTS, EVENT, EVENT_SERIES, TRACE, TURNS, TURN, TURN_ROWS, LAST_TURNS, COUNTS, MODEL_SPEND, DELIVERY, KEPT,
)

#: The key of a node's part naming, by id, the rows of unsettled custody batches its read could reach (present
#: only when it names any, so a fleet without a stateless node sends nothing new).
K_UNSETTLED = "unsettled"
#: The key of a node's part naming, of those, the rows whose batch's claim names this node: the store that keeps
#: them for good, so the one the asker asks for them (the other holder may drop its copy meanwhile).
K_UNSETTLED_OWN = "unsettled_own"
#: The key of a ``kept`` answer: the ids of those asked about that this node keeps settled.
K_KEPT = "kept"

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
#: The most bars one series may have: a 30-day window at 1h is 720.
MAX_BARS = 2000
#: A trace or a turn with more rows than this is cut, oldest kept, and says so.
MAX_DETAIL_ROWS = 5000


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
    one; ``keys`` the turns (``turn_rows``) or seats (``last_turns``) a fleet
    question is about, and ``detail`` asks ``turn_rows`` for every row rather
    than the fold's. ``window_us``/``bucket_us`` shape a series (``window_us``
    alone the window ``counts`` sums). ``cursor`` is the opaque position a
    previous page returned. ``only`` restricts the read to exactly these row
    ids, the rows of unsettled custody batches among them included, and names
    none (the asker's second ask of a round, :mod:`eventstore.fanout.kept`).
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
    keys: tuple[str, ...] = ()
    detail: bool = False
    only: tuple[str, ...] = ()

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
            "keys": list(self.keys),
            "detail": self.detail,
            "only": list(self.only),
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
            keys=tuple(str(k) for k in raw.get("keys") or ()),
            detail=bool(raw.get("detail")),
            only=tuple(str(k) for k in raw.get("only") or ()),
        )


class Custody:
    """How one fleet read of this node's store treats the rows of custody batches it has not settled.

    Without ``only`` the read counts and lists the rows it keeps settled
    (``custody_batch = ''``) and every WHERE it runs is recorded in
    ``reaches``, so the node can name the unsettled rows the same read would
    have reached (:func:`eventstore.questions.sql.unsettled_rows`). With
    ``only`` it reads exactly those ids, settled or not, and names nothing.
    """

    def __init__(self, only: tuple[str, ...] = ()) -> None:
        self.only = tuple(only)
        self.reaches: list[Any] = []


@dataclass(frozen=True)
class NodeScope:
    """What a node answers from: its id (named in the coverage), its retention bound, its store.

    ``custody`` is set for a fleet read's part (:func:`eventstore.fanout.node_part`); None reads every row the store
    holds, as a store of one node's own history is read.
    """

    node_id: str
    retention_hours: float = DEFAULT_EVENT_RETENTION_HOURS
    using: str = EVENTS_ALIAS
    custody: Optional[Custody] = field(default=None, compare=False)
