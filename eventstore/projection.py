"""The live projection: every seat's state, its last turn, the feed ring and the overview's counters.

Design (Broadcast Streams; Stored, not fed; the seat states): one projection
per process, fed by the broadcast stream of ``crewlet.events.>`` — the
engine's own :class:`ProjectionService` opens one, and every ``/ws/stream``
tab applies what its own stream delivers before forwarding it, so
:meth:`LiveProjection.apply` is idempotent by event id. A restarted node
seeds it from its event store (:meth:`LiveProjection.seed`), so its screens
show the company rather than an empty page.

What enters the feed. The feed is "a ring of the whole company's last few
hundred events", the rows a reader scrolls on from in ``GET /api/events``
with ``feed_only``: so it holds exactly the rows the store would hold and the
feed would show — a stored type (``is_stored``) that is fed (``is_fed``),
each row built by the store's own rule (``rows.row_for`` then
``questions.listing_of``). A live-only type (``agent_spawned``,
``agent_terminated``...) is never a row anywhere, so it never takes a place in
the ring either, yet it still moves its seat's state — those types exist to
"drive the live projection". ``auxiliary_spend`` is stored and NOT fed: it
never enters the ring and moves no seat's state; its tokens still count in
the spend counter, which is accounting, not a seat.

The seat states, by precedence (the first that holds wins):

* ``absent`` — no node is known to run it: nothing has shown it alive yet
  (``agent_spawned``, a turn of it, this process's runtime holding it, a turn
  of it in the store) or ``agent_terminated`` released it. ``reason`` is the
  release's reason.
* ``paused`` — a person paused it (``seat_paused`` until ``seat_resumed``);
  ``reason`` and ``paused_by`` are the pause's.
* ``queued`` — a turn runs and more work arrived for it meanwhile (a wake's
  record: ``external_notification``, ``scheduled_task_fired``, an A2A ask or
  answer); ``queued`` counts it, and each next turn or skipped trigger takes
  one off (a digest of N wakes takes N-1 more).
* ``running`` — a turn started (``agent_turn_started``) and has not ended
  (``agent_turn_completed`` / ``agent_turn_stopped``); ``turn_id`` is it.
* ``held`` — the inbox holds: the company names no model provider
  (``reason`` ``no_provider``, the hold's own key).
* ``stopped`` — the provider chain was exhausted (``llm_unavailable``:
  ``reason`` ``provider``) or the token budget refused (``budget_exhausted``:
  ``reason`` ``budget``), until a turn of it completes without failing.
* ``idle`` — none of the above. A person's seat (kind ``human``) is never run
  by the engine and always reads ``idle``.

The counters (the overview's): ``turns_completed`` (a completion that did not
fail; a stopped or parked one included), ``turns_failed``, ``tokens`` (input
plus output of turn completions — the sum of their phases, so phases are not
added again — and of ``auxiliary_spend``) and ``events`` (every event
applied). They count from ``counters_since``: a seeded projection starts from
its store's rows of the last 24 hours and counts on from there; an event of a
stored type stamped at or before the seed's instant is taken as counted by the
store already.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Deque, Optional

from crewlet.events import Event, format_timestamp, is_fed, is_stored
from crewlet.events import types
from crewlet.interfaces import FLEET_READS, LIVE_PROJECTION, SeatLoops, seat_loops
from crewlet.org import CompanyHolder, Organization, Seat
from crewlet.runtime import NO_ENGINE
from crewlet.queue import topics
from eventstore import questions as qs
from eventstore.questions import TURN_COMPLETED, TURN_STARTED, TURN_STOPPED
from eventstore.rows import is_failed, row_for

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine import Engine
    from crewlet.queue.contract import Closable, EventQueue
    from eventstore.fanout import FleetReads

log = logging.getLogger("crewlet.eventstore.projection")

#: The feed ring's size: "the company's last few hundred events".
FEED_SIZE = 300
#: How many applied event ids are remembered, so a second feeder's copy changes nothing.
SEEN_SIZE = 4096
#: How far back a seeded projection counts turns and tokens from the store.
COUNTER_WINDOW = timedelta(hours=24)

# -- the seat states (wire strings the dashboard styles on) ---------------------------------
IDLE = "idle"
RUNNING = "running"
QUEUED = "queued"
HELD = "held"
PAUSED = "paused"
STOPPED = "stopped"
ABSENT = "absent"
STATES: tuple[str, ...] = (IDLE, RUNNING, QUEUED, HELD, PAUSED, STOPPED, ABSENT)

#: ``reason`` of a held seat (the inbox hold's own key, seats.inbox.HOLD_NO_PROVIDER).
HELD_NO_PROVIDER = "no_provider"
#: ``reason`` of a stopped seat.
STOPPED_PROVIDER = "provider"
STOPPED_BUDGET = "budget"

# -- snapshot / seat row / counter keys -----------------------------------------------------
K_SEATS = "seats"
K_FEED = "feed"
K_COUNTERS = "counters"
K_SEEDED = "seeded"
K_COUNTERS_SINCE = "counters_since"
C_EVENTS = "events"
C_TURNS_COMPLETED = "turns_completed"
C_TURNS_FAILED = "turns_failed"
C_TOKENS = "tokens"
COUNTER_KEYS: tuple[str, ...] = (C_TURNS_COMPLETED, C_TURNS_FAILED, C_TOKENS, C_EVENTS)

# -- the event types that move a seat (each wire name read off its registered class; a turn's from the fold's) --
SPAWNED = types.AgentSpawned.event_type
TERMINATED = types.AgentTerminated.event_type
SEAT_PAUSED = types.SeatPaused.event_type
SEAT_RESUMED = types.SeatResumed.event_type
LLM_UNAVAILABLE = types.LLMUnavailable.event_type
BUDGET_EXHAUSTED = types.BudgetExhausted.event_type
COALESCED = types.NotificationsCoalesced.event_type
TRIGGER_SKIPPED = types.TurnTriggerSkipped.event_type
AUXILIARY_SPEND = types.AuxiliarySpend.event_type
#: Records of work put in a seat's inbox, and the body field naming that seat.
WORK_ARRIVED: dict[str, str] = {
    types.ExternalNotification.event_type: "seat",
    types.ScheduledTaskFired.event_type: "seat",
    types.A2AChannelOpened.event_type: "target",
    types.A2AMessageSent.event_type: "to_seat",
}
#: Types whose tokens are spend: a turn's completion (the sum of its phases,
#: which are therefore not added again) and the auxiliary model's.
SPEND_TYPES: tuple[str, ...] = (TURN_COMPLETED, AUXILIARY_SPEND)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


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


def _new_counters() -> dict[str, int]:
    return {name: 0 for name in COUNTER_KEYS}


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
    turn_id: str = ""
    queued: int = 0
    stopped: str = ""
    last_turn: Optional[dict[str, Any]] = None
    counters: dict[str, int] = field(default_factory=lambda: {C_TURNS_COMPLETED: 0, C_TURNS_FAILED: 0, C_TOKENS: 0})
    #: Whether a live event moved it: a seed never overwrites what the stream already said.
    touched: bool = False


@dataclass
class Applied:
    """What one event did: its feed row (None when not fed), the seat row it moved (None when none)."""

    row: Optional[dict[str, Any]]
    seat: Optional[dict[str, Any]]
    fresh: bool

    @property
    def fed(self) -> bool:
        return self.row is not None


class NoEngineHere(LookupError):
    """No engine runs in this process, so no projection does: its seats and their live state are not known here.

    A web-only process serves the store's reads but not the company: which
    seats there are is the running engine's company file (or its active
    revision), so a page says so rather than guess with some other company.
    ``str()`` is :data:`NO_ENGINE`, the words the dashboard's other reads use.
    """

    def __init__(self) -> None:
        super().__init__(NO_ENGINE)


class LiveProjection:
    """The in-process live state of the company (see the module docstring).

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
        self._counters = _new_counters()
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

    def _live(self, handle: str) -> SeatLive:
        live = self._seats.get(handle)
        if live is None:
            live = self._seats[handle] = SeatLive()
        return live

    def _row(self, org: Organization, seat: Seat) -> dict[str, Any]:
        live = self._seats.get(seat.handle) or SeatLive()
        state, reason, paused_by = self._state(org, seat, live)
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
            "queued": live.queued,
            "last_turn": dict(live.last_turn) if live.last_turn else None,
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
        """The seat this type of event moves, or "" (a NOT_FED type never moves one)."""
        etype = event.type
        if etype in WORK_ARRIVED:
            return _text(event.field(WORK_ARRIVED[etype]))
        if etype in _SEAT_TYPES:
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
            self._count(event)
        if row is not None:
            self._feed.appendleft(row)
        handle = self._moved_seat(event)
        if handle:
            self._move(handle, event, row, counted)
        return True

    def _count(self, event: Event) -> None:
        c = self._counters
        c[C_EVENTS] += 1
        if event.type == TURN_COMPLETED:
            c[C_TURNS_FAILED if is_failed(event) else C_TURNS_COMPLETED] += 1
        if event.type in SPEND_TYPES:
            c[C_TOKENS] += _count(event.field("input_tokens")) + _count(event.field("output_tokens"))

    def _move(self, handle: str, event: Event, row: Optional[dict[str, Any]], counted: bool) -> None:
        live = self._live(handle)
        live.touched = True
        etype = event.type
        if etype in WORK_ARRIVED:
            if live.turn_id or live.paused:
                live.queued += 1  # it waits: behind the running turn, or on the broker until the resume
            return
        if etype == SPAWNED:
            live.present, live.absent_reason, live.node = True, "", event.node or live.node
        elif etype == TERMINATED:
            if live.node and event.node and event.node != live.node:
                return  # the seat's former node letting go after its new node took it: it still runs
            live.present, live.absent_reason, live.node = False, _text(event.field("reason")), ""
            live.turn_id, live.queued = "", 0
        elif etype == SEAT_PAUSED:
            live.paused = True
            live.pause_reason = _text(event.field("reason"))
            live.paused_by = _text(event.field("paused_by")) or _text(event.field("paused_by_seat"))
        elif etype == SEAT_RESUMED:
            live.paused, live.pause_reason, live.paused_by = False, "", ""
        elif etype == TURN_STARTED:
            live.present, live.absent_reason = True, ""
            live.node = event.node or live.node
            live.turn_id = _text(event.field("turn_id")) or event.id
            live.queued = max(live.queued - 1, 0)
            live.last_turn = self._last_turn(event, row, qs.OUTCOME_RUNNING)
        elif etype == TURN_COMPLETED:
            live.present, live.absent_reason = True, ""
            turn_id = _text(event.field("turn_id"))
            if not live.turn_id or live.turn_id == turn_id:
                live.turn_id = ""
            outcome = turn_outcome(event)
            if outcome == qs.OUTCOME_OK:
                live.stopped = ""  # it works again
            live.last_turn = self._last_turn(event, row, outcome)
            if counted:
                key = C_TURNS_FAILED if outcome == qs.OUTCOME_FAILED else C_TURNS_COMPLETED
                live.counters[key] += 1
                live.counters[C_TOKENS] += _count(event.field("input_tokens")) + _count(event.field("output_tokens"))
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
            live.queued = max(live.queued - max(_count(event.field("count")) - 1, 0), 0)
        elif etype == TRIGGER_SKIPPED:
            live.queued = max(live.queued - 1, 0)

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
        self, scope: Optional[qs.NodeScope] = None, *, at: Optional[datetime] = None, fleet: Optional["FleetReads"] = None
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
                data = await _fleet_seed(fleet, org, instant, seats, self._feed.maxlen or FEED_SIZE)
            else:
                data = await sync_to_async(_read_seed, thread_sensitive=True)(org, scope, instant, seats)
        except (DatabaseError, qs.QuestionRefused):
            log.exception("projection_seed_failed")
            self._drain()
            return False
        held = seats.held_locally() if seats is not None else {}
        try:
            holders = await sync_to_async(_seat_holders, thread_sensitive=True)()
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
        self, data: "SeedData", held: dict[str, bool], at: datetime, holders: Optional[dict[str, str]] = None
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
            live.stopped = turn.stopped
            live.counters = dict(turn.counters)
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


