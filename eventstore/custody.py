"""Custody: a stateless node's events kept by a data node, and the keeper's settle pass.

Design (A stateless node's row can sit on two data nodes for a moment): a node
with ``node.data: false`` keeps no event store. Its publish listener is a
:class:`CustodyWriter`, which hands the rows it would have written to one live
data node in custody batches:

1. The batch is claimed in the coordination store (:class:`crewlet.models.CustodyClaim`)
   for a keeper chosen among the live data nodes, before anything is sent.
2. The rows go to that keeper on its custody subject (core request/reply); the
   keeper writes them into its store marked with the batch's id
   (``custody_batch``) and answers how many it kept.
3. A keeper that does not answer within ``history.custody_timeout_s`` loses the
   claim to a second keeper (a compare-and-set on the claim's keeper, refused
   once the claim is closed), and the batch goes there.

So a keeper that was slow rather than dead may write the batch too: until it
settles it, both stores hold the same rows. Each data node's
:class:`CustodyKeeper` settles every batch it has written once a pass
(``history.custody_settle_s``): a claim still naming it is closed by it (so the
stateless node can no longer move it) and its rows are kept for good; a claim
naming another keeper, or gone because that keeper settled it, means the rows
are not its own, and they are deleted. Fleet reads hold an unsettled row once
meanwhile (eventstore.fanout, the ``kept`` question).

A publish awaits the batch its row went in, as the writer's publish awaits the
row's commit; a batch no keeper took is kept in the writer's backlog and tried
again with a backoff, and publishes meanwhile do not wait for it (telemetry
never fails or stalls a publish). The writer's backlog and lag are the same
gauges the store writer reports.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional, Sequence

from django.db import connections

from crewlet.base.db import in_store
from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.engine.services import Periodic
from crewlet.events import Event
from crewlet.fleet.roster import live_node_ids
from crewlet.models import CustodyClaim
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import QueueError
from eventstore.rows import COLUMNS, CUSTODY_COLUMN, TABLE, row_for
from eventstore.writer import BACKLOG_MAX, CLOSE_FLUSH_S, RETRY_FIRST_S, RETRY_MAX_S, StoreThread, insert_rows

log = logging.getLogger("crewlet.eventstore.custody")

#: The wire of a custody batch and its answer (JSON objects).
K_BATCH = "batch"
K_ORIGIN = "origin"
K_EVENTS = "events"
K_KEPT = "kept"
K_ERROR = "error"

#: Rows one custody batch carries at most, and (roughly) bytes of events: well under a core message's limit.
BATCH_ROWS = 500
BATCH_BYTES = 1024 * 1024
#: A claim a keeper closed and settled is deleted at once; one left behind by a crash between the two is
#: deleted by its keeper's pass after this long (it names a batch that keeper already holds for good).
FORGET_CLAIM_S = 86400.0

#: How long the custody writer goes on using one reading of the live data nodes (a roster read per batch otherwise).
ROSTER_FRESH_S = 1.0

_TS = COLUMNS.index("ts")


# -- the coordination store's claims (blocking; run through in_store) --------------------------------------


def live_keepers(exclude: str) -> list[str]:
    """The live data nodes (a presence naming an event store), sorted, ``exclude`` left out."""
    return [node for node in live_node_ids(stores_only=True) if node != exclude]


def claim(batch: str, origin: str, keeper: str, rows: int) -> None:
    CustodyClaim.objects.create(batch=batch, origin=origin, keeper=keeper, rows=rows)


def claim_state(batch: str) -> Optional[tuple[str, bool]]:
    """(keeper, closed) of ``batch``'s claim; None once its keeper settled it and deleted it."""
    row = CustodyClaim.objects.filter(batch=batch).values_list("keeper", "closed").first()
    return (str(row[0]), bool(row[1])) if row is not None else None


def move_claim(batch: str, old: str, new: str) -> bool:
    """Give ``batch`` to ``new`` if ``old`` still has it and nobody closed it (a compare-and-set)."""
    return CustodyClaim.objects.filter(batch=batch, keeper=old, closed=False).update(keeper=new) == 1


def close_claim(batch: str, keeper: str) -> bool:
    """Close ``batch``'s claim if it names ``keeper``: from now on nobody can move it."""
    return CustodyClaim.objects.filter(batch=batch, keeper=keeper).update(closed=True) == 1


