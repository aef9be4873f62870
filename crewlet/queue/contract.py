"""The queue contract: what every backend promises, and nothing about how.

Everything above ``crewlet.queue`` talks to an :class:`EventQueue`. Two backends
implement it (``crewlet.queue.memory`` and ``crewlet.queue.jetstream``) and the
one conformance suite in ``crewlet.queue.queuetest`` certifies both against the
semantics stated in these docstrings (docs/design.md § Delivery semantics,
§ Inbox batching and coalescing, § Broadcast streams, § Letting go of a subscription).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional, Protocol, Sequence, runtime_checkable

from crewlet.base.aio import Closable
from crewlet.events import Event

#: Deliveries a message gets before it is dead-lettered. Sized for handoffs as
#: well as poison: a deferral costs one delivery like a Nak does.
MAX_DELIVERIES = 25
#: The linger cap. A lingering drain keeps what it collected from every other
#: member (in-progress signals keep its ack clock running), so the contract
#: clamps every read of ``linger_s`` to this.
MAX_LINGER_SECONDS = 60
#: An encoded event larger than this is refused as permanently too large.
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
#: A broadcast consumer the broker has not seen activity on for this long is reaped.
STREAM_INACTIVE_THRESHOLD_S = 60.0
#: The largest stream sequence a broker can hold (JetStream's is a uint64), so
#: the largest dead-letter ref that can name an entry.
MAX_DEAD_LETTER_REF = 2**64 - 1
#: Why a ref is refused before any broker is asked (an API's 400 names it).
DEAD_LETTER_REF_RULE = f"a dead letter's ref is a whole number from 1 to {MAX_DEAD_LETTER_REF}"


class Outcome(enum.Enum):
    """What a handler decided about its delivery.

    ACK: done (the zero value: returning ``None`` acks).
    NAK: failed; redelivered after a backoff, *behind* mail that was waiting.
    DEFER: this process lost the right to do the work; returned at once *at the
    head* and the subscription quiesces itself. Both NAK and DEFER spend one
    delivery of the MAX_DELIVERIES budget.
    """

    ACK = "ack"
    NAK = "nak"
    DEFER = "defer"


@dataclass(frozen=True)
class Timings:
    """Every duration of delivery, in one injectable place.

    Production defaults; tests shrink them and run the same code paths.
    A Nak's n-th redelivery waits ``min(backoff_base_s * 2**(n-1), backoff_cap_s)``.

    The ack clock measures whether the process holding a message is alive,
    not how long its handler takes: a fetched message that is not settled
    within ``ack_wait_s`` goes to another member, so a crashed process costs
    its mail about ``ack_wait_s``. While this client holds a fetched message
    (running, waiting in a batch drain, or waiting behind another partition)
    it tells the broker every ``progress_s`` (default a third of
    ``ack_wait_s``, so two signals may be lost before the clock runs out) that
    the work is in progress, which restarts the clock. It does so for at
    most ``progress_limit_s`` per message: a handler wedged for longer loses
    its message to a healthy member one ack window later, as a process that
    died would.
    """

    backoff_base_s: float = 1.0
    backoff_cap_s: float = 30.0
    ack_wait_s: float = 30.0
    progress_s: Optional[float] = None
    progress_limit_s: float = 1800.0

    def __post_init__(self) -> None:
        for name in ("backoff_base_s", "backoff_cap_s", "ack_wait_s", "progress_limit_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(f"Timings.{name}={value!r}: must be a number >= 0")
        if self.ack_wait_s <= 0:
            raise ValueError(f"Timings.ack_wait_s={self.ack_wait_s!r}: must be > 0")
        if self.progress_s is not None:
            value = self.progress_s
            if not isinstance(value, (int, float)) or math.isnan(value) or not 0 < value < self.ack_wait_s:
                raise ValueError(
                    f"Timings.progress_s={value!r}: must be > 0 and below ack_wait_s={self.ack_wait_s!r}"
                )

    @property
    def progress_every_s(self) -> float:
        """How often a held message's in-progress signal restarts its ack clock."""
        return float(self.progress_s) if self.progress_s is not None else self.ack_wait_s / 3.0

    def backoff_s(self, delivered: int) -> float:
        """Spacing before redelivering a message that has been delivered ``delivered`` times."""
        exponent = max(delivered - 1, 0)
        if exponent > 62:
            return self.backoff_cap_s
        return min(self.backoff_base_s * (2.0 ** exponent), self.backoff_cap_s)


def remaining_after(delivered: int) -> int:
    """The contract's convention: further deliveries left before the dead letter.

    ``delivered`` counts deliveries including this one (1 on the first), so the
    first delivery says MAX_DELIVERIES - 1 and the last says 0.
    """
    return max(MAX_DELIVERIES - delivered, 0)


