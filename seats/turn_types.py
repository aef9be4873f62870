"""What a turn runs on and what it ends as: the trigger, the result, one turn's running state, and their words.

The inbox builds a :class:`Trigger`, :class:`~seats.turns.TurnRunner` runs it
and answers a :class:`TurnResult`; the turn's own modules (the loop, its tool
calls, its record) share a :class:`TurnState` while it runs. The constants
are the outcome, ``error_kind`` and stop-reason values the turn's events and
the inbox read.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Protocol, TypedDict

from crewlet.events import Event
from crewlet.events.types import A2AMessage, TaskAssigned
from crewlet.company.org import Organization, Seat
from seats.ledger import storable
from seats.provider_base import Message, ModelProvider
from seats.tools.base import ToolSpec

PHASE_RESPOND = "respond"
OUTCOME_COMPLETED = "completed"
OUTCOME_FAILED = "failed"
OUTCOME_STOPPED = "stopped"

ERR_LLM_UNAVAILABLE = "llm_unavailable"
ERR_NO_PROVIDER = "no_provider"
#: The turn itself raised (a bug, or content nothing downstream could handle): not a provider kind.
ERR_CRASHED = "crashed"
#: The completion ledger could not record the trigger before the turn's first call that can change the world.
ERR_LEDGER = "ledger_unavailable"
#: A turn fenced off its seat: the lease was gone (the node froze, the store was away) before its next call.
STOP_LEASE_LOST = "lease_lost"
#: Who ``agent_turn_stopped`` names when the engine, not a person, ended a turn.
STOPPED_BY_ENGINE = "engine"


class Emit(Protocol):
    """How a turn's parts publish its telemetry (the runner's emitter, which never fails the turn)."""

    async def __call__(self, body: Any, extras: Optional[dict[str, Any]] = None) -> None: ...


class TurnTags(TypedDict):
    """The fields every event of one turn carries, spread into each body."""

    seat: str
    role: str
    agent_id: str
    turn_id: str
    conversation_key: str


@dataclass(frozen=True)
class TurnStop:
    """A person's request that the running turn end at its next round (who, from which seat, and why)."""

    by: str
    by_seat: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Steer:
    """A person's note to a running turn (``agent_turn_steered``), as it crossed the steer scatter."""

    note: str
    note_id: str
    steered_by: str = ""
    steered_by_seat: str = ""
    sent_at: str = ""


@dataclass
class SteerBox:
    """The notes waiting for a running turn's next round; closed once the turn can read no more of them.

    The node's steer server offers into it while the turn runs; the turn takes
    what waits before each round's call, and closes it as it ends, so a note
    offered after that is refused rather than silently dropped.
    """

    waiting: list[Steer] = field(default_factory=list)
    closed: bool = False

    def offer(self, steer: Steer) -> bool:
        if self.closed:
            return False
        self.waiting.append(steer)
        return True

    def take(self) -> list[Steer]:
        taken, self.waiting = self.waiting, []
        return taken

    def close(self) -> list[Steer]:
        """No more notes: the ones still waiting (they expired)."""
        self.closed = True
        return self.take()


