"""Replay as a workflow: dead letters filtered, previewed against the completion ledger, replayed in bulk.

An operator facing a pile of poison asks three things in order: which of
these are mine to deal with (the filter: where they came from, whose inbox,
why they were buried, how long ago), what would a replay do (the preview),
and then "replay those". The preview answers from the completion ledger
(:func:`seats.ledger.worked`), the same rows a seat's dispatch screens each
delivery against, so "will be skipped" here is exactly what the seat will do
when the replayed wake arrives: a trigger a turn already worked is acked with
``turn_trigger_skipped``, one that was not starts a turn.

A letter's reason and age are what the queue stored with it when it buried
it (``Crewlet-Dlq-Reason``, ``Crewlet-Dlq-At``). An entry from a build that
stored neither reads its reason from its bytes (the queue buries bytes that
decode as no event as ``undecodable``, everything else when its budget ran
out) and its age from its event's own timestamp.

Every letter a bulk replay takes is replayed through
:func:`eventstore.actions.replay_dead_letter`, which audits it: one
``operator_acted`` per letter, all carrying the bulk call's request id.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence

from crewlet.company.org import HANDLE_PATTERN
from crewlet.events import Event
from crewlet.events.types import DEAD_LETTER_MAX_DELIVERIES, DEAD_LETTER_REASONS, DEAD_LETTER_UNDECODABLE
from crewlet.queue import topics
from crewlet.queue.contract import DeadLetter, EventQueue
from eventstore import actions as ops
from eventstore.console.operator_views import dead_letter_row
from eventstore.questions.timefmt import parse_duration
from seats.ledger import storable_event, trigger_identity, worked

# The filter's keys: query parameters of the reads, keys of a bulk replay's ``filter``.
F_SOURCE = "source"
F_SEAT = "seat"
F_REASON = "reason"
F_OLDER_THAN = "older_than"
F_NEWER_THAN = "newer_than"
FILTER_KEYS: tuple[str, ...] = (F_SOURCE, F_SEAT, F_REASON, F_OLDER_THAN, F_NEWER_THAN)

# JSON keys a row gains in a preview, and the verdicts.
K_REASON = "reason"
K_SOURCE = "source"
K_AGE_S = "age_s"
K_WILL = "will"
K_TRIGGERS = "triggers"
K_TRIGGER = "trigger"
K_WORKED_BY = "worked_by"
K_IN_THREAD = "in_thread"
#: A trigger (or a letter with one) that no turn worked yet: replayed, it starts a turn.
WILL_RUN = "run"
#: A trigger a turn already worked: replayed, the seat acks it with ``turn_trigger_skipped``.
WILL_SKIP = "skip"
#: Bytes that decode as no event: replayed, they are dead-lettered again at once.
WILL_BURY_AGAIN = "bury_again"

#: The most dead letters one filtered read scans, oldest first.
SCAN_MAX = 5000
#: A source as events carry it, and a seat as the company file names one: what the filters take.
SOURCE_PATTERN = r"[A-Za-z0-9_.:-]{1,64}"
SEAT_PATTERN = HANDLE_PATTERN
_SOURCE = re.compile(SOURCE_PATTERN)
_SEAT = re.compile(SEAT_PATTERN)


class BadFilter(ValueError):
    """A filter refused before any broker is asked: the key it names and why."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(reason)
        self.param = param
        self.reason = reason


@dataclass(frozen=True)
class LetterFilter:
    """Which dead letters a read or a bulk replay means; an empty filter means every one."""

    source: str = ""
    seat: str = ""
    reason: str = ""
    older_than_s: Optional[float] = None
    newer_than_s: Optional[float] = None

    @property
    def empty(self) -> bool:
        return self == LetterFilter()

    def matches(self, facts: "Facts") -> bool:
        if self.source and facts.source != self.source:
            return False
        if self.seat and facts.seat != self.seat:
            return False
        if self.reason and facts.reason != self.reason:
            return False
        if self.older_than_s is not None and (facts.age_s is None or facts.age_s < self.older_than_s):
            return False
        if self.newer_than_s is not None and (facts.age_s is None or facts.age_s > self.newer_than_s):
            return False
        return True


def _clip(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:39] + "…")


def parse_filter(values: Mapping[str, Any], *, where: str = "") -> LetterFilter:
    """``values`` (query parameters or a body's ``filter``) as a filter; :class:`BadFilter` naming the first bad key.

    ``where`` prefixes the key in a refusal (``filter.`` for a body).
    """
    for key in values:
        if key not in FILTER_KEYS:
            raise BadFilter(f"{where}{str(key)[:40]}", f"unknown filter; the filters are: {', '.join(FILTER_KEYS)}")
    found: dict[str, str] = {}
    for key in FILTER_KEYS:
        if key not in values:
            continue
        value = values[key]
        if not isinstance(value, str) or not value:
            raise BadFilter(f"{where}{key}", "must be a non-empty string")
        found[key] = value
    source, seat, reason = found.get(F_SOURCE, ""), found.get(F_SEAT, ""), found.get(F_REASON, "")
    if source and not _SOURCE.fullmatch(source):
        raise BadFilter(f"{where}{F_SOURCE}", f"{_clip(source)} is no source: 1 to 64 letters, digits, '_', '.', ':' or '-'")
    if seat and not _SEAT.fullmatch(seat):
        raise BadFilter(f"{where}{F_SEAT}", f"{_clip(seat)} is no seat handle: {SEAT_PATTERN}")
    if reason and reason not in DEAD_LETTER_REASONS:
        raise BadFilter(f"{where}{F_REASON}", f"{_clip(reason)} is no reason; the reasons are: {', '.join(DEAD_LETTER_REASONS)}")
    ages: dict[str, float] = {}
    for key in (F_OLDER_THAN, F_NEWER_THAN):
        if key in found:
            try:
                ages[key] = parse_duration(found[key]) / 1e6
            except ValueError as exc:
                raise BadFilter(f"{where}{key}", f"{_clip(found[key])}: {exc}") from None
    older, newer = ages.get(F_OLDER_THAN), ages.get(F_NEWER_THAN)
    if older is not None and newer is not None and older > newer:
        raise BadFilter(f"{where}{F_OLDER_THAN}", f"must not be longer than {F_NEWER_THAN}: no letter is both")
    return LetterFilter(source=source, seat=seat, reason=reason, older_than_s=older, newer_than_s=newer)