@dataclass(frozen=True)
class Delivery:
    """One message handed to a handler.

    ``remaining`` is how many further deliveries this message has before it is
    dead-lettered: MAX_DELIVERIES - 1 on the first delivery, 0 on the last.
    ``event`` is a fresh decode of the stored bytes: never the publisher's
    object, never shared with another group's handler.
    """

    event: Event
    topic: str
    remaining: int


@dataclass(frozen=True)
class Partition:
    """The deliveries of one partition key in one drain, ordered by event timestamp."""

    key: str
    deliveries: tuple[Delivery, ...]

    @property
    def headroom(self) -> int:
        """The smallest ``remaining`` of the partition's deliveries.

        Folded here, by the contract, so no backend can fold it differently:
        it answers "will handing this batch back dead-letter something".
        """
        return min((d.remaining for d in self.deliveries), default=0)

    @property
    def events(self) -> list[Event]:
        return [d.event for d in self.deliveries]


#: What a key made of one event's own id starts with: it names no conversation, so no later message reproduces it.
UNIQUE_KEY_PREFIX = "event:"


def unique_partition_key(event: Event) -> str:
    """The key of an event that names no conversation: never coalesced."""
    return f"{UNIQUE_KEY_PREFIX}{event.id}"


@dataclass
class BatchOptions:
    """How ``subscribe_batch`` drains. Mutable: a change takes effect on the next cycle.

    ``partition_key`` maps an event to its partition; ``None`` or a function
    that raises means a unique key per event. ``linger_s`` is clamped to
    [0, MAX_LINGER_SECONDS] and ``max_batch`` to at least 1 on every read.
    """

    partition_key: Optional[Callable[[Event], str]] = None
    linger_s: float = 0.0
    max_batch: int = 20

    def effective_linger_s(self) -> float:
        try:
            value = float(self.linger_s)
        except (TypeError, ValueError):
            return 0.0
        if math.isnan(value) or value <= 0:
            return 0.0
        return min(value, float(MAX_LINGER_SECONDS))

    def effective_max_batch(self) -> int:
        try:
            value = int(self.max_batch)
        except (TypeError, ValueError):
            return 1
        return max(value, 1)

    def key_of(self, event: Event) -> str:
        fn = self.partition_key
        if fn is None:
            return unique_partition_key(event)
        try:
            key = fn(event)
        except Exception:  # a key function that raises must not lose the event
            return unique_partition_key(event)
        if not isinstance(key, str) or not key:
            return unique_partition_key(event)
        return key


@dataclass(frozen=True)
class DeadLetter:
    """A message that spent its delivery budget, as it sits on CREWLET_DLQ.

    ``data`` is the event exactly as it was delivered (its origin node kept);
    ``ref`` is the backend's identity for the entry (a stream sequence).
    """

    topic: str
    group: str
    deliveries: int
    data: bytes
    ref: str
    #: Why it was buried (a ``DEAD_LETTER_REASONS`` phrase) and when (epoch seconds); "" and 0.0 on an
    #: entry stored by a build that did not record them.
    reason: str = ""
    buried_at_s: float = 0.0

    @property
    def event(self) -> Event:
        return Event.from_json(self.data)


def dead_letter_seq(ref: object) -> int:
    """``ref`` as the CREWLET_DLQ sequence it names; 0 when it cannot name one.

    The one parse of a ref for every backend and every caller: plain ASCII
    digits, 1 to MAX_DEAD_LETTER_REF. Anything else (a sign, a space inside, a
    non-ASCII digit, a number past a uint64) names no entry, and is never sent
    to a broker, whose own parse would refuse it in its own words.
    """
    if not isinstance(ref, str) or not ref.isascii() or not ref.isdigit() or len(ref) > 20:
        return 0
    seq = int(ref)
    return seq if 1 <= seq <= MAX_DEAD_LETTER_REF else 0


@dataclass(frozen=True, order=True)
class SubscriptionRef:
    """A durable subscription, exactly as it was created."""

    topic: str
    group: str


Handler = Callable[[Delivery], Awaitable[Optional[Outcome]]]
BatchHandler = Callable[[Partition], Awaitable[Optional[Outcome]]]
StreamHandler = Callable[[str, Event], Awaitable[None]]
PublishListener = Callable[[str, Event], Awaitable[None]]

#: How a fetched message was settled, as a :class:`QueueObserver` hears it.
SETTLED_ACK = "ack"
#: Redelivered behind waiting mail after the backoff (a handler's NAK or failure).
SETTLED_NAK = "nak"
#: Handed back at the head (a handler's DEFER, or mail a stop, hold or quiesce gave back).
SETTLED_DEFER = "defer"
#: Copied to CREWLET_DLQ and terminated.
SETTLED_DEAD_LETTER = "dead_letter"
SETTLED_OUTCOMES = (SETTLED_ACK, SETTLED_NAK, SETTLED_DEFER, SETTLED_DEAD_LETTER)
#: How a publish ended, as a :class:`QueueObserver` hears it.
PUBLISHED_OK = "ok"
PUBLISHED_FAILED = "failed"