@dataclass
class Trigger:
    """What woke the seat: one partition's fresh events, oldest first.

    ``first_delivery`` says every event is on its first delivery: a failure
    then logs its traceback, and the same failure on a redelivery logs one line.
    ``before_write`` is awaited once, before the turn's first call that can
    change the world (a tool not marked read-only) runs: the inbox records the
    triggers in the completion ledger there, so a turn that has begun to act
    is never run again for them, while one that only read can be. ``stop`` is
    set by the inbox while the turn runs, when a person's pause asks it to end;
    ``notes`` holds the people's notes that wait for its next round.
    """

    events: list[Event]
    turn_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    partition_key: str = ""
    conversation_key: str = ""
    first_delivery: bool = True
    before_write: Optional[Callable[[], Awaitable[None]]] = None
    stop: Optional[TurnStop] = None
    #: People's notes to this turn while it runs (:mod:`seats.steering`).
    notes: SteerBox = field(default_factory=SteerBox)

    @property
    def first(self) -> Event:
        return self.events[0]

    def prompt(self) -> str:
        """The user prompt: each wake as its sender and body, a task as its title and instructions.

        An A2A answer that still owes an ask (a chain: this seat asked on
        behalf of the ask it was given) is preceded by that ask, who asked
        and what: this turn's final response is the answer to it.
        """
        lines = []
        for ev in self.events:
            owed = ev.data.owed() if isinstance(ev.data, A2AMessage) else None
            if owed is not None:
                lines.append(
                    f"{owed.from_seat} asked you: {owed.brief}\n(You asked {ev.data.from_seat} to help; "
                    f"their answer follows, and your final answer goes back to {owed.from_seat}.)"
                )
            if isinstance(ev.data, TaskAssigned):
                text = f"Task: {ev.data.title}".strip()
                if ev.data.instructions and ev.data.instructions != ev.data.title:
                    text += f"\n{ev.data.instructions}"
                lines.append(text)
                continue
            body = ev.field("body")
            sender = ev.field("sender")
            if body:
                lines.append(f"{sender}: {body}" if sender else str(body))
            else:
                lines.append(ev.summary())
        return storable("\n".join(lines))


@dataclass
class TurnResult:
    """How a turn ended. ``outcome`` is completed | failed | stopped."""

    turn_id: str
    outcome: str
    response: str = ""
    provider_key: str = ""
    #: Input as billed (cached tokens at their weight: ``provider_base.billed_input``), and the cached tokens counted raw.
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    error_kind: str = ""
    duration_ms: int = 0
    #: Every tool call the turn made, in order, as the phase records it (arguments included).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    #: Why the loop ended: a STOP_REASONS value, or budget_exhausted / STOP_LEASE_LOST on a stopped turn.
    stop_reason: str = ""
    #: The seat stopped being this node's mid-turn: its mail goes back to the seat's next holder.
    fenced: bool = False
    #: A call that can change the world ran (its triggers are in the ledger): a failure is abandoned, never rerun.
    wrote: bool = False
    #: The runtime invariant that ended the turn (a GUARDS value: ``turn.guard_breach``), or "".
    guard: str = ""
    #: The ledger identities of the waiting messages its thread block showed (:mod:`seats.thread_block`):
    #: worked by this turn once it completes.
    answered_in_thread: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_COMPLETED


@dataclass
class TurnState:
    """One turn's running state: the conversation, the tools offered, and what each round did."""

    seat: Seat
    trigger: Trigger
    org: Organization
    system: str
    user: str
    tools: list[ToolSpec]
    messages: list[Message] = field(default_factory=list)
    providers: dict[str, ModelProvider] = field(default_factory=dict)
    wrote: bool = False
    ended_by_tool: bool = False
    #: The phase's start on the monotonic clock: each round's ``started_ms`` is measured from it.
    started: float = field(default_factory=time.monotonic)
    #: The turn's last progress (a provider's answer, a tool's result) on that clock: the stall guard's mark.
    progress: float = field(default_factory=time.monotonic)
    #: What its thread block read (``agent_phase_completed.thread_block``); None for a trigger from no conversation.
    thread_block: Optional[dict[str, Any]] = None

    def moved(self) -> None:
        """The turn made progress: the stall guard counts from now."""
        self.progress = time.monotonic()


__all__ = [
    "ERR_CRASHED",
    "ERR_LEDGER",
    "ERR_LLM_UNAVAILABLE",
    "ERR_NO_PROVIDER",
    "Emit",
    "OUTCOME_COMPLETED",
    "OUTCOME_FAILED",
    "OUTCOME_STOPPED",
    "PHASE_RESPOND",
    "STOPPED_BY_ENGINE",
    "STOP_LEASE_LOST",
    "Steer",
    "SteerBox",
    "Trigger",
    "TurnResult",
    "TurnState",
    "TurnStop",
    "TurnTags",
]
