"""Task bodies: work assigned to a seat, a sandbox run from start to answer, and a schedule firing."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.registry import TASK, register
from crewlet.events.types.base import _person, _s, _SeatBody, _tail, _TurnBody

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@register("task_assigned", category=TASK)
class TaskAssigned(_SeatBody):
    """Work published to a seat's inbox by the scheduler."""

    schedule_id: str = ""
    title: str = ""
    instructions: str = ""
    work_item: Optional[dict[str, Any]] = None
    assigned_by: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        by = _s(self.assigned_by) or "the scheduler"
        return f"{by} assigned {self._seat()} a task" + _tail(self.title)


@dataclass
class _RunBody(_TurnBody):
    """Fields every coding-run event shares."""

    run_id: str = ""
    work_key: str = ""


@dataclass
class _Answerer:
    """Who answered a parked run's question: a person's name, else their seat."""

    answered_by: str = ""
    answered_by_seat: str = ""


@register("sandbox_run_started", category=TASK)
class SandboxRunStarted(_RunBody):
    """A detached coding run began executing."""

    task: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} started coding run" + _tail(self.run_id, " ") + _tail(self.task)


@register("sandbox_clarification_requested", category=TASK)
class SandboxClarificationRequested(_RunBody):
    """A run stopped to ask a person something; it holds nothing while it waits."""

    question: str = ""
    asked_in: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s coding run" + _tail(self.run_id, " ") + " asked" + _tail(self.question)


@register("sandbox_run_completed", category=TASK)
class SandboxRunCompleted(_RunBody):
    """A run settled."""

    outcome: str = ""
    result: str = ""
    duration_seconds: float = 0.0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} finished coding run" + _tail(self.run_id, " ") + _tail(self.outcome or self.result)


@register("sandbox_run_failed", category=TASK)
class SandboxRunFailed(_RunBody):
    """A run lost, once: republished under the id and instant its ending recorded on the row."""

    error: str = ""
    ended_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)}'s coding run" + _tail(self.run_id, " ") + " failed" + _tail(self.error)


@register("sandbox_run_answered", category=TASK)
class SandboxRunAnswered(_RunBody, _Answerer):
    """What an answer to a parked run's question became, by which route, and from whom."""

    outcome: str = ""  # one of ANSWER_OUTCOMES
    route: str = ""  # one of ANSWER_ROUTES

    def summary(self, event: Optional[Event] = None) -> str:
        via = f" via {_s(self.route)}" if _s(self.route) else ""
        return (
            f"{_person(self.answered_by, self.answered_by_seat)} answered {self._seat()}'s coding run"
            + _tail(self.run_id, " ") + via + _tail(self.outcome)
        )


@register("sandbox_answer_given", category=TASK, stored=False)
class SandboxAnswerGiven(_RunBody, _Answerer):
    """Not stored: the operator route's answer to a parked run, travelling as an inbox wake; never a turn."""

    answer: str = ""
    request_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_person(self.answered_by, self.answered_by_seat)} answered coding run" + _tail(self.run_id, " ")


@register("scheduled_task_fired", category=TASK)
class ScheduledTaskFired(_SeatBody):
    """A schedule fired and created a task for its target seat."""

    schedule_id: str = ""
    schedule_name: str = ""
    task_event_id: str = ""
    fired_at: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        name = _s(self.schedule_name) or _s(self.schedule_id)
        return (f"schedule {name}" if name else "a schedule") + f" fired for {self._seat()}"