@dataclass
class Facts:
    """What a filter and a preview read of one dead letter: its row, and its seat, source, reason and age."""

    letter: DeadLetter
    row: dict[str, Any]
    event: Optional[Event]
    seat: str
    source: str
    reason: str
    age_s: Optional[float]
    triggers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def inbox_seat(self) -> str:
        """The seat whose inbox the letter came from ("" for another topic): whose ledger screens its replay."""
        return topics.inbox_seat(self.letter.topic)

    def answer(self, *, preview: bool) -> dict[str, Any]:
        row = {**self.row, K_REASON: self.reason, K_SOURCE: self.source, K_AGE_S: None if self.age_s is None else round(self.age_s, 3)}
        if preview:
            row[K_TRIGGERS] = self.triggers
            row[K_WILL] = self.will
        return row

    @property
    def will(self) -> str:
        """What a replay of this letter does: bury it again, skip it (every trigger worked), or run it."""
        if self.event is None:
            return WILL_BURY_AGAIN
        if self.triggers and all(t[K_WILL] == WILL_SKIP for t in self.triggers):
            return WILL_SKIP
        return WILL_RUN


def facts_of(letter: DeadLetter, now: datetime) -> Facts:
    """One letter's facts; an undecodable one is still listed (its reason ``undecodable``, its age when stored)."""
    row = dead_letter_row(letter)
    try:
        event: Optional[Event] = letter.event
    except Exception:
        event = None
    reason = letter.reason or (DEAD_LETTER_UNDECODABLE if event is None else DEAD_LETTER_MAX_DELIVERIES)
    now_s = now.timestamp()
    age_s: Optional[float] = None
    if letter.buried_at_s > 0:
        age_s = max(0.0, now_s - letter.buried_at_s)
    elif event is not None and event.timestamp.year > 1:
        age_s = max(0.0, now_s - event.timestamp.timestamp())
    facts = Facts(letter, row, event, "", event.source if event is not None else "", reason, age_s)
    facts.seat = facts.inbox_seat or str(row.get("seat") or "")
    return facts


def matching(letters: Iterable[DeadLetter], wanted: LetterFilter, now: datetime, limit: int) -> tuple[list[Facts], int]:
    """The first ``limit`` letters ``wanted`` matches, oldest first, and how many matched in all."""
    out: list[Facts] = []
    matched = 0
    for letter in letters:
        facts = facts_of(letter, now)
        if wanted.matches(facts):
            matched += 1
            if len(out) < limit:
                out.append(facts)
    return out, matched


def preview(letters: Sequence[Facts]) -> None:
    """Fill each letter's triggers from the completion ledger: one ``worked()`` per seat.

    A letter's trigger is its event's identity as the seat's dispatch computes
    it (``storable_event`` then ``trigger_identity``). A letter that did not
    come from a seat's inbox has no ledger: its triggers are empty and it runs.
    """
    wanted: dict[str, dict[str, Facts]] = {}
    for facts in letters:
        if facts.event is None or not facts.inbox_seat:
            continue
        identity = trigger_identity(storable_event(facts.event))
        wanted.setdefault(facts.inbox_seat, {})[facts.letter.ref] = facts
        facts.triggers = [{K_TRIGGER: identity}]
    for seat, by_ref in wanted.items():
        done = worked(seat, (f.triggers[0][K_TRIGGER] for f in by_ref.values()))
        for facts in by_ref.values():
            trigger = facts.triggers[0]
            identity = trigger[K_TRIGGER]
            trigger[K_WORKED_BY] = done.get(identity, "")
            trigger[K_IN_THREAD] = identity in done.in_thread
            trigger[K_WILL] = WILL_SKIP if identity in done else WILL_RUN


async def scan(queue: EventQueue) -> list[DeadLetter]:
    """Every dead letter a filtered read considers, oldest first (at most :data:`SCAN_MAX`)."""
    return await queue.dead_letters(SCAN_MAX)


async def replay_each(queue: EventQueue, refs: Sequence[str], caller: ops.Caller) -> list[ops.ActResult]:
    """Replay ``refs`` one by one, each audited as its own ``operator_acted`` under the caller's request id."""
    return [await ops.replay_dead_letter(queue, ref, caller) for ref in refs]


__all__ = [
    "BadFilter",
    "FILTER_KEYS",
    "Facts",
    "LetterFilter",
    "SCAN_MAX",
    "WILL_BURY_AGAIN",
    "WILL_RUN",
    "WILL_SKIP",
    "facts_of",
    "matching",
    "parse_filter",
    "preview",
    "replay_each",
    "scan",
]