# -- reading the seed (in a worker thread) --------------------------------------------------------


@dataclass
class SeedTurn:
    last_turn: dict[str, Any]
    running: str
    stopped: str
    counters: dict[str, int]


@dataclass
class SeedData:
    feed: list[dict[str, Any]]
    turns: dict[str, SeedTurn]
    pauses: dict[str, dict[str, Any]]
    counters: dict[str, int]


def _seat_holders() -> dict[str, str]:
    """Which node holds each seat's lease right now (the fleet's roster of who runs what)."""
    from crewlet.fleet.leases import SEAT, holders

    return holders(SEAT)


def _scope() -> qs.NodeScope:
    from eventstore.api import node_scope

    return node_scope()


def _read_seed(org: Organization, scope: Optional[qs.NodeScope], at: datetime, seats: Optional[SeatLoops] = None) -> SeedData:
    """Every read a seed makes, asked as the store's own questions at one instant (the pauses through ``seats``)."""
    from django.db import connections

    scope = scope or _scope()
    try:
        feed = qs.answer(qs.Question(kind=qs.EVENTS, at=at, filters=qs.Filters(feed_only=True), limit=FEED_SIZE), scope)
        turns: dict[str, SeedTurn] = {}
        handles = [s.handle for s in org.agent_seats()]
        for handle in handles:
            turn = _latest_turn(handle, scope, at)
            if turn is not None:
                turns[handle] = turn
        pauses = _pauses(handles, seats)
        counters, per_seat = count_rows(scope, at - COUNTER_WINDOW, at)
        for handle, turn in turns.items():
            turn.counters = per_seat.get(handle, turn.counters)
        return SeedData(feed=feed["events"], turns=turns, pauses=pauses, counters=counters)
    finally:
        connections[scope.using].close()


