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

The package, by seam: :mod:`.model` (the question, the node's scope, the
refusals), :mod:`.timefmt` (exact microseconds and their wire spelling),
:mod:`.cursor` (the page position), :mod:`.sql` (the WHERE builder over the
table), :mod:`.listing` (a listing row), :mod:`.answers` (the checks, the
dispatch and the events, series and trace answers), :mod:`.turns` (the
turn fold and the turn answers) and :mod:`.counts` (the row counters the
overview and the live projection's seed read), :mod:`.spend` (tokens per model per day, from the phases' rounds) and :mod:`.deliveries` (where a delivery is now). Callers import from the package.
"""
from __future__ import annotations

from eventstore.questions.answers import (
    answer,
    answer_event,
    answer_events,
    answer_kept,
    answer_series,
    check,
    coverage,
    finish_series,
    refusal,
    series_grid,
    span_tree,
    trace_answer,
    trace_rows,
)
from eventstore.questions.counts import (
    AUXILIARY_SPEND,
    COUNTER_KEYS,
    C_EVENTS,
    C_TOKENS,
    C_TURNS_COMPLETED,
    C_TURNS_FAILED,
    SEAT_COUNTER_KEYS,
    SPEND_TYPES,
    answer_counts,
    as_count,
    count_event,
    count_rows,
    count_turn,
    new_counters,
    new_seat_counters,
    spent_tokens,
)
from eventstore.questions.cursor import EVENTS_CURSOR, TURNS_CURSOR, cursor_format, cursor_pattern, decode_cursor, encode_cursor
from eventstore.questions.deliveries import answer_delivery, fold_delivery, merged_ids, turn_ids, wake_ids
from eventstore.questions.listing import LIST_COLUMNS, list_row, listing_of
from eventstore.questions.model import (
    COUNTS,
    DEFAULT_LIMIT,
    DELIVERY,
    EVENT,
    EVENT_SERIES,
    EVENTS,
    K_KEPT,
    K_UNSETTLED,
    K_UNSETTLED_OWN,
    KEPT,
    KINDS,
    LAST_TURNS,
    MAX_BARS,
    MAX_DETAIL_ROWS,
    MAX_LIMIT,
    MODEL_SPEND,
    PROTOCOL_VERSION,
    TRACE,
    TURN,
    TURN_ROWS,
    TURNS,
    BadQuestion,
    Custody,
    Filters,
    MissingInstant,
    NodeScope,
    Question,
    QuestionRefused,
    UnsupportedVersion,
)
from eventstore.questions.spend import UNNAMED_MODEL, add_rounds, answer_model_spend, merge_model_spend, round_tokens
from eventstore.questions.sql import TABLE, unsettled_rows, us_sql
from eventstore.questions.timefmt import (
    DURATION_PATTERN,
    EPOCH,
    format_us,
    from_us,
    instant,
    parse_duration,
    to_us,
)
from eventstore.questions.turns import (
    FOLD_TYPES,
    OUTCOME_FAILED,
    OUTCOME_OK,
    OUTCOME_RUNNING,
    OUTCOME_STOPPED,
    OUTCOME_SUSPENDED,
    PHASE_COMPLETED,
    TURN_COMPLETED,
    TURN_FAILURES,
    TURN_STARTED,
    TURN_STOPPED,
    answer_last_turns,
    answer_turn_rows,
    fold_detail,
    fold_listed,
    fold_turn,
    fold_unwire,
    turn_page,
)

__all__ = [
    "AUXILIARY_SPEND",
    "BadQuestion",
    "COUNTER_KEYS",
    "COUNTS",
    "cursor_pattern",
    "C_EVENTS",
    "C_TOKENS",
    "C_TURNS_COMPLETED",
    "C_TURNS_FAILED",
    "Custody",
    "DEFAULT_LIMIT",
    "DELIVERY",
    "DURATION_PATTERN",
    "EPOCH",
    "EVENT",
    "EVENTS",
    "EVENTS_CURSOR",
    "EVENT_SERIES",
    "FOLD_TYPES",
    "Filters",
    "KEPT",
    "KINDS",
    "K_KEPT",
    "K_UNSETTLED",
    "K_UNSETTLED_OWN",
    "LAST_TURNS",
    "LIST_COLUMNS",
    "MAX_BARS",
    "MAX_DETAIL_ROWS",
    "MAX_LIMIT",
    "MODEL_SPEND",
    "MissingInstant",
    "NodeScope",
    "OUTCOME_FAILED",
    "OUTCOME_OK",
    "OUTCOME_RUNNING",
    "OUTCOME_STOPPED",
    "OUTCOME_SUSPENDED",
    "PHASE_COMPLETED",
    "PROTOCOL_VERSION",
    "Question",
    "QuestionRefused",
    "SEAT_COUNTER_KEYS",
    "SPEND_TYPES",
    "TABLE",
    "TRACE",
    "TURN",
    "TURNS",
    "TURNS_CURSOR",
    "TURN_COMPLETED",
    "TURN_FAILURES",
    "TURN_ROWS",
    "TURN_STARTED",
    "TURN_STOPPED",
    "UNNAMED_MODEL",
    "UnsupportedVersion",
    "add_rounds",
    "answer",
    "answer_counts",
    "answer_delivery",
    "answer_event",
    "answer_events",
    "answer_kept",
    "answer_last_turns",
    "answer_model_spend",
    "answer_series",
    "answer_turn_rows",
    "as_count",
    "check",
    "count_event",
    "count_rows",
    "count_turn",
    "coverage",
    "cursor_format",
    "decode_cursor",
    "encode_cursor",
    "finish_series",
    "fold_delivery",
    "fold_detail",
    "fold_listed",
    "fold_turn",
    "fold_unwire",
    "format_us",
    "from_us",
    "instant",
    "list_row",
    "listing_of",
    "merge_model_spend",
    "merged_ids",
    "new_counters",
    "new_seat_counters",
    "parse_duration",
    "refusal",
    "round_tokens",
    "series_grid",
    "span_tree",
    "spent_tokens",
    "to_us",
    "trace_answer",
    "trace_rows",
    "turn_ids",
    "turn_page",
    "unsettled_rows",
    "us_sql",
    "wake_ids",
]
