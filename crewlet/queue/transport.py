"""What a backend has to provide: the broker primitives under the shared client.

The contract's semantics (gates, holds, batching, the delivery budget, the
dead-letter decision, node stamping, listeners) live once, in
``crewlet.queue.client.QueueClient``. A backend supplies only these
primitives, so the two certified backends cannot drift apart on behaviour the
client decides. Every primitive raises only ``crewlet.queue.errors`` types.
"""
from __future__ import annotations

import abc
from typing import Any, Awaitable, Callable, Mapping, Optional, Protocol, Sequence

from crewlet.queue import topics
from crewlet.queue.contract import Closable, DeadLetter, SubscriptionRef

#: Header names a dead letter carries, so an operator sees where it came from.
H_DLQ_TOPIC = "Crewlet-Dlq-Topic"
H_DLQ_GROUP = "Crewlet-Dlq-Group"
H_DLQ_DELIVERIES = "Crewlet-Dlq-Deliveries"
#: Why it was buried (a ``DEAD_LETTER_REASONS`` phrase) and when (epoch seconds): what a filter asks of an entry.
H_DLQ_REASON = "Crewlet-Dlq-Reason"
H_DLQ_AT = "Crewlet-Dlq-At"
H_MSG_ID = "Nats-Msg-Id"
#: How long a stream remembers a publish's ``Nats-Msg-Id`` and drops another with the same id
#: (JetStream's duplicate window; both backends keep it).
DUPLICATE_WINDOW_S = 120.0


def replay_msg_id(ref: str) -> str:
    """The id every replay of dead letter ``ref`` publishes under: racing replays publish once."""
    return f"crewlet-dlq-replay-{ref}"


def dead_letter_headers(topic: str, group: str, deliveries: int, reason: str = "", at_s: float = 0.0) -> dict[str, str]:
    """The headers a dead letter is stored with: where it came from, how often it was tried, why and when."""
    headers = {H_DLQ_TOPIC: topic, H_DLQ_GROUP: group, H_DLQ_DELIVERIES: str(deliveries)}
    if reason:
        headers[H_DLQ_REASON] = reason
    if at_s > 0:
        headers[H_DLQ_AT] = f"{at_s:.3f}"
    return headers


def dead_letter_from(headers: Mapping[str, Any], data: bytes, ref: str) -> DeadLetter:
    """A stored dead letter read back: the one parse of its headers for every backend."""
    try:
        deliveries = int(headers.get(H_DLQ_DELIVERIES, "0") or 0)
    except (TypeError, ValueError):
        deliveries = 0
    try:
        at_s = float(headers.get(H_DLQ_AT, "0") or 0)
    except (TypeError, ValueError):
        at_s = 0.0
    return DeadLetter(
        topic=str(headers.get(H_DLQ_TOPIC, "") or ""),
        group=str(headers.get(H_DLQ_GROUP, "") or ""),
        deliveries=deliveries,
        data=bytes(data),
        ref=ref,
        reason=str(headers.get(H_DLQ_REASON, "") or ""),
        buried_at_s=at_s if at_s > 0 and at_s == at_s else 0.0,
    )


class RawMessage(Protocol):
    """One fetched, unsettled message."""

    data: bytes
    #: Deliveries of this message including this one (1 on the first).
    delivered: int

    async def ack(self) -> None: ...

    async def nak(self, delay_s: float) -> None:
        """Failed: return after ``delay_s``, behind mail that is waiting meanwhile."""

    async def nak_head(self) -> None:
        """Handed back: return at once, at the head, ahead of never-delivered mail."""

    async def nak_leaving(self) -> None:
        """Handed back by a consumer that is going away (a stop, a detach): as ``nak_head``, and durably.

        The broker that holds the consumer next (the same one, the same one
        restarted, another cluster member) redelivers it at once, ahead of
        never-delivered mail. The leaving consumer does not fetch again, so
        it need not be confirmed ahead of its own next fetch.
        """

    async def term(self) -> None:
        """Never deliver again (after the dead-letter copy was published)."""

    async def in_progress(self) -> None:
        """Still being worked on: restart this delivery's ack clock (JetStream's ``+WPI``)."""