def _latest_turn(handle: str, scope: qs.NodeScope, at: datetime) -> Optional[SeedTurn]:
    page = qs.answer(qs.Question(kind=qs.TURNS, at=at, filters=qs.Filters(seat=handle), limit=1), scope)["turns"]
    if not page:
        return None
    turn = qs.answer(qs.Question(kind=qs.TURN, at=at, key=page[0]["turn_id"]), scope)["turn"]
    return _seed_turn(turn) if turn is not None else None


def _seed_turn(turn: dict[str, Any]) -> SeedTurn:
    """A seat's newest turn (folded, with its events) as the seed holds it."""
    rows = turn["events"]
    outcome = turn["outcome"]
    # The row that says how it ended (or that it began), newest first.
    closing = next(
        (r for r in reversed(rows) if r["type"] in (TURN_COMPLETED, TURN_STOPPED, LLM_UNAVAILABLE, BUDGET_EXHAUSTED, TURN_STARTED)),
        rows[-1] if rows else None,
    )
    stopped = ""
    if outcome == qs.OUTCOME_FAILED:
        types = {r["type"] for r in rows}
        stopped = STOPPED_BUDGET if BUDGET_EXHAUSTED in types else STOPPED_PROVIDER if LLM_UNAVAILABLE in types else ""
    return SeedTurn(
        last_turn={
            "turn_id": turn["turn_id"],
            "outcome": outcome,
            "timestamp": turn["ended"] or turn["started"] or (closing["timestamp"] if closing else None),
            "summary": closing["summary"] if closing else "",
            "trace_id": turn["trace_id"],
        },
        running=turn["turn_id"] if outcome == qs.OUTCOME_RUNNING else "",
        stopped=stopped,
        counters={C_TURNS_COMPLETED: 0, C_TURNS_FAILED: 0, C_TOKENS: 0},
    )


