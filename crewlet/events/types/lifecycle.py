"""Lifecycle bodies: the org up and down, config revisions, an operator's act, a backup, a seat paused or resumed, agents spawned and terminated."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from crewlet.events.registry import LIFECYCLE, register
from crewlet.events.types.base import EventBody, _person, _plural, _s, _SeatBody, _tail

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@register("org_started", category=LIFECYCLE)
class OrgStarted(EventBody):
    """The org came up on this node."""

    org: str = ""
    revision: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} started the org" + _tail(self.org, " ") + _tail(self.revision, " on revision ")


@register("org_stopped", category=LIFECYCLE)
class OrgStopped(EventBody):
    """The org went down on this node."""

    org: str = ""
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} stopped the org" + _tail(self.org, " ") + _tail(self.reason)


@register("config_revision_activated", category=LIFECYCLE)
class ConfigRevisionActivated(EventBody):
    """A new revision is the one to serve."""

    revision: int = 0
    previous_revision: int = 0
    activated_by: str = ""
    activated_by_seat: str = ""
    #: The company file the revision was imported from at start ("" for an activation in the admin).
    source_file: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = _s(self.activated_by) or _s(self.activated_by_seat) or self.actor(event)
        prev = f" (was {self.previous_revision})" if self.previous_revision else ""
        return f"{who} activated config revision {self.revision}{prev}" + _tail(self.source_file, " from ")


@register("config_revision_applied", category=LIFECYCLE)
class ConfigRevisionApplied(EventBody):
    """One node's outcome applying a revision, and how far it got (the node is the envelope's)."""

    revision: int = 0
    outcome: str = ""  # applied | partial | failed
    reached: str = ""  # the last step it completed
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        node = _s(event.node) if event is not None else ""
        where = f"node {node}" if node else self.actor(event)
        how = _s(self.outcome) or "applied"
        return f"{where} {how} config revision {self.revision}" + _tail(self.reached, ", reached ") + _tail(self.error)


@dataclass
class _AuditBody(EventBody):
    """The runtime audit's who: the operator token's own name, and the person (``actor_seat``) it is bound to."""

    token: str = ""
    actor_seat: str = ""

    def actor(self, event: Optional[Event] = None) -> str:
        """The token's own name (design: the runtime audit), then the general rule."""
        return _s(self.token) or super().actor(event)


@register("operator_acted", category=LIFECYCLE)
class OperatorActed(_AuditBody):
    """The runtime audit: one operator tool call that is not a proven read, whatever became of it.

    From the dashboard (``/operator/act``) or a person's assistant
    (``/operator/mcp``). Source "operator"; the actor is the token's own name
    and ``actor_seat`` the person it is bound to. Never the arguments.
    """

    tool: str = ""
    transport: str = ""  # act | mcp
    request_id: str = ""
    outcome: str = ""
    position: str = ""
    refusal: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = self.actor(event)
        seat = f" ({_s(self.actor_seat)})" if _s(self.actor_seat) and _s(self.actor_seat) != who else ""
        result = f", refused: {_s(self.refusal)}" if _s(self.refusal) else _tail(self.outcome, ", ")
        return f"{who}{seat} called {_s(self.tool) or 'an operator tool'}{result}"


@register("backup_requested", category=LIFECYCLE)
class BackupRequested(_AuditBody):
    """A POST /backup that began copying. Which node's disk holds it is the envelope's ``node``."""

    dir: str = ""
    finished: bool = False
    streams: int = 0
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        state = "finished" if self.finished else "did not finish"
        where = _tail(self.dir, " to ")
        return f"{self.actor(event)} backed up {_plural(self.streams, 'stream')}{where} ({state})" + _tail(self.error)


@dataclass
class _PauseBody(EventBody):
    """The pause a body is about: the seat, who paused it and when."""

    seat: str = ""
    paused_by: str = ""
    paused_at: str = ""


@register("seat_paused", category=LIFECYCLE)
class SeatPaused(_PauseBody):
    """A person paused a seat; published once per change by the caller whose compare-and-set won."""

    paused_by_seat: str = ""
    reason: str = ""
    stop_running: bool = False

    def summary(self, event: Optional[Event] = None) -> str:
        stop = " and stopped its running turn" if self.stop_running else ""
        return f"{_person(self.paused_by, self.paused_by_seat)} paused {self._seat_ref()}{stop}" + _tail(self.reason)


@register("seat_resumed", category=LIFECYCLE)
class SeatResumed(_PauseBody):
    """The pause was lifted; names the pause it ended."""

    resumed_by: str = ""
    resumed_by_seat: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        ended = f" (paused by {_s(self.paused_by)})" if _s(self.paused_by) else ""
        return f"{_person(self.resumed_by, self.resumed_by_seat)} resumed {self._seat_ref()}{ended}"


@register("agent_spawned", category=LIFECYCLE, stored=False)
class AgentSpawned(_SeatBody):
    """Not stored: this node acquired a seat. Placement moves seats on every rebalance; live projection only."""

    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        node = _s(event.node) if event is not None else ""
        return f"{self.actor(event)} came up as {self._seat_ref()}" + _tail(node, " on ")


@register("agent_terminated", category=LIFECYCLE, stored=False)
class AgentTerminated(_SeatBody):
    """Not stored: this node released a seat. Placement moves seats on every rebalance; live projection only."""

    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} stopped as {self._seat_ref()}" + _tail(self.reason)
