"""The live model: every seat's live facts, the feed ring and the counters, moved by each event applied.

:class:`LiveProjection` is what the engine's service and every ``/ws/stream``
tab feed (the rules it keeps are :mod:`eventstore.projection`'s docstring):
:meth:`~LiveProjection.apply` moves a seat by the event's type, puts a fed
event's row in the ring and counts it; :meth:`~LiveProjection.seed` fills it
from what :mod:`.seed` reads, merged under what the stream already said.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Deque, Optional

from crewlet.events import Event, format_timestamp, is_fed, is_stored
from crewlet.events.types import ANSWER_RESUMED
from crewlet.engine.interfaces import SeatLoops
from crewlet.company.org import Organization, Seat
from eventstore import questions as qs
from eventstore.projection.meters import K_BUDGETS, Meters
from eventstore.projection.seed import SeedData, fleet_seed, read_seed, seat_holders
from eventstore.projection.states import (
    ABANDONED_REASONS,
    ABSENT,
    BUDGET_EXHAUSTED,
    BUDGET_METERS,
    COALESCED,
    COUNTER_WINDOW,
    FEED_SIZE,
    GUARD_BREACH,
    HELD,
    HELD_NO_PROVIDER,
    HELD_SANDBOX,
    IDLE,
    K_COUNTERS,
    K_COUNTERS_SINCE,
    K_FEED,
    K_SEATS,
    K_SEEDED,
    LAST_ERROR_CHARS,
    LLM_UNAVAILABLE,
    PAUSED,
    QUEUED,
    RUN_ANSWERED,
    RUN_HOLDS,
    RUN_LETS_GO,
    RUNNING,
    SEAT_PAUSED,
    SEAT_RESUMED,
    SEAT_TYPES,
    SEEN_SIZE,
    SPAWNED,
    STOPPED,
    STOPPED_BUDGET,
    STOPPED_PROVIDER,
    TAKEN_REMEMBERED,
    TERMINATED,
    TRIGGER_SKIPPED,
    TURN_PROGRESS,
    WAKE_ID_FIELD,
    WORK_ARRIVED,
)
from eventstore.questions import (
    COUNTER_KEYS,
    TURN_COMPLETED,
    TURN_STARTED,
    TURN_STOPPED,
    as_count,
    count_event,
    count_turn,
    new_counters,
    new_seat_counters,
)
from eventstore.rows import is_failed, row_for

if TYPE_CHECKING:  # pragma: no cover
    from eventstore.fanout import FleetReads

log = logging.getLogger("crewlet.eventstore.projection")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _summary(event: Event) -> str:
    try:
        text = event.summary()
    except Exception:  # a body from an odd build must not cost the projection an event
        return event.type.replace("_", " ")
    return text if isinstance(text, str) else event.type.replace("_", " ")


def feed_row(topic: str, event: Event) -> Optional[dict[str, Any]]:
    """The feed row ``event`` becomes — exactly the ``GET /api/events`` listing row — or None when the feed holds none."""
    if not is_fed(event.type):
        return None
    columns = row_for(topic, event)
    return qs.listing_of(columns) if columns is not None else None


def turn_outcome(event: Event) -> str:
    """A completion's outcome by the store's fold rule (``questions.fold_turn``)."""
    if is_failed(event):
        return qs.OUTCOME_FAILED
    if event.field("stopped") is True:
        return qs.OUTCOME_STOPPED
    if event.field("suspended") is True:
        return qs.OUTCOME_SUSPENDED
    return qs.OUTCOME_OK


@dataclass
class SeatLive:
    """One seat's live facts; its state is derived from them (:meth:`LiveProjection._row`)."""

    present: bool = False
    absent_reason: str = ""
    #: The node running it (its seat lease's holder, as the events that moved it say).
    node: str = ""
    paused: bool = False
    pause_reason: str = ""
    paused_by: str = ""
    #: The coding runs holding its inbox (started or resumed, not parked or ended): its mail waits on the broker.
    runs: dict[str, None] = field(default_factory=dict)
    turn_id: str = ""
    #: The round the running turn has begun (its latest ``agent_turn_progress``); 0 before the first.
    round: int = 0
    #: The ids of the wakes waiting behind the running turn (or a pause), oldest first: ``queued`` counts them.
    waiting: dict[str, None] = field(default_factory=dict)
    #: Triggers a turn, a digest or a skip already took whose wake record has not arrived (yet), newest last:
    #: the record is published after the wake reaches the inbox, so it can trail its own turn's start.
    taken: dict[str, None] = field(default_factory=dict)
    #: Waiting wakes whose record names no wake id (an A2A ask or answer).
    unnamed: int = 0
    stopped: str = ""
    #: What last went wrong with its work (a failed turn, a guard breach, an abandoned trigger); "" once a turn succeeds.
    last_error: str = ""
    last_turn: Optional[dict[str, Any]] = None
    counters: dict[str, int] = field(default_factory=new_seat_counters)
    #: Whether a live event moved it: a seed never overwrites what the stream already said.
    touched: bool = False

    @property
    def queued(self) -> int:
        return len(self.waiting) + self.unnamed

    def arrived(self, wake_id: str) -> None:
        """A wake's record (``wake_id`` "" when it names none): it waits unless a turn took it or nothing holds it back."""
        if wake_id and self.taken.pop(wake_id, False) is None:
            return
        if not (self.turn_id or self.paused or self.runs):
            return
        if wake_id:
            self.waiting[wake_id] = None
        else:
            self.unnamed += 1

    def take(self, trigger_id: str) -> None:
        """A turn, a digest or a skip took ``trigger_id``: its own wake, else an unnamed one, else it is remembered."""
        if trigger_id and self.waiting.pop(trigger_id, False) is None:
            return
        if self.unnamed:
            self.unnamed -= 1
        elif not trigger_id and self.waiting:
            del self.waiting[next(iter(self.waiting))]
        if trigger_id:
            self.taken[trigger_id] = None
            while len(self.taken) > TAKEN_REMEMBERED:
                del self.taken[next(iter(self.taken))]


