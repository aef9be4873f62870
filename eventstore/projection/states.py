"""The live projection's vocabulary: its sizes, the seat states, the snapshot's keys and the event types that move a seat.

The wire strings here are what the dashboard styles on and what a tab's
frames carry, so every module of the projection (and :mod:`eventstore.stream`)
names them from one place. The counters' keys are the row counters'
(:mod:`eventstore.questions.counts`): the live count and the store's count
must agree on them.
"""
from __future__ import annotations

from datetime import timedelta

from crewlet.events import types
from crewlet.events.types.phrases import TRIGGER_ABANDONED
from eventstore.questions import TURN_COMPLETED, TURN_STARTED, TURN_STOPPED

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
#: ``reason`` of a seat a coding run holds (seats.inbox_state.HOLD_SANDBOX).
HELD_SANDBOX = "sandbox"
#: ``reason`` of a stopped seat.
STOPPED_PROVIDER = "provider"
STOPPED_BUDGET = "budget"

# -- snapshot / seat row keys --------------------------------------------------------------
K_SEATS = "seats"
K_FEED = "feed"
K_COUNTERS = "counters"
K_SEEDED = "seeded"
K_COUNTERS_SINCE = "counters_since"

# -- the event types that move a seat (each wire name read off its registered class; a turn's from the fold's) --
SPAWNED = types.AgentSpawned.event_type
TERMINATED = types.AgentTerminated.event_type
SEAT_PAUSED = types.SeatPaused.event_type
SEAT_RESUMED = types.SeatResumed.event_type
#: A coding run begins or resumes holding its seat, and stops (parked on a question, or ended).
RUN_HOLDS = (types.SandboxRunStarted.event_type,)
RUN_ANSWERED = types.SandboxRunAnswered.event_type
RUN_LETS_GO = (
    types.SandboxClarificationRequested.event_type, types.SandboxRunCompleted.event_type, types.SandboxRunFailed.event_type,
)
LLM_UNAVAILABLE = types.LLMUnavailable.event_type
BUDGET_EXHAUSTED = types.BudgetExhausted.event_type
#: Moves no seat: the projection keeps the latest report (:mod:`eventstore.projection.meters`).
BUDGET_METERS = types.BudgetMeters.event_type
COALESCED = types.NotificationsCoalesced.event_type
#: Live only: the round a running turn has begun (the seat row's ``round``).
TURN_PROGRESS = types.AgentTurnProgress.event_type
TRIGGER_SKIPPED = types.TurnTriggerSkipped.event_type
GUARD_BREACH = types.TurnGuardBreach.event_type
#: ``turn_trigger_skipped`` reasons that abandon a trigger its turn already took (the seat's ``last_error``).
ABANDONED_REASONS: frozenset[str] = frozenset(TRIGGER_ABANDONED)
#: How much of an error a seat's ``last_error`` keeps.
LAST_ERROR_CHARS = 500
#: How many taken triggers a seat remembers whose wake record has not arrived: records trail their turn by
#: moments, so a handful per seat is plenty; an older one that arrives after all counts as waiting.
TAKEN_REMEMBERED = 64
#: Records of work put in a seat's inbox, and the body field naming that seat.
WORK_ARRIVED: dict[str, str] = {
    types.ExternalNotification.event_type: "seat",
    types.ScheduledTaskFired.event_type: "seat",
    types.A2AChannelOpened.event_type: "target",
    types.A2AMessageSent.event_type: "to_seat",
}
#: Where a work record names the id of the wake it put in the inbox — the id a turn or a skip names as its
#: trigger: a notification's record is its wake, a schedule's names its task. An A2A record has an id of its
#: own and names no wake, so it waits unnamed: the next turn that takes no named wake takes it.
WAKE_ID_FIELD: dict[str, str] = {
    types.ExternalNotification.event_type: "id",
    types.ScheduledTaskFired.event_type: "task_event_id",
}

#: Types that name the seat they move in their ``seat`` field (work arrivals have their own field).
SEAT_TYPES: frozenset[str] = frozenset(
    {
        SPAWNED,
        TERMINATED,
        SEAT_PAUSED,
        SEAT_RESUMED,
        TURN_STARTED,
        TURN_PROGRESS,
        TURN_COMPLETED,
        TURN_STOPPED,
        LLM_UNAVAILABLE,
        BUDGET_EXHAUSTED,
        COALESCED,
        TRIGGER_SKIPPED,
        GUARD_BREACH,
        *RUN_HOLDS,
        RUN_ANSWERED,
        *RUN_LETS_GO,
    }
)
