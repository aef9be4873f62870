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
  answer); ``queued`` counts those wakes by id, and a turn start, a skipped
  trigger or a digest (every id it merged) takes its own off. A wake's record
  is published after the wake reaches the inbox, so it can arrive after the
  turn it started: a record whose trigger a turn already took is not queued.
* ``running`` — a turn started (``agent_turn_started``) and has not ended
  (``agent_turn_completed`` / ``agent_turn_stopped``); ``turn_id`` is it.
* ``held`` — the inbox holds: a coding run works for the seat
  (``sandbox_run_started``, or ``sandbox_run_answered`` ``resumed``, until
  the run asks a question or ends: ``reason`` ``sandbox``; its mail is
  ``queued``, seeded from the coordination store's runs), or the company names
  no model provider (``reason`` ``no_provider``, the hold's own key).
* ``stopped`` — the provider chain was exhausted (``llm_unavailable``:
  ``reason`` ``provider``) or the token budget refused (``budget_exhausted``:
  ``reason`` ``budget``), until a turn of it completes without failing — for
  the budget, only while the latest ``budget_meters`` report still shows a
  spent window over it (:mod:`.meters`: a reset or a raised ceiling ends it);
  the failed turn's error, naming the window, is its ``last_error``.
* ``idle`` — none of the above. A person's seat (kind ``human``) is never run
  by the engine and always reads ``idle``.

Beside its state each seat row carries ``last_error``: what last went wrong
with its work — a failed turn's error, a ``turn.guard_breach`` (``max_iter:
…``), a trigger abandoned after a write (``turn_trigger_skipped`` with an
abandon phrase, which took no queued wake off: its turn already had) — until a
turn of the seat completes without failing. It is live only: a seeded
projection starts with none.

The counters (the overview's): ``turns_completed`` (a completion that did not
fail; a stopped or parked one included), ``turns_failed``, ``tokens`` (input
plus output of turn completions — the sum of their phases, so phases are not
added again — and of ``auxiliary_spend``) and ``events`` (every event
applied). They count from ``counters_since``: a seeded projection starts from
its store's rows of the last 24 hours and counts on from there; an event of a
stored type stamped at or before the seed's instant is taken as counted by the
store already.

The package, by job: :mod:`.states` (the seat states, the snapshot's keys,
the event types that move a seat), :mod:`.model` (the live model,
:class:`LiveProjection`, and what one event is to it), :mod:`.seed` (what a
seed reads, from this node's store or the fleet) and :mod:`.service` (the
engine's one, and how a page or a tab finds it). The counters' keys and the
store's count are the row counters' (:mod:`eventstore.questions.counts`);
this node's scope is :mod:`eventstore.here`'s. Callers import from the package.
"""
from __future__ import annotations

from eventstore.projection.model import Applied, LiveProjection, feed_row
from eventstore.projection.service import ProjectionService, current, running, subscribe
from eventstore.projection.states import (
    ABSENT,
    FEED_SIZE,
    HELD,
    IDLE,
    K_COUNTERS,
    PAUSED,
    QUEUED,
    RUNNING,
    STATES,
    STOPPED,
)

__all__ = [
    "ABSENT",
    "Applied",
    "FEED_SIZE",
    "HELD",
    "IDLE",
    "K_COUNTERS",
    "LiveProjection",
    "PAUSED",
    "QUEUED",
    "RUNNING",
    "STATES",
    "STOPPED",
    "current",
    "feed_row",
    "ProjectionService",
    "running",
    "subscribe",
]
