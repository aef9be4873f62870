"""Backends under test, behind one harness, plus the waiting helpers every case uses.

Waits are for conditions with deadlines, never bare sleeps. The one deliberate
pause is ``quiet()``: a short "must not arrive" window, as docs/design.md § The conformance suite allows.
"""
from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any, Awaitable, Callable, Optional, Protocol, runtime_checkable

from crewlet.events import Event
from crewlet.queue.contract import MAX_DELIVERIES, EventQueue, Subscription, SubscriptionRef, Timings
from crewlet.queue.queuetest.waiting import eventually as eventually  # re-exported: the cases import it from here

@runtime_checkable
class Severable(Protocol):
    """A transport that can drop its connection the way a killed process does (both backends can)."""

    def sever(self) -> None: ...


#: Shrunk production durations: every code path runs, in milliseconds.
TEST_TIMINGS = Timings(backoff_base_s=0.005, backoff_cap_s=0.02, ack_wait_s=30.0)

_names = itertools.count(1)


class Harness:
    """One backend: a broker plus as many clients as a case needs."""

    name: str = ""
    #: How long a "must not arrive" window lasts on this backend.
    quiet_s: float = 0.15
    #: Deadline for any awaited condition.
    wait_s: float = 10.0
    #: What this backend can do; a case needing more skips, naming the capability.
    capabilities: frozenset[str] = frozenset()

    def __init__(self, timings: Timings = TEST_TIMINGS) -> None:
        self.timings = timings
        self._clients: list[EventQueue] = []

    async def start(self) -> None: ...

    async def stop(self) -> None:
        for client in self._clients:
            try:
                await client.close()
            except Exception:
                pass

    async def new_client(self, node: str) -> EventQueue:
        raise NotImplementedError

    async def client(self, node: str = "n1") -> EventQueue:
        client = await self.new_client(node)
        self._clients.append(client)
        return client

    async def go_away(self) -> None:
        """Make the broker unreachable."""
        raise NotImplementedError

    async def come_back(self) -> None:
        raise NotImplementedError

    async def crash(self, client: EventQueue) -> None:
        """Kill ``client``'s process, as kill -9 would: its connection drops and nothing it fetched is settled.

        The client object is then closed to free its tasks; everything it
        tries to hand back by then goes nowhere.
        """
        transport = getattr(client, "transport", None)  # the contract does not name the client's transport
        assert isinstance(transport, Severable), f"{type(transport).__name__} cannot be severed"
        transport.sever()
        await eventually(lambda: not client.connected, self.wait_s, "the severed connection seen as down")
        await client.close(grace_s=0.0)

    async def flood(self, queue: EventQueue, topic: str, messages: int) -> None:
        """Store ``messages`` events on ``topic`` as fast as the backend takes them (a busy broker)."""
        await asyncio.gather(*(queue.publish(topic, ev(i)) for i in range(messages)))

    async def with_timings(self, timings: Timings) -> "Harness":
        """A second harness of the same backend with other durations (e.g. a short ack clock)."""
        other = type(self)(timings)
        await other.start()
        return other


class MemoryHarness(Harness):
    name = "memory"
    quiet_s = 0.15
    #: The most messages a flood stores on the twin.
    flood_cap = 500
    capabilities = frozenset({"outage", "ack_clock"})

    async def start(self) -> None:
        from crewlet.queue.memory import MemoryBroker

        self.broker = MemoryBroker(self.timings)

    async def new_client(self, node: str) -> EventQueue:
        return self.broker.client(node=node)

    async def flood(self, queue: EventQueue, topic: str, messages: int) -> None:
        """A few hundred publishes stand for any flood: the twin's publish is its whole delivery, it is never behind."""
        await super().flood(queue, topic, min(messages, self.flood_cap))

    async def go_away(self) -> None:
        self.broker.go_away()

    async def come_back(self) -> None:
        self.broker.come_back()


class JetStreamHarness(Harness):
    name = "jetstream"
    quiet_s = 0.4
    capabilities = frozenset({"outage", "ack_clock"})

    async def start(self) -> None:
        from crewlet.queue.broker import EmbeddedBroker

        self.broker = EmbeddedBroker(store_dir=None)
        await self.broker.start()

    async def stop(self) -> None:
        await super().stop()
        await self.broker.stop()

    async def new_client(self, node: str) -> EventQueue:
        from crewlet.queue.jetstream import JetStreamQueue

        return await JetStreamQueue.connect(self.broker.url, node=node, timings=self.timings)

    async def flood(self, queue: EventQueue, topic: str, messages: int) -> None:
        """Core publishes on a connection of its own, no acknowledgement awaited: the broker stores them at its own pace.

        A client's acknowledged publishes go one round trip at a time; these
        reach the stream as fast as the socket carries them, so it is still
        storing and signalling them while a case's own writes arrive.
        """
        import nats

        data = ev(0).to_json()
        nc = await nats.connect(self.broker.url)
        try:
            for _ in range(messages):
                await nc.publish(topic, data)
            await nc.flush()
        finally:
            await nc.close()

    async def go_away(self) -> None:
        await self.broker.stop()

    async def come_back(self) -> None:
        await self.broker.start()


