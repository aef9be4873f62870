"""Decision bodies: published by nothing in this build; the seam an extension writes through.

They are registered, filed under their category and stored like every
design type, so an extension that publishes one needs no change here or in
the store.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.registry import DECISION, register
from crewlet.events.types.base import EventBody, _s, _tail

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@dataclass
class _DecisionBody(EventBody):
    """An event about one decision, by its id."""

    decision_id: str = ""


@register("decision_requested", category=DECISION)
class DecisionRequested(_DecisionBody):
    title: str = ""
    options: list[str] = field(default_factory=list)
    requested_by: str = ""
    driver: str = ""
    approver: str = ""
    contributors: list[str] = field(default_factory=list)
    informed: list[str] = field(default_factory=list)
    work_item: Optional[dict[str, Any]] = None

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self._named(self.requested_by, event)} asked for a decision" + _tail(self.title)


@register("decision_resolved", category=DECISION)
class DecisionResolved(_DecisionBody):
    title: str = ""
    choice: str = ""
    resolved_by: str = ""
    rationale: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self._named(self.resolved_by, event)} decided" + _tail(
            _s(self.title) or _s(self.decision_id), " "
        ) + _tail(self.choice)


@register("contribution_requested", category=DECISION)
class ContributionRequested(_DecisionBody):
    requested_by: str = ""
    requested_from: str = ""
    question: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self._named(self.requested_by, event)} asked {_s(self.requested_from) or 'someone'} for input" + _tail(
            self.question
        )


@register("contribution_received", category=DECISION)
class ContributionReceived(_DecisionBody):
    contributed_by: str = ""
    contribution: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self._named(self.contributed_by, event)} gave input" + _tail(self.contribution)