@runtime_checkable
class QueueObserver(Protocol):
    """Told, synchronously and cheaply, of every publish and every settlement the client decides.

    The seam a process's metrics are counted at: the client is the one place
    that decides every ack, nak, deferral and dead letter, so an observer
    sees them all without any caller counting. It must not block or raise
    (a raise is logged and ignored).
    """

    def published(self, topic: str, event: Event, outcome: str) -> None:
        """``event`` was published on ``topic`` (``outcome`` :data:`PUBLISHED_OK`) or the publish raised."""

    def settled(self, topic: str, outcome: str, reason: str) -> None:
        """A message fetched from ``topic`` was settled as ``outcome`` (one of :data:`SETTLED_OUTCOMES`).

        ``reason`` is the dead letter's reason phrase, "" for the others.
        """


AnswerFn = Callable[[bytes], Awaitable[bytes]]


@runtime_checkable
@runtime_checkable
class Subscription(Protocol):
    """This client's attachment to one durable (topic, group).

    The subscription fetches only while it is not quiesced, holds no keys and
    the client's delivery is not paused. Every verb is local: it works while
    the broker is unreachable.
    """

    ref: SubscriptionRef

    async def quiesce(self) -> bool:
        """Stop fetching while staying attached. True when an attachment existed."""

    async def unquiesce(self) -> bool:
        """Fetch again. True when it was quiesced (then false on a second call). Holds stay."""

    async def detach(self) -> bool:
        """Close this attachment; the durable subscription and its mail survive.

        Releases the holds this client took on the pair. True when there was
        anything to detach; idempotent. Safe to call from inside a handler: the
        next delivery does not happen.
        """

    async def hold(self, key: str) -> None:
        """Gate the pair under ``key``: nothing is fetched while any key is held."""

    async def release(self, key: str) -> None:
        """Lift ``key``; releasing a key that is not held is a no-op."""


