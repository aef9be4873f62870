"""The HTTP side of the history reads: query parameters in, a question asked, the answer out.

The HTTP layer is the asker: it reads the clock (:func:`eventstore.here.clock`)
once per request (the question's ``at``), turns the query string into a :class:`~eventstore.questions.Question`
— refusing a bad or unknown parameter with 400, the parameter and the reason
— and asks the fleet (:mod:`eventstore.fanout`: this node's store read here,
every other live node asked over the broker, the parts merged, the coverage
saying who answered). A process without an engine cannot ask the fleet:
:func:`fleet` raises the one "no engine here" error
(:class:`~crewlet.engine.runtime.EngineAway`), which the API answers 503
saying so, never one store's rows as if they were the company's.
Nothing here touches SQL; the answers are :mod:`eventstore.questions`'.
"""
from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timezone
from typing import Any, Iterable, Optional

from django.http import QueryDict
from rest_framework import exceptions, status

from crewlet.engine.interfaces import FleetHistory
from crewlet.http.bodies import ERROR_BAD_PARAMETER, bad_request_body
from crewlet.events import CATEGORIES, parse_timestamp
from eventstore import fanout, here
from eventstore import questions as qs
from eventstore.questions import Filters, Question

#: Filters every events read and series takes.
EVENT_FILTERS: frozenset[str] = frozenset(
    {"category", "type", "seat", "trace_id", "conversation_key", "partition_key", "node", "since", "until", "feed_only"}
)
EVENTS_PARAMS = EVENT_FILTERS | {"limit", "cursor"}
SERIES_PARAMS = EVENT_FILTERS | {"window", "bucket"}
#: A turns read's history by thread: the turns of one conversation identity (the turns' ``conversation_key``).
CONVERSATION = "conversation"
TURNS_PARAMS = frozenset({"seat", "node", "trace_id", CONVERSATION, "since", "until", "limit", "cursor"})

DEFAULT_WINDOW = "24h"
DEFAULT_BUCKET = "1h"

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|z|[+-]\d{2}:\d{2})")
_BOOLS = {"true": True, "1": True, "false": False, "0": False}
#: A parameter value longer than this cannot be a tag the store holds (nor a cursor it made).
MAX_VALUE_LENGTH = 1000
#: The OpenAPI pattern of every text parameter: no NUL (PostgreSQL cannot hold one in text).
TEXT_PATTERN = r"^[^\x00]*$"
#: The earliest and latest instants a timestamp parameter stands for once in UTC; one past
#: either end (a local time within a day of the calendar's edge) is clamped to it.
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)
LATEST = datetime.max.replace(tzinfo=timezone.utc)


class BadParameter(exceptions.APIException):
    """400: ``{"error": "bad_parameter", "param": ..., "reason": ...}``."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "bad_parameter"

    def __init__(self, param: str, reason: str) -> None:
        self.param = param
        self.reason = reason
        super().__init__(reason)
        # APIException coerces a dict detail's values to ErrorDetail; keep plain strings.
        self.detail = bad_request_body(ERROR_BAD_PARAMETER, param, reason)


# -- the fleet this process asks -----------------------------------------------------------


def fleet() -> FleetHistory:
    """The fleet this process asks: its engine's; ``EngineAway`` (answered 503) where no engine runs."""
    return fanout.reader()


def ask(question: Question) -> dict[str, Any]:
    """Ask every live node; a node that did not answer comes back named in the coverage rather than as an error."""
    reader = fleet()
    try:
        return reader.ask(question)
    except qs.BadQuestion as exc:
        raise BadParameter("query", str(exc)) from None


# -- query parameters ----------------------------------------------------------------------------