def _pauses(handles: list[str], seats: Optional[SeatLoops]) -> dict[str, dict[str, Any]]:
    return {
        handle: {"paused": row.paused, "reason": row.reason, "paused_by": row.paused_by}
        for handle, row in (seats.pause_rows(handles) if seats is not None else {}).items()
    }


async def _fleet_seed(fleet: "FleetReads", org: Organization, at: datetime, seats: Optional[SeatLoops], feed_size: int) -> SeedData:
    """The seed as one fleet read (``eventstore.fanout.seed_plan``), the pauses from the coordination store."""
    from asgiref.sync import sync_to_async

    from eventstore.fanout import seed_plan

    handles = [s.handle for s in org.agent_seats()]
    window_us = COUNTER_WINDOW // timedelta(microseconds=1)
    answer = await fleet.arun(seed_plan(at, handles, feed_size=feed_size, window_us=window_us), at, "seed")
    turns = {handle: _seed_turn(turn) for handle, turn in answer["turns"].items()}
    for handle, turn in turns.items():
        turn.counters = {**turn.counters, **answer["per_seat"].get(handle, {})}
    counters = {name: int(answer["counters"].get(name, 0)) for name in COUNTER_KEYS}
    pauses = await sync_to_async(_pauses, thread_sensitive=True)(handles, seats)
    return SeedData(feed=answer["feed"], turns=turns, pauses=pauses, counters=counters)