@runtime_checkable
class EventQueue(Protocol):
    """Persistent pub/sub with consumer groups (design: Interfaces).

    Every method is a coroutine except :meth:`add_publish_listener`,
    :meth:`in_flight` and :attr:`name`. A closed client raises
    :class:`~crewlet.queue.errors.NotLive` from every verb; a verb that cannot
    reach the broker raises :class:`~crewlet.queue.errors.Unavailable`.
    """

    @property
    def name(self) -> str:
        """The backend's stable lowercase name ("memory", "jetstream")."""

    @property
    def node(self) -> str:
        """The node id this client stamps on events that name none ("" = none)."""

    @property
    def connected(self) -> bool:
        """Open, and the broker reachable right now (what ``/healthz`` reports)."""

    async def round_trip(self, timeout_s: float) -> None:
        """Returns once the broker answered a round trip within ``timeout_s``; else ``Unavailable`` (``/healthz``)."""

    async def publish(self, topic: str, event: Event) -> None:
        """Store ``event`` on ``topic``; returns once the broker has it.

        The client stamps its node on a copy when the event names none; the
        caller's object is never mutated. Listeners then run inline. A topic no
        durable subscription covers (mailbox namespaces) retains nothing.
        """

    def add_publish_listener(self, fn: PublishListener) -> None:
        """``fn(topic, stamped_event)`` is awaited after every acknowledged publish; its errors are logged."""

    def add_observer(self, observer: QueueObserver) -> None:
        """``observer`` hears of every publish and every settlement from now on (see :class:`QueueObserver`)."""

    def held_count(self, topic: str, group: str) -> int:
        """Messages of (topic, group) this client has fetched and not yet settled or handed back."""

    async def ensure_subscription(self, topic: str, group: str) -> bool:
        """Create the durable subscription detached at DeliverAll. True when it created it."""

    async def delete_subscription(self, topic: str, group: str) -> bool:
        """Destroy the subscription and its mail; needs no local attachment. True when it deleted."""

    async def list_subscriptions(self, pattern: str) -> list[SubscriptionRef]:
        """Every durable subscription whose topic matches ``pattern`` (NATS wildcards), attached or not."""

    async def subscribe(self, topic: str, group: str, handler: Handler) -> Subscription:
        """Attach and run ``handler`` on one message at a time (pull, never push)."""

    async def subscribe_batch(
        self, topic: str, group: str, options: BatchOptions, handler: BatchHandler
    ) -> Subscription:
        """Attach and run ``handler`` once per partition of each drain (design: Inbox Batching)."""

    async def subscribe_stream(self, pattern: str, handler: StreamHandler) -> Closable:
        """Broadcast: every subscriber sees every matching event from now on; nothing is acked."""

    async def ask(self, subject: str, request: bytes, want: int, timeout_s: float) -> list[bytes]:
        """Scatter ``request`` to every server of ``subject``; gather up to ``want`` answers by the deadline."""

    async def serve(self, subject: str, answer: AnswerFn) -> Closable:
        """Answer every request on ``subject``; an answer that raises is a missing answer.

        An answer that raises :class:`~crewlet.queue.errors.NoAnswer` declines on
        purpose and is not logged as a failure.
        """

    async def backlog(self, topic: str, group: str) -> int:
        """Messages the subscription retains that are not yet acked (a seat's mailbox depth).

        It reads its own writes: a publish that returned is counted at once, by
        any client, on every backend (JetStream's running pending count lags the
        acknowledgement, so that backend also counts what its store holds from
        the consumer's delivered sequence on, and takes the larger).
        """

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """What sits on the dead-letter stream, oldest first."""

    async def replay_dead_letter(self, ref: str) -> DeadLetter:
        """Take the dead letter ``ref`` off CREWLET_DLQ and publish it onto its original topic as fresh mail.

        The event goes out byte for byte as it was (its id and origin node
        kept, nothing re-stamped) to the topic it was dead-lettered from, so
        every durable subscription of that topic gets it as a new message whose
        delivery count starts over. Publish listeners are not called: the event
        was recorded when it was first published, and a replay is a relay.

        Nothing is lost on the way: the event is published first and the entry
        taken off the stream after (a delete by sequence, which succeeds once),
        so a failed publish raises Unavailable and leaves the entry where it
        was. Every replay of one ref publishes under one ``Nats-Msg-Id``, so of
        concurrent replays the stream's duplicate window (two minutes) stores
        the event once; exactly one caller's take succeeds, the others raise
        Gone. A ref that is not, or no longer, there raises
        :class:`~crewlet.queue.errors.Gone`; a dead letter whose topic is a
        mailbox no durable subscription covers any more raises
        :class:`~crewlet.queue.errors.InvalidArgument` and stays where it is,
        because the broker would drop the replay. Returns the entry as it was.
        """

    async def read_last(self, pattern: str) -> list[tuple[str, Event]]:
        """The current message of every subject matching ``pattern``, in stream order, read in one pass.

        Only for a stream that keeps one message per subject (``CREWLET_MEMORY``):
        what it returns is the state those subjects hold, not a log. A message
        that does not decode is left out (and logged). Anything else raises
        :class:`~crewlet.queue.errors.InvalidArgument`.
        """

    async def purge(self, pattern: str) -> int:
        """Remove every message of such a stream whose subject matches ``pattern``; how many went."""

    async def quiesce(self, topic: str, group: str) -> bool: ...
    async def unquiesce(self, topic: str, group: str) -> bool: ...
    async def detach(self, topic: str, group: str) -> bool: ...
    async def hold(self, topic: str, group: str, key: str) -> None: ...
    async def release(self, topic: str, group: str, key: str) -> None: ...

    async def pause_delivery(self) -> None:
        """Stop every attachment of this client from fetching; publishes still work. Idempotent.

        What the attachments fetched and have not handed to a handler (a batch
        being collected, partitions not yet dispatched) is handed back at once;
        running handlers finish and settle as usual.
        """

    async def resume_delivery(self) -> None: ...

    def in_flight(self) -> int:
        """Handlers of this client running right now (never below zero)."""

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no handler runs; False when the deadline passed first."""

    async def close(self, grace_s: Optional[float] = None) -> None:
        """Detach everything and disconnect. Idempotent; afterwards every verb raises NotLive.

        Everything fetched and not being handled is handed back at once (at
        the head, one delivery spent), so another member has it in
        milliseconds rather than after the ack clock. A handler still running
        gets ``grace_s`` (default 10 s) to finish; then it is cancelled and
        its mail handed back the same way.
        """


__all__: Sequence[str] = (
    "MAX_DELIVERIES",
    "MAX_LINGER_SECONDS",
    "MAX_PAYLOAD_BYTES",
    "STREAM_INACTIVE_THRESHOLD_S",
    "MAX_DEAD_LETTER_REF",
    "DEAD_LETTER_REF_RULE",
    "dead_letter_seq",
    "Outcome",
    "Timings",
    "Delivery",
    "DeadLetter",
    "Partition",
    "BatchOptions",
    "SubscriptionRef",
    "Subscription",
    "EventQueue",
    "QueueObserver",
    "SETTLED_ACK",
    "SETTLED_NAK",
    "SETTLED_DEFER",
    "SETTLED_DEAD_LETTER",
    "SETTLED_OUTCOMES",
    "PUBLISHED_OK",
    "PUBLISHED_FAILED",
    "Closable",
    "remaining_after",
    "UNIQUE_KEY_PREFIX",
    "unique_partition_key",
)