class Puller(Protocol):
    """A pull consumer bound to one durable (topic, group)."""

    async def fetch(self, max_n: int, timeout_s: float, ready: Callable[[], bool]) -> Sequence[RawMessage]:
        """Wait up to ``timeout_s`` for the first message; return what is available, at most ``max_n``.

        A sequence, not a list, so each backend can hand back its own message
        type (a list of it would not be a list of ``RawMessage``).

        Returns ``[]`` on timeout. ``ready()`` is the caller's gate: a backend
        that can check it atomically with taking messages does so (the twin);
        one that cannot (a pull request already on the wire) may return
        messages the caller will hand back.
        """

    def interrupt(self, leaving: bool = False) -> None:
        """The caller's gate closed or it is detaching: end a waiting fetch early if possible.

        ``leaving``: the caller is going away (a stop, a detach), so what the
        backend hands back itself (mail that arrives for the ended fetch) is
        handed back as ``RawMessage.nak_leaving`` does.
        """

    async def close(self) -> None: ...


class Transport(abc.ABC):
    """The broker primitives of one backend."""

    name: str = ""
    #: How long one fetch may wait before the loop looks at its gate again.
    poll_s: float = 1.0

    @property
    @abc.abstractmethod
    def is_connected(self) -> bool:
        """Whether the broker can be reached right now (``/healthz``)."""

    async def round_trip(self, timeout_s: float) -> None:
        """Returns once the broker answered within ``timeout_s``, else raises ``Unavailable`` (``/healthz``).

        A connection can look up while its broker no longer answers (a frozen
        process keeps its socket open); only a round trip tells. An in-process
        broker answers at once: the default is the connection state itself.
        """
        from crewlet.queue.errors import Unavailable

        if not self.is_connected:
            raise Unavailable("the broker is disconnected")

    @abc.abstractmethod
    async def publish(self, subject: str, data: bytes, headers: Optional[Mapping[str, str]] = None) -> int:
        """Store ``data`` on ``subject``; raise Unavailable or TooLarge.

        Returns the stream sequence the broker acknowledged it at (a dead
        letter's ref is that sequence), or 0 when it stored nothing new.
        """

    @abc.abstractmethod
    async def ensure_consumer(self, topic: str, group: str) -> bool:
        """Create the durable consumer detached at DeliverAll with the pair in its metadata."""

    @abc.abstractmethod
    async def delete_consumer(self, topic: str, group: str) -> bool: ...

    @abc.abstractmethod
    async def list_consumers(self, pattern: str) -> list[SubscriptionRef]: ...

    @abc.abstractmethod
    async def open_puller(self, topic: str, group: str) -> Puller:
        """Bind to an existing durable consumer (the client ensures it first)."""

    @abc.abstractmethod
    async def open_broadcast(
        self, pattern: str, on_message: Callable[[str, bytes], Awaitable[None]]
    ) -> Closable:
        """Deliver-new, ack-none consumer of every message matching ``pattern``."""

    @abc.abstractmethod
    async def ask(self, subject: str, request: bytes, want: int, timeout_s: float) -> list[bytes]: ...

    @abc.abstractmethod
    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> Closable: ...

    @abc.abstractmethod
    async def backlog(self, topic: str, group: str) -> int:
        """Unacked messages retained for the durable (topic, group); 0 when it does not exist."""

    @abc.abstractmethod
    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        """Entries of CREWLET_DLQ, oldest first, with the Crewlet-Dlq-* headers parsed."""

    @abc.abstractmethod
    async def dead_letter(self, ref: str) -> DeadLetter:
        """The CREWLET_DLQ entry ``ref`` as stored; raise Gone when it is not (or no longer) there."""

    @abc.abstractmethod
    async def delete_dead_letter(self, ref: str) -> bool:
        """Remove the entry ``ref`` from CREWLET_DLQ.

        True for exactly one of any number of concurrent calls (the one whose
        delete the broker applied); False when the entry was already gone.
        """

    @abc.abstractmethod
    async def read_subjects(self, spec: topics.StreamSpec, pattern: str) -> list[tuple[str, bytes]]:
        """The current message of every subject of ``spec`` matching ``pattern``, in stream order, in one pass."""

    @abc.abstractmethod
    async def purge_subjects(self, spec: topics.StreamSpec, pattern: str) -> int:
        """Remove every message of ``spec`` whose subject matches ``pattern``; how many went."""

    @abc.abstractmethod
    async def close(self) -> None: ...
