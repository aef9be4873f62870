"""Prometheus metrics: one registry per engine, counted at the seams that decide, exposed at ``GET /metrics``.

Nothing here is a module-level registry: :class:`EngineMetrics` owns a
``CollectorRegistry`` and the :class:`~crewlet.engine.core.Engine` owns one of
those, so two engines in one process (a test's) count apart and a scrape sees
only its own engine.

Where each number comes from:

* The queue client tells its :class:`~crewlet.queue.contract.QueueObserver`
  (this class) of every publish and every settlement it decides, so the
  publish, delivery (ack / nak / defer / dead letter) and dead-letter counters
  are counted in the one place that decides them, for every service alike. The
  turn counters, turn and round latencies, tokens and a round's provider
  retries (``rounds[].retries``, by the failure's kind) are read off the
  ``agent_turn_*`` and ``agent_phase_completed`` events as they are published.
* The webhook view reports each delivery's status and how long it took to answer.
* ``/ws/stream`` reports its sockets opening and closing.
* What is state rather than a count (a mailbox's depth, the event-store
  writer's backlog, whether each engine service is alive) is read when
  scraped (:class:`_EngineState`); the depths need the broker, so
  :meth:`EngineMetrics.refresh` asks it, on the engine's loop, before the
  registry is rendered.

Every label takes a bounded set of values: a stream name, an outcome, a
webhook source (the routes' fixed list), an HTTP status, a seat of the
company, a service name. Never a trace id, an event id or free text.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from crewlet.events import Event
from crewlet.events.types import AgentPhaseCompleted, AgentTurnCompleted, AgentTurnStarted
from crewlet.engine.interfaces import EVENT_STORE, FLEET, FLEET_READS
from crewlet.queue import topics
from crewlet.queue.contract import PUBLISHED_OK, SETTLED_DEAD_LETTER
from crewlet.queue.errors import QueueError

if TYPE_CHECKING:  # pragma: no cover - hints only
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.engine.metrics")

#: Every metric's name starts with this.
PREFIX = "crewlet_"
#: What ``GET /metrics`` answers with (the Prometheus text format, version 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: How long a scrape waits for the broker's mailbox depths before rendering without them.
DEPTH_TIMEOUT_S = 2.0
#: The stream label of a subject no stream holds (not expected: every valid subject has one).
UNKNOWN_STREAM = "unknown"

#: Turn and round latencies: from an echo provider's milliseconds to a long agent turn.
TURN_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
#: A webhook is answered once its delivery is published: milliseconds, unless the broker is slow.
ACCEPT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# The event types read off the publishes (their wire names are the registry's).
_TURN_STARTED = AgentTurnStarted.event_type
_TURN_COMPLETED = AgentTurnCompleted.event_type
_PHASE_COMPLETED = AgentPhaseCompleted.event_type
#: Token kinds, as the turn's event names them (``<kind>_tokens``).
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")


@functools.lru_cache(maxsize=4096)
def stream_of(topic: str) -> str:
    """The JetStream stream name that holds ``topic`` (a bounded label: one per namespace)."""
    try:
        return topics.stream_for(topic).name
    except Exception:
        return UNKNOWN_STREAM


def _seconds_of_ms(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value) / 1000.0


def _field(event: Event, name: str) -> Any:
    """A field of the event's typed body (``data``): the body object as built, or its dict once decoded."""
    data = event.data
    if isinstance(data, dict):
        return data.get(name)
    return getattr(data, name, None)


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class EngineMetrics:
    """The registry of one engine, and the observer that fills it.

    ``engine`` is read at scrape time for the state gauges; without one
    (a queue observed on its own) only the counters are there.
    """

    def __init__(self, engine: Optional["Engine"] = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.webhook_deliveries = Counter(
            "crewlet_webhook_deliveries", "Webhook deliveries answered, by source and HTTP status.",
            ["source", "status"], registry=r,
        )
        self.webhook_accept = Histogram(
            "crewlet_webhook_accept_seconds", "Time from a webhook's request to its answer, by source.",
            ["source"], buckets=ACCEPT_BUCKETS_S, registry=r,
        )
        self.publishes = Counter(
            "crewlet_queue_publishes", "Events published by this process, by stream and outcome (ok, failed).",
            ["stream", "outcome"], registry=r,
        )
        self.deliveries = Counter(
            "crewlet_queue_deliveries",
            "Fetched messages settled by this process, by stream and outcome (ack, nak, defer, dead_letter).",
            ["stream", "outcome"], registry=r,
        )
        self.dead_letters = Counter(
            "crewlet_queue_dead_letters", "Messages this process copied to CREWLET_DLQ, by stream and reason.",
            ["stream", "reason"], registry=r,
        )
        self.turns_started = Counter("crewlet_turns_started", "Agent turns started (resumed segments included).", registry=r)
        self.turns_completed = Counter("crewlet_turns_completed", "Agent turns that ended without failing.", registry=r)
        self.turns_failed = Counter("crewlet_turns_failed", "Agent turns that failed.", registry=r)
        self.turn_seconds = Histogram(
            "crewlet_turn_seconds", "Duration of agent turns, failed ones included.", buckets=TURN_BUCKETS_S, registry=r
        )
        self.round_seconds = Histogram(
            "crewlet_turn_round_seconds", "Duration of each model call (round) within a turn's phases.",
            buckets=TURN_BUCKETS_S, registry=r,
        )
        self.tokens = Counter(
            "crewlet_llm_tokens", "Model tokens spent by agent turns, by kind (input as billed, output, and the cached input counted raw: cache_read, cache_write).",
            ["kind"], registry=r,
        )
        self.llm_retries = Counter(
            "crewlet_llm_retries",
            "Model provider calls retried within a round before the chain moved on, by the failure's kind.",
            ["kind"], registry=r,
        )
        self.ws_clients = Gauge("crewlet_ws_stream_clients", "Open /ws/stream sockets.", registry=r)
        self._depths: dict[str, int] = {}
        # Each labelled child looked up once (keyed by its bounded labels): publishes and settlements are the hot path.
        self._publish_children: dict[tuple[str, str], Any] = {}
        self._settle_children: dict[tuple[str, str], Any] = {}
        self._state = _EngineState(self, engine)
        r.register(self._state)

    # -- the queue's observer ------------------------------------------------------------

    @staticmethod
    def _count_on(children: dict[tuple[str, str], Any], family: Any, topic: str, outcome: str) -> None:
        """Add one to ``family``'s (stream, outcome) child, kept in ``children`` once looked up (``labels`` takes a lock)."""
        key = (stream_of(topic), outcome)
        child = children.get(key)
        if child is None:
            child = children[key] = family.labels(*key)
        child.inc()

    def published(self, topic: str, event: Event, outcome: str) -> None:
        self._count_on(self._publish_children, self.publishes, topic, outcome)
        if outcome != PUBLISHED_OK:
            return  # not published (the emitter's retry, if it gets through, is counted then)
        kind = event.type
        if kind == _TURN_STARTED:
            self.turns_started.inc()
        elif kind == _TURN_COMPLETED:
            self._turn_completed(event)
        elif kind == _PHASE_COMPLETED:
            for one in _field(event, "rounds") or ():
                seconds = _seconds_of_ms(one.get("duration_ms")) if isinstance(one, dict) else None
                if seconds is not None:
                    self.round_seconds.observe(seconds)
                self._retries(one.get("retries") if isinstance(one, dict) else None)

    def _retries(self, retries: Any) -> None:
        """One round entry's retries counted by kind (a provider kind: a bounded label)."""
        for retry in retries if isinstance(retries, list) else ():
            kind = retry.get("kind") if isinstance(retry, dict) else None
            if isinstance(kind, str) and kind and len(kind) <= 64:
                self.llm_retries.labels(kind).inc()

    def _turn_completed(self, event: Event) -> None:
        (self.turns_failed if _field(event, "failed") else self.turns_completed).inc()
        seconds = _seconds_of_ms(_field(event, "duration_ms"))
        if seconds is not None:
            self.turn_seconds.observe(seconds)
        for kind in TOKEN_KINDS:
            spent = _count(_field(event, f"{kind}_tokens"))
            if spent:
                self.tokens.labels(kind).inc(spent)

    def settled(self, topic: str, outcome: str, reason: str) -> None:
        self._count_on(self._settle_children, self.deliveries, topic, outcome)
        if outcome == SETTLED_DEAD_LETTER:
            self.dead_letters.labels(stream_of(topic), reason).inc()

    # -- the web's reports ---------------------------------------------------------------

    def webhook(self, source: str, status: int, seconds: float) -> None:
        """One webhook delivery answered with ``status`` after ``seconds`` (``source`` is the route's)."""
        self.webhook_deliveries.labels(source, str(int(status))).inc()
        self.webhook_accept.labels(source).observe(max(seconds, 0.0))

    # -- scraping --------------------------------------------------------------------------

    async def refresh(self, timeout_s: float = DEPTH_TIMEOUT_S) -> None:
        """Ask the broker for every agent seat's mailbox depth (on the engine's loop), for the next render.

        A broker that does not answer within ``timeout_s`` leaves the depths
        out of this scrape rather than holding the scraper: a missing series
        is what Prometheus expects of a source it cannot read.
        """
        engine = self._state.engine
        queue = engine.queue if engine is not None else None
        if queue is None:
            self._depths = {}
            return
        seats = self._state.agent_seats()

        async def one(handle: str) -> tuple[str, int]:
            return handle, await queue.backlog(topics.agent_inbox(handle), topics.agent_inbox_group(handle))

        try:
            found = await asyncio.wait_for(asyncio.gather(*(one(h) for h in seats)), timeout=timeout_s)
        except (asyncio.TimeoutError, QueueError, OSError) as exc:
            log.warning("metrics_depths_unavailable", extra={"error": type(exc).__name__, "seats": len(seats)})
            self._depths = {}
            return
        self._depths = dict(found)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def depths(self) -> dict[str, int]:
        return dict(self._depths)


def _gauge(name: str, documentation: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(labels))


class _EngineState(Collector):
    """The gauges that are state, read from the engine when scraped (nothing is kept in between)."""

    def __init__(self, metrics: EngineMetrics, engine: Optional["Engine"]) -> None:
        self.metrics = metrics
        self.engine = engine

    def describe(self) -> list[Metric]:
        return []  # read when scraped: nothing to describe before the engine runs

    def collect(self) -> Iterator[Metric]:
        return iter(list(self._families()))

    def agent_seats(self) -> list[str]:
        """The company's agent seats (the ones with mailboxes)."""
        holder = getattr(self.engine, "company", None)
        if holder is None:
            return []
        try:
            return [seat.handle for seat in holder.current().agent_seats()]
        except Exception:
            return []

    def _families(self) -> Iterator[Metric]:
        yield from self._mailboxes()
        yield from self._services()
        yield from self._event_store()
        yield from self._fleet_reads()
        yield from self._leases()
        yield from self._telemetry()

    def _mailboxes(self) -> Iterator[Metric]:
        depth = _gauge(
            "crewlet_mailbox_depth", "Messages a seat's inbox retains that are not acked yet (the broker's count).", ["seat"]
        )
        for handle, value in sorted(self.metrics.depths().items()):
            depth.add_metric([handle], value)
        yield depth
        pending = _gauge(
            "crewlet_mailbox_pending",
            "Messages of a seat's inbox this node has fetched and not settled yet (a turn working or waiting on them).",
            ["seat"],
        )
        queue = self.engine.queue if self.engine is not None else None
        if queue is not None:
            for handle in self.agent_seats():
                pending.add_metric([handle], queue.held_count(topics.agent_inbox(handle), topics.agent_inbox_group(handle)))
        yield pending

    def _services(self) -> Iterator[Metric]:
        up = _gauge("crewlet_engine_service_up", "1 while an engine service (a duty) is alive, 0 once it died.", ["service"])
        if self.engine is not None:
            for name, alive in sorted(self.engine.duties().items()):
                up.add_metric([name], 1.0 if alive else 0.0)
        yield up

    def _event_store(self) -> Iterator[Metric]:
        service = self.engine.find(EVENT_STORE) if self.engine is not None else None
        writer = service.writer if service is not None else None
        if writer is None:
            return
        yield GaugeMetricFamily(
            "crewlet_eventstore_writer_backlog_rows", "Rows published and not yet written to the event store.",
            value=float(writer.backlog),
        )
        yield CounterMetricFamily(
            "crewlet_eventstore_rows_refused",
            "Rows the event store refused for what they held, set aside so the rows behind them were written.",
            value=float(writer.refused),
        )
        yield GaugeMetricFamily(
            "crewlet_eventstore_writer_lag_seconds",
            "Age of the oldest event whose row is still owed to the event store (0 when none is).",
            value=float(writer.lag_s(datetime.now(timezone.utc))),
        )

    def _fleet_reads(self) -> Iterator[Metric]:
        """The history_partial alarm's ratio: this node's history reads, by whether every live node answered."""
        reads = self.engine.find(FLEET_READS) if self.engine is not None else None
        if reads is None:
            return
        asked = CounterMetricFamily(
            "crewlet_history_reads", "History reads this node asked of the fleet, by coverage (complete, partial).", labels=["coverage"]
        )
        asked.add_metric(["complete"], float(reads.reads - reads.partial))
        asked.add_metric(["partial"], float(reads.partial))
        yield asked
        yield CounterMetricFamily(
            "crewlet_history_kept_questions",
            "Rounds of this node's history reads that asked every node which named rows it keeps (a custody batch in flight).",
            value=float(reads.kept_asked),
        )

    def _leases(self) -> Iterator[Metric]:
        """This node's leases as its fleet membership holds them now: presence, each seat, each duty."""
        member = self.engine.find(FLEET) if self.engine is not None else None
        if member is None:
            return
        yield GaugeMetricFamily(
            "crewlet_fleet_present", "1 while this node's presence lease is good by its own deadline.",
            value=1.0 if member.present() else 0.0,
        )
        held = member.seats()
        seats = _gauge("crewlet_seat_lease_held", "1 for each agent seat whose lease this node holds, 0 for the others.", ["seat"])
        for handle in self.agent_seats():
            seats.add_metric([handle], 1.0 if handle in held else 0.0)
        yield seats
        duties = _gauge("crewlet_duty_lease_held", "1 for each once-per-fleet duty whose lease this node holds.", ["duty"])
        for name in sorted(member.duties()):
            duties.add_metric([name], 1.0)
        yield duties

    def _telemetry(self) -> Iterator[Metric]:
        emitter = self.engine.emitter if self.engine is not None else None
        if emitter is None:
            return
        yield GaugeMetricFamily(
            "crewlet_telemetry_pending_events", "Telemetry events held for a retry because the broker was away.",
            value=float(emitter.pending),
        )


__all__ = ["CONTENT_TYPE", "EngineMetrics", "PREFIX", "TOKEN_KINDS", "stream_of"]