def claimed_by(keeper: str, batches: set[str]) -> set[str]:
    """Which of ``batches`` have a claim naming ``keeper`` (blocking; a fleet read's part asks it)."""
    if not batches:
        return set()
    return set(CustodyClaim.objects.filter(batch__in=sorted(batches), keeper=keeper).values_list("batch", flat=True))


def forget_claim(batch: str, keeper: str) -> None:
    CustodyClaim.objects.filter(batch=batch, keeper=keeper).delete()


def forget_stale_claims(keeper: str, older_than_s: float) -> int:
    """Claims naming ``keeper`` older than ``older_than_s``: settled by it long ago, or never sent anywhere."""
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than_s)
    deleted, _ = CustodyClaim.objects.filter(keeper=keeper, claimed_at__lt=cutoff).delete()
    return int(deleted)


# -- the wire ----------------------------------------------------------------------------------------------


def encode_batch(batch: str, origin: str, events: Sequence[tuple[str, str]]) -> bytes:
    return json.dumps({K_BATCH: batch, K_ORIGIN: origin, K_EVENTS: [list(e) for e in events]}).encode()


def decode_batch(raw: bytes) -> tuple[str, str, list[tuple[str, Event]]]:
    """(batch id, origin node, [(topic, event)]); ValueError for anything else."""
    body = json.loads(raw)
    if not isinstance(body, dict) or not isinstance(body.get(K_BATCH), str) or not body[K_BATCH]:
        raise ValueError("a custody batch is an object with a batch id")
    events = body.get(K_EVENTS)
    if not isinstance(events, list) or not all(isinstance(e, list) and len(e) == 2 for e in events):
        raise ValueError("a custody batch's events are [topic, event] pairs")
    return body[K_BATCH], str(body.get(K_ORIGIN, "")), [(str(t), Event.from_json(str(e))) for t, e in events]


# -- the stateless node's side -----------------------------------------------------------------------------