def needs(harness: Harness, capability: str) -> None:
    """Skip, naming the capability, where the backend declares it lacks one."""
    import pytest

    if capability not in harness.capabilities:
        pytest.skip(f"{harness.name} backend lacks capability {capability!r}")


HARNESSES: dict[str, type[Harness]] = {"memory": MemoryHarness, "jetstream": JetStreamHarness}


# ---------------------------------------------------------------------------
# Names and events


def uniq(prefix: str = "t") -> str:
    """A subject-safe token unique within the run."""
    return f"{prefix}{next(_names)}{uuid.uuid4().hex[:6]}"


def inbox(label: str = "") -> tuple[str, str]:
    """A fresh (topic, group) in the mailbox (interest) namespace."""
    handle = uniq(label or "seat")
    return f"crewlet.agent.{handle}.inbox", f"agent-{handle}"


def ev(i: Any = 0, **payload: Any) -> Event:
    return Event(type="conformance_probe", payload={"i": i, **payload})


#: What a first delivery says is left.
FIRST = MAX_DELIVERIES - 1


async def publish_all(queue: EventQueue, topic: str, events: list[Event]) -> list[Event]:
    """Publish ``events`` to ``topic`` in order; the events, for the case to compare with what arrives."""
    for event in events:
        await queue.publish(topic, event)
    return events


async def attached(
    harness: Harness, queue: EventQueue, outcome: Optional[Callable[[Any], Any]] = None
) -> tuple[str, str, Collector, Subscription]:
    """A fresh (topic, group) with a consumer attached that collects what it is handed (and answers ``outcome``).

    The pair, the collector, the subscription.
    """
    topic, group = inbox()
    col = Collector(harness, outcome)
    return topic, group, col, await queue.subscribe(topic, group, col)


async def both_attached(harness: Harness, queue: EventQueue) -> tuple[EventQueue, Collector, Collector, str, str]:
    """``queue`` and a second client (``n2``) attached to one fresh (topic, group), each collecting what it is handed.

    The second client, this client's collector, the second's collector, the pair.
    """
    topic, group = inbox()
    other = await harness.client("n2")
    mine, theirs = Collector(harness), Collector(harness)
    await queue.subscribe(topic, group, mine)
    await other.subscribe(topic, group, theirs)
    return other, mine, theirs, topic, group


# ---------------------------------------------------------------------------
# What the broker holds


async def state(queue: EventQueue, *pairs: tuple[str, str]) -> tuple[tuple[int, ...], list[tuple[Any, ...]], list[SubscriptionRef]]:
    """What the broker holds: these pairs' backlogs, the dead letters, the listing.

    A negative case takes it before and after: a refusal must leave all three as they were.
    """
    backlogs = tuple([await queue.backlog(t, g) for t, g in pairs])
    dead = [(d.ref, d.topic, d.group, d.deliveries) for d in await queue.dead_letters()]
    return backlogs, dead, await queue.list_subscriptions(">")


async def only(queue: EventQueue, backlogs: dict[tuple[str, str], int]) -> None:
    """Nothing else was written: exactly these subscriptions, these backlogs, no dead letter."""
    pairs = list(backlogs)
    no_dead_letters: list[tuple[Any, ...]] = []
    expected = (tuple(backlogs.values()), no_dead_letters, sorted(SubscriptionRef(t, g) for t, g in pairs))
    assert await state(queue, *pairs) == expected


async def drained(harness: Harness, queue: EventQueue, topic: str, group: str, n: int = 0) -> None:
    """Wait until the pair's backlog is ``n`` (acks settle asynchronously on a real broker)."""

    async def check() -> bool:
        return await queue.backlog(topic, group) == n

    await eventually(check, harness.wait_s, f"backlog of {topic}/{group} to be {n}")


# ---------------------------------------------------------------------------
# Waiting


class Collector:
    """Records what a handler saw and lets a case wait for it."""

    def __init__(self, harness: Harness, outcome: Optional[Callable[[Any], Any]] = None) -> None:
        self.harness = harness
        self.items: list[Any] = []
        self._outcome = outcome
        self._changed = asyncio.Event()

    async def __call__(self, item: Any) -> Any:
        self.items.append(item)
        self._changed.set()
        if self._outcome is not None:
            result = self._outcome(item)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        return None

    async def stream_handler(self, topic: str, event: Event) -> None:
        await self.__call__((topic, event))

    def __len__(self) -> int:
        return len(self.items)

    async def wait_for(self, n: int, timeout_s: Optional[float] = None) -> list[Any]:
        await eventually(lambda: len(self.items) >= n, timeout_s or self.harness.wait_s, f"{n} deliveries (have {len(self.items)})")
        return self.items

    async def quiet(self, expect: Optional[int] = None) -> None:
        """Assert nothing beyond ``expect`` (default: what has arrived so far) arrives in the quiet window."""
        count = len(self.items) if expect is None else expect
        await asyncio.sleep(self.harness.quiet_s)
        assert len(self.items) == count, f"expected {count} deliveries, got {len(self.items)}: {self.items!r}"

    # Convenience views
    def payloads(self, key: str = "i") -> list[Any]:
        out = []
        for item in self.items:
            event = getattr(item, "event", None)
            if event is None and isinstance(item, tuple):
                event = item[1]
            out.append(event.payload.get(key) if event is not None else None)
        return out


Waitable = Callable[[], Awaitable[Any]]
