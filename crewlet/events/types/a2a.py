"""Agent-to-agent bodies: channels opened and closed, messages sent, and the requests and messages a seat's inbox is woken with."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.registry import A2A, register
from crewlet.events.types.base import EventBody, _ActorTags, _plural, _s, _tail

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event


@register("a2a_channel_opened", category=A2A)
class A2AChannelOpened(EventBody, _ActorTags):
    """An agent asked another one something: the channel and its brief (content lives only in events)."""

    channel_id: str = ""
    participants: list[str] = field(default_factory=list)
    opened_by: str = ""
    target: str = ""
    brief: str = ""
    turn_id: str = ""
    work_key: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = self._named(self.opened_by, event)
        return f"{who} asked {_s(self.target) or 'another agent'} over A2A" + _tail(self.brief)


@register("a2a_message_sent", category=A2A)
class A2AMessageSent(EventBody, _ActorTags):
    """A message on an A2A channel (the answer, in practice)."""

    channel_id: str = ""
    from_seat: str = ""
    to_seat: str = ""
    message: str = ""
    message_count: int = 0
    turn_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        who = self._named(self.from_seat, event)
        return f"{who} replied to {_s(self.to_seat) or 'another agent'} over A2A" + _tail(self.message)


#: How a close with no ``closed_by`` (the sweep's) reads: no participant and no turn behind it.
SYSTEM_CLOSED_A2A = "system closed A2A channel"


@register("a2a_channel_closed", category=A2A)
class A2AChannelClosed(EventBody):
    """A channel closed, by its answering turn or by the sweep.

    A close by the answering turn names that seat in ``closed_by`` and that
    run in ``turn_id`` / ``work_key``; the sweep's names neither, which is the
    whole signal. ``open_seconds`` is the record's own closed_at - opened_at,
    never a difference of two nodes' clocks.
    """

    channel_id: str = ""
    participants: list[str] = field(default_factory=list)
    message_count: int = 0
    open_seconds: float = 0.0
    closed_by: str = ""
    turn_id: str = ""
    work_key: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        head = f"{_s(self.closed_by)} closed A2A channel" if _s(self.closed_by) else SYSTEM_CLOSED_A2A
        between = " and ".join(_s(p) for p in self.participants if _s(p))
        return (
            head + _tail(self.channel_id, " ") + _tail(between, " between ")
            + f" after {_plural(self.message_count, 'message')}"
        )


@dataclass
class _LetterBody(EventBody, _ActorTags):
    """A wake in a seat's inbox on an A2A channel: from whom to whom, and the asking turn's tags."""

    channel_id: str = ""
    from_seat: str = ""
    to_seat: str = ""
    turn_id: str = ""
    conversation_key: str = ""


@register("a2a_request", category=A2A, stored=False)
class A2ARequest(_LetterBody):
    """Not stored: the ask, as a wake in the target's inbox (its row is a2a_channel_opened)."""

    brief: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self._named(self.from_seat, event)} asked {_s(self.to_seat) or 'another agent'}" + _tail(self.brief)


@register("a2a_message", category=A2A, stored=False)
class A2AMessage(_LetterBody):
    """Not stored: the answer, as a wake in the asker's inbox (its row is a2a_message_sent)."""

    message: str = ""
    #: In a chain of asks, the ask the receiver still owes an answer on (the channel it asked this one on
    #: behalf of), as that ask's ``a2a_request`` fields: the turn this answer wakes answers THAT ask, so
    #: its prompt must show what was asked beside the answer that came back. Empty when nothing is owed.
    owed_ask: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def owing(request: A2ARequest) -> dict[str, Any]:
        """``owed_ask``'s value for the still-owed ask ``request``."""
        return asdict(request)

    def owed(self) -> Optional[A2ARequest]:
        """The ask the receiver still owes an answer on (``owed_ask`` read back), or None when it owes none."""
        if not isinstance(self.owed_ask, dict) or not self.owed_ask:
            return None
        known = {f.name for f in fields(A2ARequest)}
        return A2ARequest(**{k: str(v) for k, v in self.owed_ask.items() if k in known and v is not None})

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self._named(self.from_seat, event)} answered {_s(self.to_seat) or 'another agent'}" + _tail(
            self.message
        )
