"""Company config revisions: create (validated), activate (compare-and-set), and every node's poller.

A revision is the company file's text, validated exactly as the file is
(:func:`crewlet.org.parse_company_text`, so a bad value is refused with the
same ``field=value: allowed`` message). Exactly one revision is active: the
single :class:`~crewlet.models.ActivationPointer` row names it, and
:func:`activate` moves it with a conditional UPDATE, so only the caller whose
update matched announces ``config_revision_activated`` — after the commit — on
``crewlet.config.revision_activated`` (and ``crewlet.events.…``, where the
event is recorded).

That announcement is a best-effort nudge. The authoritative path is
:class:`ConfigPoller`, one per node: it reads the pointer every
``interval_s`` (10 s by default; a nudge wakes it early), parses the active
revision, hands it to the running seat runtime (``SeatRuntime.apply``: the
holder swap, ``ensure_mailboxes``, the coalesce knobs and gate, the
no-provider holds) and publishes ``config_revision_applied`` with its node,
the outcome and the last step it reached.

Sync callers (the admin) announce on the loop of the engine running in this
process (:func:`crewlet.runtime.current_engine`); with no engine in the
process the change is stored and every node's poller still applies it.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from asgiref.sync import sync_to_async
from django.db import IntegrityError, transaction
from django.utils import timezone

from crewlet import events, runtime
from crewlet.events import Trace
from crewlet.events.emit import Emitter
from crewlet.engine import Periodic, Service
from crewlet.events.types import ConfigRevisionActivated, ConfigRevisionApplied
from crewlet.interfaces import CONFIG_POLLER, SEAT_RUNTIME, SeatLoops
from crewlet.org import CompanyError, Organization, parse_company_text, read_company_text
from crewlet.queue import topics
from crewlet.queue.contract import Closable, EventQueue
from crewlet.queue.errors import QueueError

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine import Engine

log = logging.getLogger("crewlet.revisions")

#: How often every node reads the activation pointer (the authoritative path).
POLL_EVERY_S = 10.0
#: How long the sync path waits for the engine loop to publish an activation.
ANNOUNCE_TIMEOUT_S = 10.0
_CAS_ATTEMPTS = 8

#: The steps of applying a revision, in order; ``reached`` names the last one completed.
STEPS = ("read", "parsed", "applied")


def validate(yaml_text: str) -> Organization:
    """The revision's company, or the file's own :class:`CompanyError`."""
    return parse_company_text(yaml_text)


def create_revision(yaml_text: str, author: str, note: str = "") -> Any:
    """Store a new (inactive) revision after validating it; raises :class:`CompanyError` when bad."""
    from crewlet.models import ConfigRevision

    validate(yaml_text)
    return ConfigRevision.objects.create(yaml_text=yaml_text, author=author, note=note)


def active_revision() -> Any:
    """The active :class:`~crewlet.models.ConfigRevision`, or None when none was ever activated."""
    from crewlet.models import ActivationPointer

    pointer = ActivationPointer.objects.select_related("revision").filter(pk=ActivationPointer.ROW_ID).first()
    return pointer.revision if pointer is not None else None


@dataclass(frozen=True)
class Activation:
    """One won move of the pointer."""

    revision: int
    previous: int
    by: str

    def event(self) -> events.Event:
        body = ConfigRevisionActivated(revision=self.revision, previous_revision=self.previous, activated_by=self.by)
        return events.new(body, Trace.root(), source="operator")


def activate_cas(revision_id: int, by: str) -> Optional[Activation]:
    """Point at ``revision_id``; the change, or None when it already was the active one."""
    from crewlet.models import ActivationPointer, ConfigRevision

    if not ConfigRevision.objects.filter(pk=revision_id).exists():
        raise ConfigRevision.DoesNotExist(f"no config revision {revision_id}")
    for _ in range(_CAS_ATTEMPTS):
        now = timezone.now()
        current = ActivationPointer.objects.filter(pk=ActivationPointer.ROW_ID).values_list("revision_id", flat=True).first()
        if current == revision_id:
            return None
        if current is None:
            try:
                with transaction.atomic(using="default"):
                    ActivationPointer.objects.create(
                        id=ActivationPointer.ROW_ID, revision_id=revision_id, activated_at=now, activated_by=by
                    )
            except IntegrityError:
                continue  # someone activated first: read again
            return Activation(revision_id, 0, by)
        moved = ActivationPointer.objects.filter(pk=ActivationPointer.ROW_ID, revision_id=current).update(
            revision_id=revision_id, activated_at=now, activated_by=by
        )
        if moved:
            return Activation(revision_id, current, by)
    raise RuntimeError(f"could not activate revision {revision_id}: the pointer kept changing")


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


def import_first_revision(path: str | Path, author: str = "up") -> Any:
    """Store and activate the company file as the first revision — only when the store has none.

    Returns the new revision, or None when revisions already exist. A bad file
    raises :class:`CompanyError` (naming the file) and stores nothing.
    """
    from crewlet.models import ConfigRevision

    p = Path(path)
    text = read_company_text(p)
    parse_company_text(text, source=str(p))
    with transaction.atomic(using="default"):
        if ConfigRevision.objects.exists():
            return None
        revision = ConfigRevision.objects.create(yaml_text=text, author=author, note=f"imported from {p.name}")
        activate_cas(revision.pk, author)
    log.info("config_revision_imported", extra={"revision": revision.pk, "path": str(p)})
    return revision


# -- the poller ---------------------------------------------------------------------------------


def _active_row() -> Optional[tuple[int, str]]:
    revision = active_revision()
    return (revision.pk, revision.yaml_text) if revision is not None else None


class ConfigPoller:
    """One node's duty: apply the active revision to the running seat runtime whenever it changes.

    ``runtime`` is the engine's :data:`~crewlet.interfaces.SEAT_RUNTIME` (its
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
        row = await sync_to_async(_active_row)()
        if row is not None and row[1] == self.runtime.holder.current().source_text:
            self.applied = row[0]

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
        row = await sync_to_async(_active_row)()
        if row is None or row[0] == self.applied:
            return None
        revision_id, text = row
        result = ConfigRevisionApplied(revision=revision_id, outcome="failed", reached="read")
        try:
            org = parse_company_text(text)
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
    """The poller as the :data:`~crewlet.interfaces.CONFIG_POLLER` service, started once the seat runtime runs."""

    def make(engine: "Engine") -> ConfigPoller:
        assert engine.queue is not None
        return ConfigPoller(
            engine.queue,
            engine.service(SEAT_RUNTIME),
            node_id=engine.settings.node.id,
            interval_s=interval_s,
            emitter=engine.emitter,
        )

    return [Service(CONFIG_POLLER, make, depends_on=(SEAT_RUNTIME,))]


def adopt_active(holder: Any) -> Optional[int]:
    """Serve the active revision from the start when the store has one; its id, else None (the file stays)."""
    from django.db import DatabaseError

    try:
        row = _active_row()
    except DatabaseError:
        log.warning("config_revisions_unavailable", extra={"reason": "store not migrated"}, exc_info=True)
        return None
    if row is None:
        return None
    try:
        org = parse_company_text(row[1])
    except CompanyError as exc:
        log.error("config_revision_unusable", extra={"revision": row[0], "error": str(exc)})
        return None
    holder.swap(org)
    return row[0]


__all__ = [
    "POLL_EVERY_S",
    "ConfigPoller",
    "aactivate",
    "activate",
    "active_revision",
    "adopt_active",
    "create_revision",
    "import_first_revision",
    "services",
    "validate",
]