def check_text(param: str, value: str) -> str:
    """The one rule every text a read takes (a query value, a path key) passes before it goes near SQL.

    PostgreSQL refuses a NUL in text and a lone surrogate cannot be encoded for
    either store: both would fail in the driver (a 500) rather than match
    nothing, so they are refused here, named. The length bound keeps an absurd
    value from being carried into a query at all.
    """
    if len(value) > MAX_VALUE_LENGTH:
        raise BadParameter(param, f"longer than {MAX_VALUE_LENGTH} characters")
    if "\x00" in value:
        raise BadParameter(param, "must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadParameter(param, "must be valid Unicode text (it holds a lone surrogate)") from None
    return value


def check_params(query: QueryDict, allowed: Iterable[str], *, multi: Iterable[str] = ()) -> None:
    """Refuse a parameter the route does not know (a typo must not widen the answer), one given twice,
    or a value that is not text the store can compare (:func:`check_text`)."""
    allowed = set(allowed)
    multi = set(multi)
    for name in query.keys():
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise BadParameter(check_text("query", name), f"unknown parameter; this route takes: {known}")
        values = query.getlist(name)
        if name not in multi and len(values) > 1:
            raise BadParameter(name, "given more than once")
        for value in values:
            check_text(name, value)


def _text(query: QueryDict, name: str) -> str:
    value = query.get(name)
    if value is None:
        return ""
    if value == "":
        raise BadParameter(name, "must not be empty")
    if len(value) > MAX_VALUE_LENGTH:
        raise BadParameter(name, f"longer than {MAX_VALUE_LENGTH} characters")
    return value


def _timestamp(query: QueryDict, name: str) -> Optional[datetime]:
    value = query.get(name)
    if value is None:
        return None
    if not _RFC3339.fullmatch(value.strip()):
        raise BadParameter(name, "must be an RFC 3339 timestamp with a time zone, e.g. 2025-01-31T09:30:00Z")
    try:
        return parse_timestamp(value)
    except OverflowError:
        # A valid local time whose UTC instant is past the calendar's edge: the
        # year 9999 behind UTC or the year 1 ahead of it. No row can be beyond
        # either end, so the edge itself answers exactly the same question.
        return LATEST if value.strip().startswith("9999") else EARLIEST
    except ValueError:
        raise BadParameter(name, "is not a valid date and time (years 0001 to 9999)") from None


def _bool(query: QueryDict, name: str) -> bool:
    value = query.get(name)
    if value is None:
        return False
    parsed = _BOOLS.get(value.strip().lower())
    if parsed is None:
        raise BadParameter(name, "must be true or false")
    return parsed


def _limit(query: QueryDict) -> int:
    value = query.get("limit")
    if value is None:
        return qs.DEFAULT_LIMIT
    if not re.fullmatch(r"[0-9]{1,6}", value.strip()):
        raise BadParameter("limit", f"must be a whole number from 1 to {qs.MAX_LIMIT}")
    limit = int(value)
    if not 1 <= limit <= qs.MAX_LIMIT:
        raise BadParameter("limit", f"must be from 1 to {qs.MAX_LIMIT}")
    return limit


def _cursor(query: QueryDict, tag: str) -> str:
    value = query.get("cursor")
    if value is None:
        return ""
    try:
        qs.decode_cursor(tag, value)
    except qs.BadQuestion as exc:
        raise BadParameter("cursor", str(exc)) from None
    return value


def _categories(query: QueryDict) -> tuple[str, ...]:
    out: list[str] = []
    for value in query.getlist("category"):
        for name in value.split(","):
            name = name.strip()
            if name not in CATEGORIES:
                raise BadParameter("category", f"{name!r} is not a category; the set is: {', '.join(CATEGORIES)}")
            if name not in out:
                out.append(name)
    return tuple(out)


def filters_from(query: QueryDict, *, turns: bool = False) -> Filters:
    since = _timestamp(query, "since")
    until = _timestamp(query, "until")
    if since is not None and until is not None and since > until:
        raise BadParameter("since", "must not be after until")
    common = Filters(
        seat=_text(query, "seat"),
        trace_id=_text(query, "trace_id"),
        conversation_key=_text(query, CONVERSATION if turns else "conversation_key"),
        node=_text(query, "node"),
        since=since,
        until=until,
    )
    if turns:
        return common
    return dataclasses.replace(
        common,
        categories=_categories(query),
        type=_text(query, "type"),
        partition_key=_text(query, "partition_key"),
        feed_only=_bool(query, "feed_only"),
    )


def _duration(query: QueryDict, name: str, default: str) -> tuple[str, int]:
    text = query.get(name, default)
    try:
        return text, qs.parse_duration(text)
    except ValueError as exc:
        raise BadParameter(name, str(exc)) from None


# -- one function per route: query in, answer out ------------------------------------------------


def _page(
    query: QueryDict, kind: str, allowed: Iterable[str], cursor_prefix: str, *, multi: Iterable[str] = (), turns: bool = False
) -> dict[str, Any]:
    """A list route: its filters, a page of ``limit`` rows and the cursor that continues it."""
    check_params(query, allowed, multi=multi)
    question = Question(
        kind=kind,
        at=qs.instant(here.clock()),
        filters=filters_from(query, turns=turns),
        limit=_limit(query),
        cursor=_cursor(query, cursor_prefix),
    )
    return ask(question)


def _one(query: QueryDict, kind: str, name: str, key: str) -> dict[str, Any]:
    """A route about the one thing its path names (``name``): no query parameters, a key that can be stored."""
    check_params(query, ())
    check_text(name, key)
    return ask(Question(kind=kind, at=qs.instant(here.clock()), key=key))


def events_page(query: QueryDict) -> dict[str, Any]:
    return _page(query, qs.EVENTS, EVENTS_PARAMS, qs.EVENTS_CURSOR, multi={"category"})


def event_detail(query: QueryDict, event_id: str) -> dict[str, Any]:
    return _one(query, qs.EVENT, "event_id", event_id)


def event_series(query: QueryDict) -> dict[str, Any]:
    check_params(query, SERIES_PARAMS, multi={"category"})
    window_text, window_us = _duration(query, "window", DEFAULT_WINDOW)
    bucket_text, bucket_us = _duration(query, "bucket", DEFAULT_BUCKET)
    if bucket_us > window_us:
        raise BadParameter("bucket", "must not be longer than the window")
    at = qs.instant(here.clock())
    question = Question(
        kind=qs.EVENT_SERIES,
        at=at,
        filters=filters_from(query),
        window_us=window_us,
        bucket_us=bucket_us,
    )
    answer = qs.finish_series(ask(question))
    answer["window"] = window_text
    answer["bucket"] = bucket_text
    answer.pop("window_us", None)
    answer.pop("bucket_us", None)
    return answer


def model_spend(zone: str, since: datetime) -> dict[str, Any]:
    """Tokens per model per day in ``zone`` since ``since``, from every node's phase rounds (with the coverage)."""
    question = Question(kind=qs.MODEL_SPEND, at=qs.instant(here.clock()), key=zone, filters=Filters(since=since))
    return ask(question)


def trace(query: QueryDict, trace_id: str) -> dict[str, Any]:
    return _one(query, qs.TRACE, "trace_id", trace_id)


def turns_page(query: QueryDict) -> dict[str, Any]:
    return _page(query, qs.TURNS, TURNS_PARAMS, qs.TURNS_CURSOR, turns=True)


def turn_detail(query: QueryDict, turn_id: str) -> dict[str, Any]:
    return _one(query, qs.TURN, "turn_id", turn_id)


#: How many dead letters a delivery read looks through for its wakes (the oldest first, as the broker lists them).
DEAD_LETTERS_SCANNED = 500
#: How long a delivery read waits for the broker's dead-letter listing.
DEAD_LETTERS_TIMEOUT_S = 5.0


def _live_seats(handles: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each seat's live row (the projection's) with ``positions``: its waiting wakes by place; {} where no projection runs."""
    from eventstore import projection

    live = projection.current()
    if live is None:
        return {}
    rows: dict[str, dict[str, Any]] = {}
    for handle in dict.fromkeys(handles):
        row = live.seat(handle)
        if row is not None:
            rows[handle] = {**row, "positions": live.waiting(handle)}
    return rows


def _dead_letters(event_ids: set[str]) -> Optional[dict[str, dict[str, Any]]]:
    """The dead letters holding one of ``event_ids``, by that id; None when the broker could not be asked."""
    from crewlet.engine import runtime

    try:
        letters = runtime.on_engine(lambda queue: queue.dead_letters(DEAD_LETTERS_SCANNED), DEAD_LETTERS_TIMEOUT_S)
    except Exception:  # the broker away or the engine stopping: the answer says it could not look
        return None
    found: dict[str, dict[str, Any]] = {}
    for letter in letters:
        try:
            event_id = letter.event.id
        except Exception:  # an undecodable letter holds no wake this read can name
            continue
        if event_id in event_ids:
            found[event_id] = {"ref": letter.ref, "topic": letter.topic, "deliveries": letter.deliveries}
    return found


def delivery(query: QueryDict, delivery_id: str) -> dict[str, Any]:
    """Where ``delivery_id`` is now: the fleet's rows about it folded with the live inbox facts and the dead letters.

    ``delivery`` is None when no node's history names it (the view's 404).
    """
    check_params(query, ())
    check_text("delivery_id", delivery_id)
    merged = ask(Question(kind=qs.DELIVERY, at=qs.instant(here.clock()), key=delivery_id))
    naming, following, turns = merged.pop("rows"), merged.pop("following"), merged.pop("turns")
    live = _live_seats(r["seat"] for r in naming if r["type"] == qs.deliveries.WAKE)
    folded = qs.fold_delivery(delivery_id, naming, following, turns, live)
    checked = False
    if folded is not None and any(qs.deliveries.may_be_dead(p) for p in folded["seats"]):
        triggers = {p["wake_event_id"] for p in folded["seats"]} | {p["coalesced"]["trigger_event_id"] for p in folded["seats"] if p["coalesced"]}
        dead = _dead_letters(triggers)
        if dead is not None:
            checked = True
            folded = qs.fold_delivery(delivery_id, naming, following, turns, live, dead)
    if folded is not None:
        folded["dead_letters_checked"] = checked
    return {**merged, "delivery": folded}
