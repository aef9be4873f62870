"""Decision bodies: published by nothing in this build; the seam an extension writes through.

They are registered, filed under their category and stored like every
design type, so an extension that publishes one needs no change here or in
the store.
"""
from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.registry import DECISION, register
from crewlet.events.types.base import EventBody, _s, _tail

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@register("decision_requested", category=DECISION)
class DecisionRequested(EventBody):
    decision_id: str = ""
    title: str = ""
    options: list[str] = field(default_factory=list)
    requested_by: str = ""
    driver: str = ""
    approver: str = ""
    contributors: list[str] = field(default_factory=list)
    informed: list[str] = field(default_factory=list)
    work_item: Optional[dict[str, Any]] = None

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.requested_by) or self.actor(event)} asked for a decision" + _tail(self.title)


@register("decision_resolved", category=DECISION)
class DecisionResolved(EventBody):
    decision_id: str = ""
    title: str = ""
    choice: str = ""
    resolved_by: str = ""
    rationale: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.resolved_by) or self.actor(event)} decided" + _tail(
            _s(self.title) or _s(self.decision_id), " "
        ) + _tail(self.choice)


@register("contribution_requested", category=DECISION)
class ContributionRequested(EventBody):
    decision_id: str = ""
    requested_by: str = ""
    requested_from: str = ""
    question: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.requested_by) or self.actor(event)} asked {_s(self.requested_from) or 'someone'} for input" + _tail(
            self.question
        )


@register("contribution_received", category=DECISION)
class ContributionReceived(EventBody):
    decision_id: str = ""
    contributed_by: str = ""
    contribution: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{_s(self.contributed_by) or self.actor(event)} gave input" + _tail(self.contribution)
