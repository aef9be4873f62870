"""The inbox loop: one per claimed seat, turning drained partitions into turns.

``subscribe_batch`` does the draining (linger, cap, partitions, settling); the
handler here decides, per partition, in this order (design: Inbox Batching,
"Busy agents queue; held agents wait on the broker"):

1. the right to work — a seat this node no longer owns, or that is no longer
   an agent seat, is handed back (DEFER) rather than worked;
2. duplicates dropped before anything else (``coalescer.dedupe``: an
   at-least-once edge and the requeue machinery both produce them);
3. the local holds — a paused seat, no model provider, a spent token budget
   (:mod:`seats.budget`), a coding run working for it (:mod:`seats.sandbox`) —
   take the hold FIRST, then hand the delivery back: the mail waits on the
   broker in order, nothing fetched till the hold lifts; a run parked on a
   question is then offered each delivery first (:mod:`seats.sandbox.answers`);
4. one trip to the coordination store: the completion ledger and the seat's
   pause row (authoritative; the hold is only this node's gate). A trigger
   already worked is acked without a turn and ``turn_trigger_skipped`` says
   so, with the turn that worked it (or that answered it in its thread:
   :mod:`seats.skips`);
5. the per-node concurrency gate: past ``node.max_concurrent`` a turn waits
   here, in this process, holding its delivery — never handed back;
6. the turn, under the first event's restored trace, so its span is a child
   of the delivery's. ``coalescer.plan`` decides what ONE trigger the
   partition is and what must happen before it runs, and the loop carries
   that out; the turn runs in its :class:`~seats.turn_task.TurnTask`. Its
   triggers go to the ledger when it completes (or a person stopped it), with
   the waiting messages its thread block showed it when it completed, and
   a failed turn NAKs its partition, which returns behind newer mail of the
   same conversation — unless it wrote before it broke (or its model
   declined): then it is abandoned (:mod:`seats.abandon`), acked with a
   ``turn_trigger_skipped`` naming why.

One poison event never takes its batch-mates down with it. Every wake is
first made storable (``seats.ledger.storable_event``: a NUL or a lone
surrogate becomes its ``\\uXXXX`` escape), so such a value runs its turn
instead of failing every store call. What still breaks a multi-event
partition because of one event — a store that refuses one of its values, a
merge that fails, a turn that crashes (a model that answered with a failure
is not put down to an event) — degrades it (``coalescer.degrade``): the tail
is requeued as independent inbox messages FIRST, then the first event is
worked alone in the current ack scope. The partition's event ids are
remembered as isolated, so the batch layer keys each of them (copies and
originals alike) as a partition of its own from then on: the good ones run
their own turns (or are skipped by the ledger, once their copy ran) and only
the poison one keeps failing, alone, toward the dead-letter stream.

Two store failures, two answers. A database this node cannot reach
(``OperationalError``/``InterfaceError``, or any fault not caused by a value)
is the node's problem: the delivery is deferred and the loop retries after
``store_retry_s`` — parked instead once within five deliveries of the
dead-letter, as on a stopping node (:mod:`seats.park`). A value the store refuses
(``DataError``, a constraint, an encoding ``ValueError``) follows the event:
deferring it would park it at the head of the inbox forever and block the
seat, so it is NAK'd (alone, after the degrade above) and spends its budget
like any other failure.

A failure is logged once per delivery, one line with its event name, an
``error_kind`` or ``fault`` and a truncated ``error``; its traceback only on a
first delivery (DEBUG after), so a message failing 25 times logs one, not 25.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Awaitable, Callable, Optional, Sequence

from crewlet.company.conf import STOP_GRACE_S
from crewlet.events import Event
from crewlet.events.types import ERROR_KIND_BUDGET_EXHAUSTED
from crewlet.base.logfmt import REASON_CHARS, short_reason
from crewlet.company.org import CompanyHolder, Organization, Seat
from crewlet.queue import topics
from crewlet.queue.contract import (
    MAX_DELIVERIES,
    BatchOptions,
    EventQueue,
    Outcome,
    Partition,
    Subscription,
    unique_partition_key,
)
from crewlet.queue.errors import QueueError
from crewlet.events.tracing import OPERATION_PROCESS, child_span, messaging_attributes, messaging_span_name, trace_of
from django.db import DatabaseError
from seats import coalescer
from seats.coalescer import Degrade, Merge, partition_key_of
from seats.gate import ConcurrencyGate, GateClosed
from seats.hooks import run_after_turn
from seats.inbox_state import HOLD_BUDGET, HOLD_NO_PROVIDER, HOLD_PAUSED, HOLD_SANDBOX, LoopStats, SandboxGate
from seats.abandon import abandon, abandoned_reason
from seats.budget import BudgetKeeper
from seats.ledger import FAULT_VALUE, arecord, ascreen, event_identity, storable_event, store_fault, turn_pairs
from seats.ownership import Ownership
from seats.park import park, parks
from seats.skips import skip_worked
from seats.turn_task import TurnTask, log_failure
from seats.turn_types import ERR_CRASHED, OUTCOME_FAILED, OUTCOME_STOPPED, Trigger
from seats.turns import TurnRunner
from seats.wake import Wake

log = logging.getLogger("crewlet.seats.inbox")

#: Why a delivery waiting at the gate of a stopping node is handed back.
NODE_STOPPING = "node_stopping"
#: How long after a coordination-store failure a deferred inbox tries again.
STORE_RETRY_S = 1.0
#: How many isolated event ids a loop remembers (see ``InboxLoop`` on poison).
ISOLATED_KEEP = 4096


class InboxLoop:
    """One claimed seat's attachment to its inbox, and the handler it runs.

    ``merge`` is the digest seam (``coalescer.Merge``); without one, a
    partition's events run as one trigger, each as its own line.
    """

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        handle: str,
        *,
        gate: ConcurrencyGate,
        runner: TurnRunner,
        ownership: Ownership,
        options: BatchOptions,
        store_retry_s: float = STORE_RETRY_S,
        merge: Optional[Merge] = None,
        stop_grace_s: float = STOP_GRACE_S,
        budget: Optional[BudgetKeeper] = None,
        sandbox: Optional[SandboxGate] = None,
    ) -> None:
        self.queue = queue
        self.budget = budget
        self.sandbox = sandbox
        #: One turn of the seat at a time: its inbox's and those its coding runs wake (:meth:`run_wake`).
        self._turn_lock = asyncio.Lock()
        self.merge = merge
        self.holder = holder
        self.handle = handle
        self.gate = gate
        self.runner = runner
        self.ownership = ownership
        self.options = options
        self._key_of: Callable[[Event], str] = options.partition_key or partition_key_of
        self._isolated: OrderedDict[str, None] = OrderedDict()
        options.partition_key = self._partition_key
        self.store_retry_s = store_retry_s
        self.turn = TurnTask(runner, handle, stop_grace_s=stop_grace_s, log=log)
        self.topic = topics.agent_inbox(handle)
        self.group = topics.agent_inbox_group(handle)
        self.stats = LoopStats()
        self._sub: Optional[Subscription] = None
        self._paused = False
        self._pause_version = -1
        self._retry: Optional[asyncio.Task[None]] = None
        self._handling = 0

    # -- lifecycle ----------------------------------------------------------

    @property
    def attached(self) -> bool:
        return self._sub is not None

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def handling(self) -> bool:
        """A delivery of this seat is being handled: a turn may be running, or about to start."""
        return self._handling > 0

    @property
    def turn_running(self) -> bool:
        return self.turn.running

    @property
    def stopping(self) -> bool:
        """A stop of the running turn was asked for and the turn has not ended yet."""
        return self.turn.stopping

    def stop_turn(
        self, *, by: str = "", by_seat: str = "", reason: str = "", at_next_round: bool = False, hand_back: bool = False
    ) -> bool:
        """End the running turn (:meth:`TurnTask.stop`: at its next round, or at once); False when none runs."""
        return self.turn.stop(by=by, by_seat=by_seat, reason=reason, at_next_round=at_next_round, hand_back=hand_back)

    async def turn_finished(self) -> None:
        """Return once no turn of this loop runs (at once when none does)."""
        await self.turn.finished()

    async def start(self) -> None:
        """Take whatever holds apply BEFORE attaching, so not even one delivery is spent on them."""
        if self._sub is not None:
            return
        if not self.holder.current().has_provider_for(self.handle):
            await self.queue.hold(self.topic, self.group, HOLD_NO_PROVIDER)
        if self._paused:
            await self.queue.hold(self.topic, self.group, HOLD_PAUSED)
        if self.budget is not None and await self.budget.screen(self.handle):
            await self.queue.hold(self.topic, self.group, HOLD_BUDGET)
        self._sub = await self.queue.subscribe_batch(self.topic, self.group, self.options, self._counted)
        log.info("seat_inbox_attached", extra={"seat": self.handle, "paused": self._paused})

    async def stop(self) -> None:
        """Detach: the mailbox and its mail stay for whoever runs the seat next."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.detach()
            except QueueError:
                log.warning("seat_inbox_detach_failed", extra={"seat": self.handle}, exc_info=True)
            log.info("seat_inbox_detached", extra={"seat": self.handle})

    # -- holds -------------------------------------------------------------------

    async def pause(
        self, *, stop_running: bool = False, by: str = "", by_seat: str = "", reason: str = "", version: int = -1
    ) -> None:
        """Hold the inbox (a pause taken mid-drain hands the drain back); optionally end the running turn at its next round."""
        self._paused = True
        self._pause_version = max(self._pause_version, version)
        await self.queue.hold(self.topic, self.group, HOLD_PAUSED)
        if stop_running:
            self.stop_turn(by=by, by_seat=by_seat, reason=reason, at_next_round=True)

    async def resume(self, *, version: int = -1) -> None:
        self._paused = False
        self._pause_version = max(self._pause_version, version)
        await self.queue.release(self.topic, self.group, HOLD_PAUSED)
        await self.reopen()

    @property
    def pause_version(self) -> int:
        return self._pause_version

    async def provider_changed(self, org: Organization) -> None:
        """Hold while the seat has no model provider (its own or the company's); lift it the moment one appears."""
        if org.has_provider_for(self.handle):
            await self.queue.release(self.topic, self.group, HOLD_NO_PROVIDER)
            await self.reopen()
        else:
            await self.queue.hold(self.topic, self.group, HOLD_NO_PROVIDER)

    async def reopen(self) -> None:
        """Fetch again after a hand-back (which quiesced the attachment), unless a reason still stands."""
        if self._sub is None or self._paused or not self.ownership.owns(self.handle):
            return
        if not self.holder.current().has_provider_for(self.handle) or self._budget_held():
            return
        if await self._sub.unquiesce():
            log.info("seat_inbox_reopened", extra={"seat": self.handle})

    def _budget_held(self) -> bool:
        return self.budget is not None and self.budget.holding(self.handle)

    async def budget_released(self) -> None:
        """The window that held the seat no longer refuses it (a reset, a raised ceiling): its mail runs again."""
        await self.queue.release(self.topic, self.group, HOLD_BUDGET)
        await self.reopen()

    def _retry_later(self) -> None:
        if self._retry is not None and not self._retry.done():
            return

        async def later() -> None:
            await asyncio.sleep(self.store_retry_s)
            await self.reopen()

        self._retry = asyncio.get_running_loop().create_task(later(), name=f"seat-inbox-retry:{self.handle}")

    async def _refusal(self) -> Optional[str]:
        """A local reason not to start a turn; takes the matching hold so nothing more is fetched."""
        if self._paused:
            await self.queue.hold(self.topic, self.group, HOLD_PAUSED)
            return HOLD_PAUSED
        if not self.holder.current().has_provider_for(self.handle):
            await self.queue.hold(self.topic, self.group, HOLD_NO_PROVIDER)
            return HOLD_NO_PROVIDER
        if self._budget_held():
            await self.queue.hold(self.topic, self.group, HOLD_BUDGET)
            return HOLD_BUDGET
        if self.sandbox is not None and self.sandbox.holding(self.handle):  # a delivery that raced the run's hold
            await self.queue.hold(self.topic, self.group, HOLD_SANDBOX)
            return HOLD_SANDBOX
        return None

    async def _hand_back(self, why: str, partition: Partition) -> Outcome:
        """Defer a delivery this node or its store failed; park it instead when few deliveries are left (:mod:`seats.park`)."""
        if parks(partition) and await park(self.queue, self.handle, partition, why):
            self.stats.parked += 1
            return Outcome.ACK
        return self._defer(why, partition)

    def _defer(self, why: str, partition: Partition) -> Outcome:
        self.stats.deferred += 1
        log.info("seat_delivery_deferred", extra={"seat": self.handle, "why": why, "events": len(partition.deliveries)})
        return Outcome.DEFER

    # -- the handler ---------------------------------------------------------------

    def _partition_key(self, event: Event) -> str:
        """The batch layer's key: an isolated event is a partition of its own, whatever it names."""
        if event.id in self._isolated:
            return unique_partition_key(event)
        return self._key_of(event)

    def _isolate(self, ids: Sequence[str]) -> None:
        """Remember ``ids`` as events a partition failed on, so their redeliveries are never batched again."""
        for event_id in ids:
            self._isolated[event_id] = None
            self._isolated.move_to_end(event_id)
        while len(self._isolated) > ISOLATED_KEEP:
            self._isolated.popitem(last=False)

    def _failure(
        self, event: str, exc: BaseException, first_delivery: bool, *, level: int = logging.WARNING, **fields: object
    ) -> None:
        """One line per failed delivery, under this loop's seat (``log_failure``)."""
        log_failure(log, self.handle, event, exc, first_delivery, level=level, **fields)

    async def _counted(self, partition: Partition) -> Outcome:
        """The handler, counted while it runs (:attr:`handling`)."""
        self._handling += 1
        try:
            return await self._handle(partition)
        finally:
            self._handling -= 1

    async def _handle(self, partition: Partition) -> Outcome:
        for d in partition.deliveries:
            self.stats.deliveries.append((d.event.id, d.remaining))
        if not self.ownership.owns(self.handle):
            return self._defer("not_owned", partition)
        seat = self.holder.current().seat_by_handle(self.handle)
        if seat is None or not seat.is_agent:
            # The apply that removed (or flipped) the seat stops this loop; until then its mail waits.
            return self._defer("not_an_agent_seat", partition)
        first_delivery = partition.headroom >= MAX_DELIVERIES - 1
        try:
            evs = [storable_event(ev) for ev in partition.events]
        except Exception as exc:  # an event this build cannot even copy: it is its own failure
            self._failure("seat_delivery_failed", exc, first_delivery, events=len(partition.deliveries))
            return self._nak_isolated(partition, [])
        for raw, ev in zip(partition.events, evs):
            if ev is not raw:
                log.info("seat_event_escaped", extra={"seat": self.handle, "event_id": ev.id})
        try:
            return await self._work(seat, partition, evs, first_delivery)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # nothing of a delivery's may escape to the consume loop as a traceback per try
            self._failure("seat_delivery_failed", exc, first_delivery, events=len(evs))
            return self._nak_isolated(partition, evs)

    def _nak_isolated(self, partition: Partition, evs: Sequence[Event]) -> Outcome:
        """NAK a partition that failed as a whole; a multi-event one comes back one event per partition."""
        self.stats.failed += 1
        if len(partition.deliveries) > 1:
            self._isolate([*(d.event.id for d in partition.deliveries), *(ev.id for ev in evs)])
        return Outcome.NAK

    async def _work(self, seat: Seat, partition: Partition, evs: list[Event], first_delivery: bool) -> Outcome:
        """Steps 2-6 of the module docstring for ``evs`` (all of the partition, or its first event when degraded)."""
        deduped = coalescer.dedupe(evs)
        for ev, ident in deduped.dropped:
            self.stats.duplicates += 1
            log.debug("seat_duplicate_dropped", extra={"seat": self.handle, "event_id": ev.id, "trigger": ident})
        fresh_events, identities = deduped.events, deduped.identities

        refusal = await self._refusal()
        if refusal is not None:
            return self._defer(refusal, partition)
        if self.sandbox is not None:
            consumed, why = await self.sandbox.offer(seat, partition)
            if why:
                self._retry_later()
                return self._defer(why, partition)
            if consumed:
                fresh_events = [ev for ev in fresh_events if ev.id not in consumed]
                if not fresh_events:
                    return Outcome.ACK

        try:
            done, pause_row = await ascreen(self.handle, identities.values())
        except (DatabaseError, ValueError) as exc:
            fault = store_fault(exc)
            level = logging.WARNING if fault == FAULT_VALUE else logging.ERROR  # a store that is away is the node's alarm
            self._failure("seat_store_failed", exc, first_delivery, level=level, fault=fault, events=len(fresh_events))
            if fault != FAULT_VALUE:
                self._retry_later()
                return await self._hand_back("store_unavailable", partition)
            if len(fresh_events) > 1:
                return await self._degrade(seat, partition, fresh_events, first_delivery, why=fault)
            return self._nak_isolated(partition, evs)
        if pause_row is not None and pause_row.version >= self._pause_version:  # older than a resume seen here: stale
            await self.pause(version=pause_row.version)
            return self._defer(HOLD_PAUSED, partition)

        fresh: list[Event] = []
        for ev in fresh_events:
            ident = identities[ev.id]
            if ident in done:
                self.stats.skipped += 1
                await skip_worked(self._emit, seat, ev, ident, done)
            else:
                fresh.append(ev)
        if not fresh:
            return Outcome.ACK

        try:
            async with self.gate.slot():
                refusal = await self._refusal()
                if refusal is not None:
                    return self._defer(refusal, partition)
                if not self.ownership.owns(self.handle):
                    return self._defer("not_owned", partition)
                seat = self.holder.current().seat_by_handle(self.handle) or seat
                return await self._run_turn(
                    seat, partition, fresh, {ev.id: identities[ev.id] for ev in fresh}, first_delivery
                )
        except GateClosed:
            return await self._hand_back(NODE_STOPPING, partition)  # at the head, for whoever runs the seat next

    async def _requeue_tail(self, partition: Partition, degraded: Degrade) -> bool:
        """The degraded path's first step, carried out: ``degraded.tail`` back on the inbox, each as its own message.

        The partition's events are isolated first, so neither these copies nor
        the originals (should this delivery fail after all) are batched with
        each other again; a copy meeting its original collapses in the same-id
        dedupe. False when a publish failed: then nothing has run, and the
        caller hands the whole partition back.
        """
        ordered = degraded.events
        self._isolate([*(d.event.id for d in partition.deliveries), *(ev.id for ev in ordered)])
        log.warning(
            "seat_partition_degraded",
            extra={"seat": self.handle, "events": len(ordered), "why": degraded.why, "first": degraded.first.id},
        )
        try:
            await coalescer.requeue_tail(self.queue, self.handle, degraded)
        except Exception as exc:
            log.warning("seat_requeue_failed", extra={"seat": self.handle, "error": short_reason(exc)})
            return False
        return True

    async def _degrade(
        self, seat: Seat, partition: Partition, fresh: list[Event], first_delivery: bool, *, why: str
    ) -> Outcome:
        """Per-event dispatch for a partition one of whose values the store refused (``coalescer.degrade``).

        A requeue failure NAKs before any turn ran; the first event is then
        worked alone in this delivery's ack scope, from the top.
        """
        degraded = coalescer.degrade(fresh, why)
        if not await self._requeue_tail(partition, degraded):
            self.stats.failed += 1
            return Outcome.NAK
        return await self._work(seat, partition, [degraded.first], first_delivery)

    async def _run_turn(
        self, seat: Seat, partition: Partition, fresh: list[Event], identities: dict[str, str], first_delivery: bool
    ) -> Outcome:
        """Run the partition's turn and settle it: ledger on success (or a person's stop), NAK on failure.

        A multi-event turn that crashed (rather than failed at the model) is
        put down to one of its events and degrades to per-event dispatch, so
        the events that can be worked are, and only the one that cannot keeps
        failing toward the dead-letter stream.
        """
        key = partition.key
        self.stats.turns += 1
        attributes = {"crewlet.seat": seat.handle, "crewlet.partition": key}
        attributes.update(messaging_attributes(OPERATION_PROCESS, self.topic, group=self.group, message_id=fresh[0].id))
        with child_span(fresh[0], messaging_span_name(OPERATION_PROCESS, self.topic), attributes=attributes):
            chosen = coalescer.plan(
                fresh,
                self.merge,
                partition_key=key,
                seat=seat.handle,
                role=seat.role,
                agent_id=seat.agent_id,
                trace=trace_of(),
            )
            if chosen.degraded is not None and not await self._requeue_tail(partition, chosen.degraded):
                self.stats.failed += 1
                return Outcome.NAK  # nothing ran: all of it goes back
            if chosen.record is not None:
                await coalescer.publish_record(self.runner.emitter, chosen.record, seat=seat.handle)
            covered = chosen.covers
            trigger = self._trigger(chosen.trigger, key, first_delivery)
            trigger.before_write = self._recorder(seat, trigger.turn_id, covered, identities)
            async with self._turn_lock:
                result = await self.turn.run(seat, trigger)

        turn_id = trigger.turn_id
        handed_back = self.turn.take_hand_back()
        if result.outcome == OUTCOME_STOPPED and (handed_back or result.fenced):
            log.info("seat_turn_handed_back", extra={"seat": seat.handle, "turn_id": turn_id, "events": len(fresh)})
            return Outcome.DEFER
        if result.outcome == OUTCOME_FAILED and result.error_kind == ERROR_KIND_BUDGET_EXHAUSTED and self._budget_held():
            await self.queue.hold(self.topic, self.group, HOLD_BUDGET)  # nothing more is fetched until the window allows
            if not result.wrote:
                return self._defer(HOLD_BUDGET, partition)  # its trigger waits at the head, worked once the hold lifts
        abandoned = abandoned_reason(result)
        if not (result.ok or result.outcome == OUTCOME_STOPPED):
            self.stats.failed += 1
            log.warning(
                "seat_turn_failed",
                extra={
                    "seat": seat.handle,
                    "turn_id": turn_id,
                    "error_kind": result.error_kind,
                    "error": result.error[:REASON_CHARS],
                    "events": len(fresh),
                },
            )
            if abandoned:  # it changed the world before it broke (its ledger row is written): never worked again
                await abandon(self._emit, seat, covered, result, abandoned)
                return Outcome.ACK
            crashed = result.error_kind == ERR_CRASHED
            if crashed and len(covered) > 1:  # one of the events it covers is why: each is worked alone
                degraded = coalescer.degrade(covered, ERR_CRASHED)
                if not await self._requeue_tail(partition, degraded):
                    return Outcome.NAK
                first = degraded.first
                return await self._run_turn(seat, partition, [first], {first.id: identities[first.id]}, first_delivery)
            if crashed and len(partition.deliveries) > 1:
                self._isolate([d.event.id for d in partition.deliveries])
            return Outcome.NAK
        if result.ok:
            await run_after_turn(self.queue, seat, covered, result, hooks=self.runner.hooks)
        try:
            await arecord(seat.handle, turn_id, turn_pairs(identities, covered, result.answered_in_thread if result.ok else ()))
        except (DatabaseError, ValueError) as exc:
            # The turn happened; redoing it would be the duplicate the ledger exists to prevent.
            self._failure("seat_ledger_record_failed", exc, first_delivery, turn_id=turn_id, fault=store_fault(exc))
        if abandoned:
            await abandon(self._emit, seat, covered, result, abandoned)
        return Outcome.ACK

    async def run_wake(self, event: Event, partition_key: str) -> Optional[bool]:
        """One turn for ``event`` outside the inbox (a coding run's question or ending), after the seat's running turn:
        True when it completed (or a turn of it wrote before), None when the seat is paused or the node is stopping."""
        if self._paused:
            return None
        seat = self.holder.current().seat_by_handle(self.handle)
        if seat is None or not seat.is_agent:
            return False
        identity = {event.id: event_identity(event)}  # its own, not the launch's message id it copies
        if (await ascreen(self.handle, identity.values()))[0]:
            return True  # a turn of it wrote (in the ledger) before its node stopped: never run twice
        trigger = self._trigger([storable_event(event)], partition_key)
        trigger.before_write = self._recorder(seat, trigger.turn_id, trigger.events, identity)
        try:
            async with self.gate.slot():
                async with self._turn_lock:
                    result = await self.turn.run(seat, trigger)
        except GateClosed:
            return None
        if result.ok:
            await run_after_turn(self.queue, seat, trigger.events, result, hooks=self.runner.hooks)
        return result.ok or result.outcome == OUTCOME_STOPPED

    @staticmethod
    def _recorder(
        seat: Seat, turn_id: str, covered: Sequence[Event], identities: dict[str, str]
    ) -> Callable[[], Awaitable[None]]:
        """The ledger write a turn makes before its first call that can change the world: from then on it is not rerun.

        The write after the turn (``ignore_conflicts``) then keeps this row.
        """
        pairs = [(identities[ev.id], ev.id) for ev in covered if ev.id in identities]

        async def record() -> None:
            await arecord(seat.handle, turn_id, pairs)

        return record

    @staticmethod
    def _trigger(evs: list[Event], key: str, first_delivery: bool = True) -> Trigger:
        return Trigger(
            events=evs,
            partition_key=key,
            conversation_key=Wake(evs[0]).conversation_identity,
            first_delivery=first_delivery,
        )

    async def _emit(self, body: object) -> None:
        await self.runner.emitter.emit(body, trace_of(), log_event="seat_event_publish_failed", seat=self.handle)


__all__ = ["HOLD_BUDGET", "HOLD_NO_PROVIDER", "HOLD_PAUSED", "HOLD_SANDBOX", "InboxLoop", "LoopStats", "SandboxGate"]