@dataclass
class _Batch:
    """Rows handed over together: claimed once, under one id, however many keepers it takes."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    events: list[tuple[str, str]] = field(default_factory=list)
    #: The oldest of its events' times (the writer's lag), and the bytes of its events so far.
    since: Optional[datetime] = None
    size: int = 0
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    claimed: bool = False

    def release(self) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()


class CustodyWriter:
    """A stateless node's publish listener: every stored event handed to a live data node in custody batches.

    ``keepers`` lists the live data nodes (blocking; the roster by default);
    ``timeout_s`` is how long a keeper has to answer before a second keeper is
    claimed; the retry spacing of a batch no keeper took and the last try at
    close are the store writer's.
    """

    def __init__(
        self,
        queue: EventQueue,
        node: str,
        *,
        timeout_s: float,
        keepers: Optional[Callable[[str], list[str]]] = None,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
        close_flush_s: float = CLOSE_FLUSH_S,
        backlog_max: int = BACKLOG_MAX,
    ) -> None:
        self.queue = queue
        self.node = node
        self.timeout_s = float(timeout_s)
        self._keepers = keepers or live_keepers
        self.retry_first_s = float(retry_first_s)
        self.retry_max_s = max(float(retry_max_s), self.retry_first_s)
        self.close_flush_s = float(close_flush_s)
        self.backlog_max = max(int(backlog_max), 1)
        #: Batches not yet kept by anyone, oldest first; the first is the one being handed over.
        self._batches: collections.deque[_Batch] = collections.deque()
        self._task: Optional[asyncio.Task[None]] = None
        self._failing = False
        self._closed = False
        self._turn = 0
        self._roster: list[str] = []
        self._roster_at: Optional[float] = None
        #: Rows a keeper has taken since start.
        self.handed = 0

    @property
    def backlog(self) -> int:
        """Rows published and not yet kept by a data node."""
        return sum(len(b.events) for b in self._batches)

    @property
    def refused(self) -> int:
        return 0

    def lag_s(self, now: datetime) -> float:
        """How old the oldest row no keeper has taken is, by its event's time (0 when none waits)."""
        since = self._batches[0].since if self._batches else None
        return max((now - since).total_seconds(), 0.0) if since is not None else 0.0

    async def __call__(self, topic: str, event: Event) -> None:
        row = row_for(topic, event)
        if row is None:
            return
        if self._closed:
            log.error("custody_writer_closed", extra={"event_id": event.id, "type": event.type})
            return
        text = event.to_json().decode()
        last = self._batches[-1] if self._batches else None
        # The first batch is in a keeper's hands (or about to be), and a claimed one is sent as claimed:
        # later rows start the next batch, which goes as soon as the one ahead of it is kept.
        if last is None or last is self._batches[0] or last.claimed or len(last.events) >= BATCH_ROWS or (
            last.size + len(text) > BATCH_BYTES
        ):
            last = _Batch()
            self._batches.append(last)
            self._trim()
        last.events.append((topic, text))
        last.size += len(text)
        if last.since is None:
            ts = row[_TS]
            last.since = ts if isinstance(ts, datetime) and ts.tzinfo else datetime.now(timezone.utc)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="custody-writer")
        if self._failing:
            return  # no keeper took the last batch: the row waits in the backlog, the publish does not
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        last.waiters.append(waiter)
        await asyncio.shield(waiter)

    def _trim(self) -> None:
        """Past ``backlog_max`` rows the oldest batch not in a keeper's hands is dropped, named in an error."""
        while self.backlog > self.backlog_max and len(self._batches) > 2:
            dropped = self._batches[1]
            del self._batches[1]
            dropped.release()
            log.error("custody_backlog_dropped", extra={"rows": len(dropped.events), "batch": dropped.id})

    async def _drain(self) -> None:
        wait_s = self.retry_first_s
        try:
            while self._batches:
                batch = self._batches[0]
                try:
                    kept = await self._hand(batch)
                except Exception as exc:  # the coordination store away, a broker hiccup: the batch waits
                    log.warning("custody_hand_failed", extra={"batch": batch.id, "error": type(exc).__name__})
                    kept = False
                if kept:
                    self._batches.popleft()
                    batch.release()
                    self.handed += len(batch.events)
                    self._failing = False
                    wait_s = self.retry_first_s
                    continue
                self._failing = True
                for waiting in self._batches:
                    waiting.release()
                if self._closed:
                    return
                await asyncio.sleep(wait_s)
                wait_s = min(wait_s * 2, self.retry_max_s)
        finally:
            self._task = None

    async def _hand(self, batch: _Batch) -> bool:
        """Give ``batch`` to a live data node: True once one keeps it (this call's or an earlier attempt's)."""
        keepers = await self._live_keepers()
        if not keepers:
            log.warning("custody_no_keeper", extra={"batch": batch.id, "rows": len(batch.events)})
            return False
        if not batch.claimed:
            current = keepers[self._turn % len(keepers)]  # in turn: the batches spread over the data nodes
            self._turn += 1
            await in_store(claim)(batch.id, self.node, current, len(batch.events))
            batch.claimed = True
        else:
            state = await in_store(claim_state)(batch.id)
            if state is None or state[1]:
                return True  # a keeper settled or closed it: the rows are kept
            current = state[0]
        start = keepers.index(current) if current in keepers else 0
        order = keepers[start:] + keepers[:start]
        payload = encode_batch(batch.id, self.node, batch.events)
        for target in order:
            if target != current:
                if not await in_store(move_claim)(batch.id, current, target):
                    # Only this node moves its claims: a refusal means the keeper closed it (or settled and forgot it).
                    return True
                log.warning("custody_claim_moved", extra={"batch": batch.id, "from": current, "to": target})
                current = target
            if await self._ask(target, payload, batch):
                # The claim stays open: only this node moves it, and it will not now; the keeper closes it as it settles.
                return True
        self._roster_at = None  # the next attempt asks the roster again
        return False

    async def _live_keepers(self) -> list[str]:
        """The live data nodes, read again at most every ROSTER_FRESH_S (and after a batch no keeper took)."""
        now = asyncio.get_running_loop().time()
        if self._roster_at is None or now - self._roster_at >= ROSTER_FRESH_S or not self._roster:
            self._roster = await in_store(self._keepers)(self.node)
            self._roster_at = now
        return self._roster

    async def _ask(self, keeper: str, payload: bytes, batch: _Batch) -> bool:
        try:
            replies = await self.queue.ask(topics.custody(keeper), payload, 1, self.timeout_s)
        except QueueError as exc:
            log.warning("custody_ask_failed", extra={"batch": batch.id, "keeper": keeper, "error": type(exc).__name__})
            return False
        for raw in replies:
            try:
                answer = json.loads(raw)
            except ValueError:
                continue
            if isinstance(answer, dict) and isinstance(answer.get(K_KEPT), int):
                log.info("custody_batch_kept", extra={"batch": batch.id, "keeper": keeper, "rows": len(batch.events)})
                return True
            log.warning("custody_batch_refused", extra={"batch": batch.id, "keeper": keeper, "error": str(answer)[:200]})
        if not replies:
            log.warning("custody_keeper_silent", extra={"batch": batch.id, "keeper": keeper, "timeout_s": self.timeout_s})
        return False

    async def aclose(self) -> None:
        """Hand over what waits (bounded by ``close_flush_s``), then stop; what no keeper took is named."""
        task = self._task
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=self.close_flush_s)
            except asyncio.TimeoutError:
                pass
        self._closed = True
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._batches:
            log.error("custody_rows_unhanded", extra={"rows": self.backlog, "batches": len(self._batches)})
        for batch in self._batches:
            batch.release()