def count_rows(scope: qs.NodeScope, since: datetime, at: datetime) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """The counters over ``[since, at]`` from the store: every row, completed and failed turns, spend."""
    from django.db import connections

    connection = connections[scope.using]
    adapt = connection.ops.adapt_datetimefield_value
    marks = ", ".join(["%s"] * len(SPEND_TYPES))
    sql = (
        f"SELECT type, seat, COUNT(*), SUM(CASE WHEN failed THEN 1 ELSE 0 END),"
        f" SUM(input_tokens + output_tokens) FROM {qs.TABLE}"
        f" WHERE ts >= %s AND ts <= %s AND type IN ({marks}) GROUP BY type, seat"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {qs.TABLE} WHERE ts >= %s AND ts <= %s", [adapt(since), adapt(at)])
        (total,) = cursor.fetchone()
        cursor.execute(sql, [adapt(since), adapt(at), *SPEND_TYPES])
        grouped = cursor.fetchall()
    counters = _new_counters()
    counters[C_EVENTS] = int(total or 0)
    per_seat: dict[str, dict[str, int]] = {}
    for etype, seat, count, failed, tokens in grouped:
        count, failed, tokens = int(count or 0), int(failed or 0), int(tokens or 0)
        counters[C_TOKENS] += tokens
        if etype != TURN_COMPLETED:
            continue
        counters[C_TURNS_FAILED] += failed
        counters[C_TURNS_COMPLETED] += count - failed
        if seat:
            mine = per_seat.setdefault(seat, {C_TURNS_COMPLETED: 0, C_TURNS_FAILED: 0, C_TOKENS: 0})
            mine[C_TURNS_FAILED] += failed
            mine[C_TURNS_COMPLETED] += count - failed
            mine[C_TOKENS] += tokens
    return counters, per_seat


#: Types that name the seat they move in their ``seat`` field (work arrivals have their own field).
_SEAT_TYPES: frozenset[str] = frozenset(
    {
        SPAWNED,
        TERMINATED,
        SEAT_PAUSED,
        SEAT_RESUMED,
        TURN_STARTED,
        TURN_COMPLETED,
        TURN_STOPPED,
        LLM_UNAVAILABLE,
        BUDGET_EXHAUSTED,
        COALESCED,
        TRIGGER_SKIPPED,
    }
)


# -- the engine's one ---------------------------------------------------------------------------


def current() -> Optional[LiveProjection]:
    """The running engine's projection, or None when none runs in this process."""
    from crewlet import runtime

    running = runtime.current_engine()
    service = running.lookup(LIVE_PROJECTION) if running is not None else None
    return service.projection if service is not None else None


def running() -> LiveProjection:
    """The running engine's projection; :class:`NoEngineHere` when none runs here (a web-only process)."""
    found = current()
    if found is None:
        raise NoEngineHere()
    return found


async def subscribe(queue: "EventQueue", projection: LiveProjection) -> "Closable":
    """The one broadcast consumer that feeds ``projection`` everything under ``crewlet.events.>``."""
    return await queue.subscribe_stream(topics.EVENTS_ALL, projection.handler)


class ProjectionService:
    """The engine's projection of its company (``engine.company``), as an engine service.

    The company is the engine's, so the seed reads the seats the engine
    serves even before the seat runtime is up. The stream opens first (so
    nothing falls between), then the seed reads the store; what the stream
    delivers meanwhile waits for it.
    """

    def __init__(self, engine: "Engine", projection: Optional[LiveProjection] = None) -> None:
        self.engine = engine
        holder: CompanyHolder = engine.company
        self.projection = projection or LiveProjection(holder.current, seats=lambda: seat_loops(engine))
        self._stream: Optional["Closable"] = None

    async def start(self) -> None:
        assert self.engine.queue is not None
        projection = self.projection
        with projection._lock:
            projection._pending = []  # what the stream delivers while the seed reads waits for it
        self._stream = await subscribe(self.engine.queue, projection)
        await projection.seed(fleet=self.engine.lookup(FLEET_READS))

    async def stop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()


__all__ = [
    "ABSENT",
    "Applied",
    "FEED_SIZE",
    "HELD",
    "IDLE",
    "LiveProjection",
    "PAUSED",
    "QUEUED",
    "RUNNING",
    "STATES",
    "STOPPED",
    "NO_ENGINE",
    "NoEngineHere",
    "current",
    "feed_row",
    "ProjectionService",
    "running",
    "subscribe",
]
