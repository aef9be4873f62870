"""The engine's side of config revisions: an activation announced on the engine's loop, and every node's poller.

Storing and moving the pointer is :mod:`crewlet.company.revisions`; what
needs a running engine (its queue, its loop, its seat runtime) is here, one
floor up, so the company floor imports no engine.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Optional

from asgiref.sync import sync_to_async
from django.db import transaction

from crewlet import events
from crewlet.events import Trace
from crewlet.company.revisions import POLL_EVERY_S, Activation, activate_cas, active_row
from crewlet.engine import runtime
from crewlet.engine.interfaces import CONFIG_POLLER, SEAT_RUNTIME, SeatLoops
from crewlet.engine.services import Periodic, Service, Task
from crewlet.events.types import ConfigRevisionApplied
from crewlet.queue import topics
from crewlet.queue.contract import Closable, EventQueue
from crewlet.queue.emit import Emitter
from crewlet.queue.errors import QueueError

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.company.revisions")

#: How long the sync path waits for the engine loop to publish an activation.
ANNOUNCE_TIMEOUT_S = 10.0
#: The service that announces an activation ``up`` made before the engine ran.
ANNOUNCE_AT_START = "config_revision_announce_at_start"


# -- announcing ---------------------------------------------------------------------------


async def _announce(queue: EventQueue, change: Activation) -> None:
    event = change.event()
    emitter = runtime.emitter_for(queue)
    for topic in (topics.CONFIG_REVISION_ACTIVATED, topics.event(event.type)):
        await emitter.publish(topic, event, log_event="config_revision_activated_publish_failed")
    log.info("config_revision_activated", extra={"revision": change.revision, "previous": change.previous, "by": change.by})


def activate(revision_id: int, by: str) -> bool:
    """Sync activation (the admin): True when this call moved the pointer; announced after commit.

    Announced on the engine running in this process; with none, the change
    is stored and every node's poller still applies it.
    """
    running = runtime.current_engine()

    def announce(change: Activation) -> None:
        queue = running.queue if running is not None else None
        if running is None or queue is None:
            log.info("config_revision_activated_unannounced", extra={"revision": change.revision, "reason": "no engine here"})
            return
        try:
            running.call(lambda: _announce(queue, change), ANNOUNCE_TIMEOUT_S)
        except Exception:
            # The pointer moved whatever happens here; every node's poller applies it.
            log.warning("config_revision_announce_failed", extra={"revision": change.revision}, exc_info=True)

    with transaction.atomic(using="default"):
        change = activate_cas(revision_id, by)
        if change is not None:
            transaction.on_commit(lambda: announce(change), using="default")
    return change is not None


async def aactivate(revision_id: int, by: str, *, queue: Optional[EventQueue] = None) -> bool:
    """Async activation; announced on ``queue`` (default the running engine's) when this call moved the pointer."""
    change = await sync_to_async(activate_cas)(revision_id, by)
    if change is None:
        return False
    q = queue or runtime.current_queue()
    if q is not None:
        await _announce(q, change)
    return True


def announce_at_start(engine: "Engine", change: Activation) -> None:
    """Register the announcement of ``change`` on ``engine``: published once every service registered so far runs.

    ``up`` moves the pointer to the company file's new revision before the
    engine (and its queue) exists; this publishes that activation as soon as
    it can, after the event store's writer listens, so the event is recorded.
    A publish that fails is logged and never stops the engine: the pointer
    has moved whatever happens to the announcement.
    """

    async def announce() -> None:
        assert engine.queue is not None
        await _announce(engine.queue, change)

    engine.add(
        Service(
            ANNOUNCE_AT_START,
            lambda _engine: Task(ANNOUNCE_AT_START, announce, once=True),
            after=tuple(s.name for s in engine.registered),
        )
    )


# -- the poller ---------------------------------------------------------------------------------


class ConfigPoller:
    """One node's duty: apply the active revision to the running seat runtime whenever it changes.

    ``runtime`` is the engine's :data:`~crewlet.engine.interfaces.SEAT_RUNTIME` (its
    ``holder`` and ``async apply(org)``). At start the revision whose text the
    runtime already serves counts as applied, so a restart is not a change.
    """

    def __init__(
        self,
        queue: EventQueue,
        runtime: SeatLoops,
        node_id: str = "",
        interval_s: float = POLL_EVERY_S,
        *,
        emitter: Optional[Emitter] = None,
    ) -> None:
        self.queue = queue
        self.runtime = runtime
        self.node_id = node_id or queue.node
        self.interval_s = interval_s
        self.applied: Optional[int] = None
        self._periodic = Periodic("config_poll", interval_s, self.poll, logger=log)
        self._nudge: Optional[Closable] = None
        self._owns_emitter = emitter is None
        self.emitter = emitter or Emitter(queue)

    async def start(self) -> None:
        row = await sync_to_async(active_row)()
        if row is not None and row.served_by(self.runtime.holder.current()):
            self.applied = row.revision

        async def nudge(_topic: str, _event: events.Event) -> None:
            self._periodic.wake()

        try:
            self._nudge = await self.queue.subscribe_stream(topics.CONFIG_REVISION_ACTIVATED, nudge)
        except QueueError:
            log.warning("config_revision_nudge_unavailable", exc_info=True)  # the poll still applies it
        await self._periodic.start()

    async def stop(self) -> None:
        if self._nudge is not None:
            await self._nudge.close()
            self._nudge = None
        await self._periodic.stop()
        if self._owns_emitter:
            await self.emitter.close()

    async def poll(self) -> Optional[ConfigRevisionApplied]:
        """One pass: apply the active revision if it is not the one applied; what was published, if anything."""
        row = await sync_to_async(active_row)()
        if row is None or row.revision == self.applied:
            return None
        revision_id = row.revision
        result = ConfigRevisionApplied(revision=revision_id, outcome="failed", reached="read")
        try:
            org = row.company()
            result.reached = "parsed"
            await self.runtime.apply(org)
            result.reached = "applied"
            result.outcome = "applied"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a stored revision that no longer parses, a broker that refused a mailbox
            result.error = str(exc) or type(exc).__name__
            if result.reached == "parsed":
                result.outcome = "partial"  # the holder may already serve it; the rest is retried next change
        # A failed revision is not retried every pass: the next activation is the next attempt.
        self.applied = revision_id
        await self._publish(result)
        level = logging.INFO if result.outcome == "applied" else logging.ERROR
        log.log(level, "config_revision_applied", extra={"node": self.node_id, "revision": revision_id,
                                                         "outcome": result.outcome, "reached": result.reached,
                                                         "error": result.error})
        return result

    async def _publish(self, body: ConfigRevisionApplied) -> None:
        event = events.new(body, Trace.root())
        for topic in (topics.CONFIG_REVISION_APPLIED, topics.event(event.type)):
            await self.emitter.publish(topic, event, log_event="config_revision_applied_publish_failed")


def services(engine: "Engine", interval_s: float = POLL_EVERY_S) -> list[Service]:
    """The poller as the :data:`~crewlet.engine.interfaces.CONFIG_POLLER` service, started once the seat runtime runs."""

    def make(engine: "Engine") -> ConfigPoller:
        assert engine.queue is not None
        return ConfigPoller(
            engine.queue,
            engine.get(SEAT_RUNTIME),
            node_id=engine.settings.node.id,
            interval_s=interval_s,
            emitter=engine.emitter,
        )

    return [Service(CONFIG_POLLER, make, depends_on=(SEAT_RUNTIME,))]


__all__ = ["ANNOUNCE_AT_START", "ANNOUNCE_TIMEOUT_S", "ConfigPoller", "aactivate", "activate", "announce_at_start", "services"]