# -- the data node's side ----------------------------------------------------------------------------------


def unsettled_batches(using: str = EVENTS_ALIAS) -> list[str]:
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT {CUSTODY_COLUMN} FROM {TABLE} WHERE {CUSTODY_COLUMN} > ''")
        return sorted(str(row[0]) for row in cursor.fetchall())


def keep_batch(batch: str, using: str = EVENTS_ALIAS) -> int:
    """The batch is this store's: its rows are kept for good."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET {CUSTODY_COLUMN} = '' WHERE {CUSTODY_COLUMN} = %s", [batch])
        return int(cursor.rowcount)


def drop_batch(batch: str, using: str = EVENTS_ALIAS) -> int:
    """The batch is another keeper's: this store's copy of its rows goes."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE {CUSTODY_COLUMN} = %s", [batch])
        return int(cursor.rowcount)


class CustodyKeeper:
    """A data node's side of custody: keeps what stateless nodes hand it, and settles it once a pass.

    ``every_s`` is ``history.custody_settle_s``; the first pass runs at start,
    so a node that was away settles what it wrote before it went.
    """

    def __init__(self, queue: EventQueue, node: str, *, every_s: float, using: str = EVENTS_ALIAS) -> None:
        self.queue = queue
        self.node = node
        self.using = using
        self._serving: Any = None
        self._store = StoreThread(using, "custody-keeper")
        self._settler = Periodic("custody_settle", every_s, self.settle, logger=log)
        self.settled = 0
        self.dropped = 0

    async def start(self) -> None:
        self._serving = await self.queue.serve(topics.custody(self.node), self.keep)
        await self._settler.start()

    async def stop(self) -> None:
        await self._settler.stop()
        serving, self._serving = self._serving, None
        if serving is not None:
            await serving.close()
        await self._store.aclose()

    async def keep(self, raw: bytes) -> bytes:
        """Write one custody batch marked unsettled; the answer says how many rows it held (or why not)."""
        try:
            batch, origin, events = decode_batch(raw)
        except (ValueError, TypeError, KeyError) as exc:
            return json.dumps({K_ERROR: f"unreadable custody batch: {type(exc).__name__}"}).encode()
        rows = [row for row in (row_for(topic, event) for topic, event in events) if row is not None]
        try:
            # A row already here stays as it is: a batch asked of this keeper again is written once.
            await self._store.run(lambda: insert_rows(rows, self.using, custody_batch=batch))
        except Exception as exc:
            log.warning("custody_write_failed", extra={"batch": batch, "origin": origin, "error": type(exc).__name__})
            return json.dumps({K_ERROR: f"the store did not take the batch: {type(exc).__name__}"}).encode()
        log.info("custody_batch_written", extra={"batch": batch, "origin": origin, "rows": len(rows)})
        return json.dumps({K_KEPT: len(rows)}).encode()

    async def settle(self) -> tuple[int, int]:
        """One pass: each batch this store holds unsettled is kept (its claim names this node) or dropped."""
        kept = dropped = 0
        for batch in await self._store.run(unsettled_batches, self.using):
            if await in_store(close_claim)(batch, self.node):
                rows = await self._store.run(keep_batch, batch, self.using)
                await in_store(forget_claim)(batch, self.node)
                kept += rows
                log.info("custody_batch_settled", extra={"batch": batch, "rows": rows})
            else:  # the claim names another keeper, or that keeper settled it and forgot it
                rows = await self._store.run(drop_batch, batch, self.using)
                dropped += rows
                log.info("custody_batch_dropped", extra={"batch": batch, "rows": rows})
        await in_store(forget_stale_claims)(self.node, FORGET_CLAIM_S)
        self.settled += kept
        self.dropped += dropped
        return kept, dropped


__all__ = ["CustodyKeeper", "CustodyWriter", "K_BATCH", "K_EVENTS", "K_KEPT"]