@dataclass
class Applied:
    """What one event did: its feed row (None when not fed), the seat row it moved (None when none)."""

    row: Optional[dict[str, Any]]
    seat: Optional[dict[str, Any]]
    fresh: bool

    @property
    def fed(self) -> bool:
        return self.row is not None


class LiveProjection:
    """The in-process live state of the company (see :mod:`eventstore.projection`).

    Mutated on the engine's loop by :meth:`apply`; :meth:`snapshot` may be
    called from any thread (a sync view), so every read and write holds one
    lock and a snapshot is a deep copy. ``company`` is the engine's company,
    read per use (a config revision swaps it): the holder the engine serves.
    ``seats`` is the engine's seat runtime when it runs one (the seed reads
    which seats this node holds, and the stored pauses, through it).
    """

    def __init__(
        self,
        company: Callable[[], Organization],
        *,
        seats: Callable[[], Optional[SeatLoops]] = lambda: None,
        feed_size: int = FEED_SIZE,
        seen_size: int = SEEN_SIZE,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.company = company
        self.seats = seats
        self.clock = clock
        self._lock = threading.RLock()
        self._seats: dict[str, SeatLive] = {}
        self._feed: Deque[dict[str, Any]] = deque(maxlen=feed_size)
        self._seen: OrderedDict[str, Optional[dict[str, Any]]] = OrderedDict()
        self._seen_size = seen_size
        self._counters = new_counters()
        self.meters = Meters()
        self._since = clock()
        self._seeded = False
        self._seed_at: Optional[datetime] = None
        #: While a seed reads the store, live events wait here (then apply in order).
        self._pending: Optional[list[tuple[str, Event]]] = None

    # -- reads ------------------------------------------------------------------------------

    @property
    def seeded(self) -> bool:
        return self._seeded

    def snapshot(self) -> dict[str, Any]:
        """``{"seats": [...], "feed": [...], "counters": {...}, "seeded": bool, "counters_since": ts}``, JSON-ready."""
        org = self.company()
        with self._lock:
            return {
                K_SEATS: [self._row(org, seat) for seat in org.seats],
                K_FEED: [dict(row) for row in self._feed],  # rows hold scalars only
                K_COUNTERS: dict(self._counters),
                K_SEEDED: self._seeded,
                K_COUNTERS_SINCE: format_timestamp(self._since),
                K_BUDGETS: self.meters.view(org),
            }

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def seat(self, handle: str) -> Optional[dict[str, Any]]:
        """One seat's row as the snapshot lists it; None for a seat the company does not have."""
        org = self.company()
        seat = org.seat_by_handle(handle)
        if seat is None:
            return None
        with self._lock:
            return self._row(org, seat)

    def waiting(self, handle: str) -> dict[str, int]:
        """The wakes waiting in ``handle``'s inbox, each by its 1-based place (oldest first)."""
        with self._lock:
            live = self._seats.get(handle)
            return {wake: n for n, wake in enumerate(live.waiting, 1)} if live is not None else {}

    def _live(self, handle: str) -> SeatLive:
        live = self._seats.get(handle)
        if live is None:
            live = self._seats[handle] = SeatLive()
        return live

    def _row(self, org: Organization, seat: Seat) -> dict[str, Any]:
        live = self._seats.get(seat.handle) or SeatLive()
        state, reason, paused_by = self._state(org, seat, live)
        if (state, reason) == (STOPPED, STOPPED_BUDGET) and not self.meters.still_stopped(seat.handle):
            state, reason = IDLE, ""  # the window that refused it reset, or its ceiling was raised
        return {
            "handle": seat.handle,
            "kind": seat.kind,
            "display_name": seat.display_name,
            "role": seat.role,
            "state": state,
            "reason": reason,
            "node": live.node if live.present else "",
            "paused_by": paused_by,
            "turn_id": live.turn_id or None,
            "round": live.round if live.turn_id else None,
            "queued": live.queued,
            "last_turn": dict(live.last_turn) if live.last_turn else None,
            "last_error": live.last_error,
            "counters": dict(live.counters),
        }

    @staticmethod
    def _state(org: Organization, seat: Seat, live: SeatLive) -> tuple[str, str, str]:
        if not seat.is_agent:
            return IDLE, "", ""
        if not live.present:
            return ABSENT, live.absent_reason, ""
        if live.paused:
            return PAUSED, live.pause_reason, live.paused_by
        if live.turn_id:
            return (QUEUED if live.queued > 0 else RUNNING), "", ""
        if live.runs:
            return HELD, HELD_SANDBOX, ""
        if not org.has_provider:
            return HELD, HELD_NO_PROVIDER, ""
        if live.stopped:
            return STOPPED, live.stopped, ""
        return IDLE, "", ""

    # -- the live feed ------------------------------------------------------------------------

    async def handler(self, topic: str, event: Event) -> None:
        """A ``subscribe_stream`` handler feeding :meth:`apply` (the engine's own stream)."""
        self.apply(topic, event)

    def apply(self, topic: str, event: Event) -> Optional[dict[str, Any]]:
        """Apply one event; the seat row it moved, or None (also for a copy applied already: idempotent by id)."""
        applied = self.applied(topic, event)
        return applied.seat if applied.fresh else None

    def applied(self, topic: str, event: Event) -> Applied:
        """Apply one event and say what it is to the feed and to its seat (for a tab's frame).

        A copy already applied (another feeder got it first) changes nothing
        but is still described: its feed row, and its seat's current row.
        """
        with self._lock:
            if self._pending is None and event.id in self._seen:  # another feeder got it first: built once
                return Applied(row=self._seen[event.id], seat=self._seat_row_of(event), fresh=False)
        row = feed_row(topic, event)
        with self._lock:
            if self._pending is not None:
                self._pending.append((topic, event))
                return Applied(row=row, seat=self._seat_row_of(event), fresh=False)
            fresh = self._apply_locked(topic, event, row)
            return Applied(row=row, seat=self._seat_row_of(event), fresh=fresh)

    def _seat_row_of(self, event: Event) -> Optional[dict[str, Any]]:
        handle = self._moved_seat(event)
        if not handle:
            return None
        org = self.company()
        seat = org.seat_by_handle(handle)
        return self._row(org, seat) if seat is not None else None

    @staticmethod
    def _moved_seat(event: Event) -> str:
        """The seat this type of event moves, or "" (of the NOT_FED types only ``agent_turn_progress`` moves one)."""
        etype = event.type
        if etype in WORK_ARRIVED:
            return _text(event.field(WORK_ARRIVED[etype]))
        if etype in SEAT_TYPES:
            return _text(event.field("seat"))
        return ""

    def _remember(self, event_id: str, row: Optional[dict[str, Any]]) -> bool:
        """Record ``event_id`` with its feed row (what a later feeder's frame shows); False when applied already."""
        if event_id in self._seen:
            return False
        self._seen[event_id] = row
        while len(self._seen) > self._seen_size:
            self._seen.popitem(last=False)
        return True

    def _apply_locked(self, topic: str, event: Event, row: Optional[dict[str, Any]]) -> bool:
        if not self._remember(event.id, row):
            return False
        counted = not (
            self._seed_at is not None and is_stored(event.type) and event.timestamp <= self._seed_at
        )  # a seeded projection already counted the store's rows up to its instant
        if counted:
            count_event(self._counters, event)
        if row is not None:
            self._feed.appendleft(row)
        if event.type == BUDGET_METERS:
            self.meters.update(event)
        handle = self._moved_seat(event)
        if handle:
            self._move(handle, event, row, counted)
        return True

    def _move(self, handle: str, event: Event, row: Optional[dict[str, Any]], counted: bool) -> None:
        live = self._live(handle)
        live.touched = True
        etype = event.type
        if etype in WORK_ARRIVED:
            field_name = WAKE_ID_FIELD.get(etype)
            wake_id = event.id if field_name == "id" else _text(event.field(field_name)) if field_name else ""
            live.arrived(wake_id)  # it waits: behind the running turn, or on the broker until the resume
            return
        if etype == SPAWNED:
            live.present, live.absent_reason, live.node = True, "", event.node or live.node
        elif etype == TERMINATED:
            if live.node and event.node and event.node != live.node:
                return  # the seat's former node letting go after its new node took it: it still runs
            live.present, live.absent_reason, live.node = False, _text(event.field("reason")), ""
            live.turn_id = ""
            live.waiting.clear()
            live.taken.clear()
            live.unnamed = 0
        elif etype == SEAT_PAUSED:
            live.paused = True
            live.pause_reason = _text(event.field("reason"))
            live.paused_by = _text(event.field("paused_by")) or _text(event.field("paused_by_seat"))
        elif etype == SEAT_RESUMED:
            live.paused, live.pause_reason, live.paused_by = False, "", ""
        elif etype in RUN_HOLDS or (etype == RUN_ANSWERED and event.field("outcome") == ANSWER_RESUMED):
            live.runs[_text(event.field("run_id")) or event.id] = None
        elif etype in RUN_LETS_GO:
            live.runs.pop(_text(event.field("run_id")), None)
        elif etype == TURN_STARTED:
            live.present, live.absent_reason = True, ""
            live.node = event.node or live.node
            live.turn_id = _text(event.field("turn_id")) or event.id
            live.round = 0
            live.take(_text(event.field("trigger_event_id")))
            live.last_turn = self._last_turn(event, row, qs.OUTCOME_RUNNING)
        elif etype == TURN_PROGRESS:
            if live.turn_id and live.turn_id == _text(event.field("turn_id")):
                live.round = as_count(event.field("round"))
        elif etype == TURN_COMPLETED:
            live.present, live.absent_reason = True, ""
            turn_id = _text(event.field("turn_id"))
            if not live.turn_id or live.turn_id == turn_id:
                live.turn_id = ""
            outcome = turn_outcome(event)
            if outcome == qs.OUTCOME_OK:
                live.stopped = live.last_error = ""  # it works again
            elif outcome == qs.OUTCOME_FAILED:
                live.last_error = (_text(event.field("error")) or "the turn failed")[:LAST_ERROR_CHARS]
            live.last_turn = self._last_turn(event, row, outcome)
            if counted:
                count_turn(live.counters, event, failed=outcome == qs.OUTCOME_FAILED)
        elif etype == TURN_STOPPED:
            turn_id = _text(event.field("turn_id"))
            if not live.turn_id or live.turn_id == turn_id:
                live.turn_id = ""
            live.last_turn = self._last_turn(event, row, qs.OUTCOME_STOPPED)
        elif etype == LLM_UNAVAILABLE:
            live.stopped = STOPPED_PROVIDER
        elif etype == BUDGET_EXHAUSTED:
            live.stopped = STOPPED_BUDGET
        elif etype == COALESCED:
            constituents = event.field("event_ids")
            for wake_id in constituents if isinstance(constituents, list) else []:
                live.take(_text(wake_id))
        elif etype == TRIGGER_SKIPPED:
            live.take(_text(event.field("trigger_event_id")))
            if _text(event.field("reason")) in ABANDONED_REASONS:
                live.last_error = f"{_text(event.field('reason'))}: {_text(event.field('detail'))}"[:LAST_ERROR_CHARS]
        elif etype == GUARD_BREACH:
            live.last_error = f"{_text(event.field('guard'))}: {_text(event.field('detail'))}"[:LAST_ERROR_CHARS]

    @staticmethod
    def _last_turn(event: Event, row: Optional[dict[str, Any]], outcome: str) -> dict[str, Any]:
        return {
            "turn_id": _text(event.field("turn_id")),
            "outcome": outcome,
            "timestamp": row["timestamp"] if row is not None else format_timestamp(event.timestamp),
            "summary": row["summary"] if row is not None else _summary(event),
            "trace_id": event.trace_id,
        }

    # -- the seed -------------------------------------------------------------------------------

    async def seed(
        self, scope: Optional[qs.NodeScope] = None, *, at: Optional[datetime] = None, fleet: Optional[FleetReads] = None
    ) -> bool:
        """Fill the feed, each seat's last turn and state, and the counters from the store — the fleet's, given ``fleet``.

        With ``fleet`` (the engine's) the seed is one fleet read: every live
        node's feed, each seat's newest turn folded from every node's half,
        and every node's counters summed, so a restarted node's screens show
        the company rather than the part of it this node published. Without
        it, this node's store alone (``scope``). Live events that arrive
        meanwhile wait and are applied after, in order; a seat a live event
        already moved keeps what the stream said. True when the store
        answered; a store that cannot is logged, and the projection goes on
        live-only rather than failing the engine.
        """
        from asgiref.sync import sync_to_async
        from django.db import DatabaseError

        instant = qs.instant(at or self.clock())
        with self._lock:
            if self._pending is None:
                self._pending = []
        org = self.company()
        seats = self.seats()
        try:
            if fleet is not None:
                data = await fleet_seed(fleet, org, instant, seats, self._feed.maxlen or FEED_SIZE)
            else:
                data = await sync_to_async(read_seed, thread_sensitive=True)(org, scope, instant, seats)
        except (DatabaseError, qs.QuestionRefused):
            log.exception("projection_seed_failed")
            self._drain()
            return False
        held = seats.held_locally() if seats is not None else {}
        try:
            holders = await sync_to_async(seat_holders, thread_sensitive=True)()
        except DatabaseError:
            log.warning("projection_seat_holders_unavailable", exc_info=True)
            holders = {}
        with self._lock:
            self._merge_seed(data, held, instant, holders)
        self._drain()
        log.info(
            "projection_seeded",
            extra={"feed": len(data.feed), "turns": len(data.turns), "at": format_timestamp(instant)},
        )
        return True

    def _drain(self) -> None:
        """Apply what waited for the seed, in arrival order, and feed live from now on."""
        with self._lock:
            pending, self._pending = self._pending or [], None
            for topic, event in pending:
                self._apply_locked(topic, event, feed_row(topic, event))

    def _merge_seed(
        self, data: SeedData, held: dict[str, bool], at: datetime, holders: Optional[dict[str, str]] = None
    ) -> None:
        merged = {row["id"]: row for row in data.feed}
        for row in self._feed:
            merged.setdefault(row["id"], row)
        ordered = sorted(merged.values(), key=lambda r: (r["timestamp"], r["id"]), reverse=True)
        self._feed.clear()
        self._feed.extend(ordered[: self._feed.maxlen])
        for row in data.feed:
            self._remember(row["id"], row)
        for handle, turn in data.turns.items():
            live = self._live(handle)
            if live.touched:
                continue
            live.present = True
            live.last_turn = turn.last_turn
            live.turn_id = turn.running
            if turn.trigger:
                live.take(turn.trigger)  # its wake's record may trail it: it is not waiting behind its own turn
            live.stopped = turn.stopped
            live.counters = dict(turn.counters)
        for handle, held_by in data.runs.items():
            live = self._live(handle)
            if not live.touched:
                live.runs = dict.fromkeys(held_by)
        for handle, row in data.pauses.items():
            live = self._live(handle)
            if live.touched:
                continue
            live.paused = bool(row["paused"])
            live.pause_reason = row["reason"] if live.paused else ""
            live.paused_by = row["paused_by"] if live.paused else ""
        for handle, node in (holders or {}).items():
            live = self._live(handle)
            if not live.touched:
                live.present, live.node = True, node
        for handle, running in held.items():
            live = self._live(handle)
            if live.touched:
                continue
            live.present = True
            if not running:
                live.turn_id = ""  # this node runs it, and nothing runs now: a started row with no end is a lost turn
        # The store's count replaces what was counted live before it: those rows are in it.
        self._counters = {k: data.counters.get(k, 0) for k in COUNTER_KEYS}
        self._since = at - COUNTER_WINDOW
        self._seed_at = at
        self._seeded = True


__all__ = ["Applied", "LiveProjection", "SeatLive", "feed_row", "turn_outcome"]
