"""The seat runtime: mailboxes, claims, inbox loops, the scheduler and the maintenance duty of one node.

``start()`` does it in the order the design requires: record every seat and create every agent seat's mailbox
FIRST (so a wake aimed at a seat nobody runs yet waits instead of vanishing), then claim seats through the
ownership component, then attach one inbox loop per claimed seat (holds taken before attaching), then start the
scheduler, the retirement sweep, the pause reconcile and the budget meters' tick (:mod:`seats.budget`).
``apply(org)`` is an applied company change: swap the holder, walk the mailboxes again (a new seat's mailbox
before its loop), hot-reload the coalesce knobs and the concurrency gate, stop loops of seats that are gone,
start loops for new ones, and lift or take the no-provider holds and lift the budget holds a raised ceiling ends.

On an engine it is the :data:`~crewlet.engine.interfaces.SEAT_RUNTIME` service
(:func:`seats.runtime_service.services`), which ``/healthz``, the pause API and the live projection
ask the engine for.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from datetime import datetime, timedelta, timezone as dt_timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from crewlet.base.aio import bounded_each
from crewlet.engine.services import Periodic
from crewlet.events import Event
from crewlet.queue.emit import Emitter
from crewlet.events.types import AgentSpawned, AgentTerminated, SeatsUnplaceable
from crewlet.base.db import in_store
from crewlet.company.capacity import check_fits
from crewlet.company.conf import STOP_GRACE_S, TURN_STALL_S
from crewlet.fleet.leases import prune_all as prune_leases
from crewlet.fleet.placement import Unplaceable
from crewlet.engine.interfaces import PauseRow, ServiceKey
from crewlet.company.org import CompanyHolder, Organization
from crewlet.queue import topics
from crewlet.queue.contract import Closable, EventQueue
from crewlet.queue.errors import QueueError
from crewlet.events.tracing import trace_of
from seats import actions
from seats.budget import METERS_EVERY_S, BudgetKeeper
from seats.coalescer import Merge, batch_options
from seats.gate import ConcurrencyGate
from seats.inbox import STORE_RETRY_S, InboxLoop
from seats.ledger import LEDGER_KEEP_S, aprune
from seats.mailboxes import ABSENT_AFTER_S, SweepReport, ensure_mailboxes, retire_absent
from seats.memory.holding import MemoryKeeper
from seats.memory.reflection import Reflector
from seats.ownership import Ownership, Plan, SeatOwnership
from seats.provider_keys import warn_unset_provider_keys
from seats.scheduler import TICK_S, Scheduler, aprune_firings
from seats.tools.base import SEAT_TOOLS, SeatSessions, Toolbox
from seats.retry import Retrier
from seats.sandbox.coordinator import SandboxCoordinator
from seats.sandbox.runs import holding_runs, prune as prune_runs
from seats.sandbox.tool import SANDBOX_SERVICE
from seats.turns import TurnRunner

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from seats.delivery_models import SeatPause

log = logging.getLogger("crewlet.seats.runtime")

#: Production defaults of the runtime's own duties.
SWEEP_EVERY_S = 3600.0
PAUSE_POLL_S = 2.0
#: Seats attached (or detached) at once: each is a few round trips to the broker and the store, so one at a
#: time a company's start and stop grow by those per seat; this many hides them without flooding either.
SEAT_CONCURRENCY = 16
#: How often a node without a fleet membership looks at its seats again (a fleet's runs at its lease renewal).
PLACEMENT_EVERY_S = 5.0
#: The seats' toolbox as the runtime asks the engine for it: the service ``seats.tools.mcp`` registers as :data:`SEAT_TOOLS`.
TOOLBOX: ServiceKey[Toolbox] = ServiceKey(SEAT_TOOLS, Toolbox)

#: Once-per-fleet duties of the seat runtime (duty-lease names).
DUTY_SCHEDULER = "scheduler"
DUTY_RETIREMENT = "seat_retirement"
DUTY_PLACEMENT_REPORT = "seat_placement_report"

#: Why a seat's loop was detached (the ``reason`` of ``agent_terminated``).
DETACH_LEASE_LOST = "lease lost"
DETACH_REBALANCED = "rebalanced"
DETACH_STOPPING = "node stopping"
DETACH_REMOVED = "seat removed"

#: Asked before a once-per-fleet duty runs: whether this node runs it now.
HoldDuty = Callable[[str], Awaitable[bool]]


async def _always(_name: str) -> bool:
    """Alone, a node runs every duty."""
    return True


async def _apply_pause(
    loop: InboxLoop, paused: bool, version: int, *, stop_running: bool, by: str, by_seat: str, reason: str,
    sandbox: SandboxCoordinator,
) -> None:
    """Bring one loop's hold to a pause state, whether it came as a won change or as the store's row.

    A resume also lets the seat's coding runs tell it what waited for the pause (their control subject).
    """
    if paused:
        await loop.pause(stop_running=stop_running, by=by, by_seat=by_seat, reason=reason, version=version)
    else:
        await loop.resume(version=version)
        await sandbox.reopen_control(loop.handle)


class SeatRuntime:
    """Everything this node does for the company's seats.

    Every duration is injectable so tests run the real paths in seconds;
    ``clock`` (epoch seconds) drives the scheduler's slots and the
    retirement clock, so 24 hours can pass in a test without waiting for them;
    ``scheduler_clock``, when given, drives the scheduler alone (the
    ``CREWLET_SCHEDULER_CLOCK_START`` rehearsal clock).
    """

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        node_id: str = "",
        runner: Optional[TurnRunner] = None,
        ownership: Optional[Ownership] = None,
        absent_after_s: float = ABSENT_AFTER_S,
        sweep_every_s: float = SWEEP_EVERY_S,
        pause_poll_s: float = PAUSE_POLL_S,
        scheduler_tick_s: float = TICK_S,
        store_retry_s: float = STORE_RETRY_S,
        stop_grace_s: float = STOP_GRACE_S,
        ledger_keep_s: float = LEDGER_KEEP_S,
        clock: Callable[[], float] = time.time,
        run_scheduler: bool = True,
        merge: Optional[Merge] = None,
        node_max_concurrent: Optional[int] = None,
        emitter: Optional[Emitter] = None,
        toolbox: Optional[Toolbox] = None,
        hold_duty: Optional[HoldDuty] = None,
        placement_every_s: float = PLACEMENT_EVERY_S,
        scheduler_clock: Optional[Callable[[], float]] = None,
        provider_retry_scale: float = 1.0,
        turn_stall_s: float = TURN_STALL_S,
        budget_meters_every_s: float = METERS_EVERY_S,
        max_consumers: Optional[int] = None,
        sandbox_dir: Optional[Path] = None,
        bwrap: str = "bwrap",
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.node_id = node_id or queue.node
        #: The telemetry emitter is closed at stop only when this runtime made it (an engine's is the engine's).
        self._owns_emitter = runner is None and emitter is None
        self.runner = runner or TurnRunner(
            queue, holder, emitter=emitter, toolbox=toolbox, retrier=Retrier(scale=provider_retry_scale), stall_s=turn_stall_s
        )
        self.ownership: Ownership = ownership or SeatOwnership(self.node_id)
        self.runner.owns = self.ownership.owns  # the turn's fence: no call once the seat is another node's
        self.budget = self.runner.budget = BudgetKeeper(holder, clock=self.now, emit=self._emit)
        self.budget_meters_every_s = budget_meters_every_s
        #: ``stream.max_consumers``: a revision whose seats' mailboxes would not fit is refused before it is served.
        self.max_consumers = max_consumers
        self.hold_duty: HoldDuty = hold_duty or _always
        self.placement_every_s = placement_every_s
        self._placement = Periodic("seat_placement", placement_every_s, self.rebalance, logger=log, first_after_s=placement_every_s)
        self._unplaceable: tuple[Unplaceable, ...] = ()
        self.absent_after_s = absent_after_s
        self.sweep_every_s = sweep_every_s
        self.pause_poll_s = pause_poll_s
        self.store_retry_s = store_retry_s
        self.stop_grace_s = stop_grace_s
        self.ledger_keep_s = ledger_keep_s
        self.clock = clock
        self.run_scheduler = run_scheduler
        self.merge = merge
        self.node_max_concurrent = node_max_concurrent
        self.gate = ConcurrencyGate(self.turn_limit(holder.current()))
        self.scheduler = Scheduler(
            queue, holder, node_id=self.node_id, clock=scheduler_clock or clock, tick_s=scheduler_tick_s, emitter=self.runner.emitter
        )
        self.loops: dict[str, InboxLoop] = {}
        #: The memory of the seats this node holds, replayed before each seat's inbox is attached.
        self.memory = MemoryKeeper(queue, Reflector(queue, holder, self.runner))
        #: The coding runs of the seats this node holds (their jobs' working trees under ``sandbox_dir``).
        self.sandbox = SandboxCoordinator(
            queue, holder, node_id=self.node_id, emitter=self.runner.emitter,
            root=sandbox_dir,
            run_wake=self._run_wake, reopen=self._reopen, bwrap=bwrap, store_retry_s=store_retry_s,
        )
        self.runner.services[SANDBOX_SERVICE] = self.sandbox
        self._lock: Optional[asyncio.Lock] = None
        self._duties: list[Periodic] = []
        self._nudges: list[Closable] = []
        self._started = False
        self._stopped = False

    # -- time ---------------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), dt_timezone.utc)

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Mailboxes, then claims, then loops, then the duties. Idempotent."""
        if self._started:
            return
        async with self._guard():
            org = self.holder.current()
            await ensure_mailboxes(self.queue, org, now=self.now())
            await self.memory.start()
            await self._rebalance(org)
            self._started = True
        await self._subscribe_nudges()
        if self.run_scheduler:
            await self.scheduler.note_schedules()  # a cron schedule is owed no slot from before this instant
            self._duties.append(self._scheduler_under_duty())
        self._duties.append(Periodic("seat_sweep", self.sweep_every_s, self.sweep, logger=log))
        self._duties.append(self._placement)
        self._duties.append(Periodic("seat_pauses", self.pause_poll_s, self.reconcile_pauses, logger=log))
        self._duties.append(Periodic("budget_meters", self.budget_meters_every_s, self.budget_tick, logger=log))
        for duty in self._duties:
            await duty.start()
        warn_unset_provider_keys(org, os.environ)
        log.info(
            "seat_runtime_started",
            extra={"node": self.node_id, "org": org.org, "seats": len(self.loops), "max_concurrent": self.gate.limit},
        )

    async def stop(self) -> None:
        """Stop the duties and detach every loop; mailboxes and their mail stay. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for duty in self._duties:
            await duty.stop()
        self._duties.clear()
        for nudge in self._nudges:
            try:
                await nudge.close()
            except Exception:
                log.debug("seat_nudge_close_failed", exc_info=True)
        self._nudges.clear()
        async with self._guard():
            # The drain is over: a delivery still being handled is cut by the queue's close, which hands its
            # mail back; its seat's lease stays until then (the fleet membership gives it back after the close).
            # The idle seats' leases go back in one statement after their loops stopped, and every seat's memory
            # copy in one transaction, not a commit per seat.
            handles, idle = list(self.loops), list[str]()

            async def detach(handle: str) -> None:
                if await self._detach(handle, DETACH_STOPPING, wait_turn=False, keep_lease_if_busy=True, batched=True):
                    idle.append(handle)

            try:
                await bounded_each(handles, detach, SEAT_CONCURRENCY)
            finally:
                await self.memory.release_many(handles)
                await self.ownership.release_many(idle)
        await self.sandbox.stop()
        await self.memory.stop()
        if self._owns_emitter:
            await self.runner.emitter.close()
        log.info("seat_runtime_stopped", extra={"node": self.node_id})

    def healthy(self) -> bool:
        """Started, not stopped, every duty alive and every claimed seat's loop attached."""
        if not self._started or self._stopped:
            return False
        if not all(duty.alive for duty in self._duties):
            return False
        return all(loop.attached for loop in self.loops.values())

    def held_locally(self) -> dict[str, bool]:
        """The seats this node runs, each with whether a turn of it runs right now."""
        return {handle: loop.turn_running for handle, loop in list(self.loops.items())}

    def pause_rows(self, handles: list[str]) -> dict[str, PauseRow]:
        """The stored pauses of ``handles`` (blocking: the projection's seed calls it in its worker thread)."""
        return {
            handle: PauseRow(paused=row.paused, reason=row.reason, paused_by=row.paused_by or row.paused_by_seat)
            for handle, row in actions.pause_states(handles).items()
        }

    def run_holds(self, handles: list[str]) -> dict[str, tuple[str, ...]]:
        """The coding runs holding each of ``handles`` that one holds (blocking: the projection's seed calls it in its worker thread)."""
        return holding_runs(handles)

    def turn_limit(self, org: Organization) -> int:
        """Turns this node runs at once: the company's ``node.max_concurrent``, capped by this node's own setting.

        The company says how much it wants run per node; the engine setting
        (``node.max_concurrent``, ``CREWLET_NODE_MAX_CONCURRENT``) is what this
        machine can take. The smaller wins, so neither can overload the other.
        """
        if self.node_max_concurrent is None:
            return org.max_concurrent
        return max(1, min(org.max_concurrent, self.node_max_concurrent))

    # -- an applied company change ------------------------------------------------------

    async def apply(self, org: Organization) -> None:
        """Serve ``org`` from now on: mailboxes first, then knobs, loops and holds."""
        if self.max_consumers is not None:
            check_fits(org, self.max_consumers)
        async with self._guard():
            previous = self.holder.swap(org)
            await ensure_mailboxes(self.queue, org, now=self.now())
            await self.gate.resize(self.turn_limit(org))
            for loop in self.loops.values():  # the batch layer reads these on its next cycle
                loop.options.linger_s = org.coalesce_window_s
                loop.options.max_batch = org.coalesce_max_batch
            agents = {s.handle for s in org.agent_seats()}
            for handle in [h for h in self.loops if h not in agents]:
                await self._detach(handle, DETACH_REMOVED)
            await self._rebalance(org)
            for loop in self.loops.values():
                await loop.provider_changed(org)
            await self.memory.applied()
        await self.budget_tick()  # a raised ceiling runs the held mail now, and the meters say so
        log.info(
            "seat_runtime_applied",
            extra={
                "org": org.org,
                "seats": len(self.loops),
                "max_concurrent": self.gate.limit,
                "providers": len(org.providers),
                "had_providers": len(previous.providers),
            },
        )

    async def rebalance(self) -> None:
        """The placement sweep: detach lost seats, give a few away, take this node's share, report the rest."""
        async with self._guard():
            await self._rebalance(self.holder.current())

    async def seats_lost(self, handles: frozenset[str]) -> None:
        """Some seats' leases are gone (or at this node's own deadline): end their turns now, then detach them.

        Another node may start a lost seat as soon as its row runs out, so a
        running turn is cancelled here and awaited before this returns (the
        fleet membership calls this ahead of its deadline); the placement
        sweep woken after it detaches the loops.
        """
        ending = []
        for handle in handles:
            loop = self.loops.get(handle)
            if loop is not None and loop.stop_turn(reason=DETACH_LEASE_LOST, hand_back=True):
                ending.append(loop.turn_finished())
        if ending:
            await asyncio.gather(*ending)
        self._placement.wake()

    async def _rebalance(self, org: Organization) -> None:
        for handle in [h for h in self.loops if not self.ownership.owns(h)]:
            loop = self.loops.get(handle)
            if loop is not None:
                loop.stop_turn(reason=DETACH_LEASE_LOST, hand_back=True)  # another node may run the seat already
            await self._detach(handle, DETACH_LEASE_LOST, wait_turn=False)
        plan: Plan = await self.ownership.plan(org, frozenset(self.loops))
        for handle in plan.give:
            loop = self.loops.get(handle)
            if loop is not None and loop.handling:
                continue  # a seat is handed over between deliveries, never from under one (nor as its turn starts)
            await self._detach(handle, DETACH_REBALANCED)
        await self._attach_many([h for h in plan.take if h not in self.loops], org)
        await self._report_unplaceable(plan.unplaceable)

    async def _report_unplaceable(self, unplaceable: tuple[Unplaceable, ...]) -> None:
        """Say once per change which seats no live node may run (by the one node holding the report's duty)."""
        if unplaceable == self._unplaceable or not await self.hold_duty(DUTY_PLACEMENT_REPORT):
            return
        self._unplaceable = unplaceable
        if not unplaceable:
            return
        log.warning(
            "seats_unplaceable",
            extra={"seats": [u.seat for u in unplaceable], "reasons": sorted({u.reason for u in unplaceable})},
        )
        await self._emit(
            SeatsUnplaceable(
                seats=[{"seat": u.seat, "reason": u.reason, "placement": u.detail} for u in unplaceable],
                count=len(unplaceable),
            )
        )

    def _scheduler_under_duty(self) -> Periodic:
        """The scheduler's ticks, each run only while this node holds the scheduler's duty lease."""
        ticking = self.scheduler.periodic()
        fire = ticking.duty

        async def under_duty() -> Any:
            if await self.hold_duty(DUTY_SCHEDULER):
                return await fire()
            return None

        ticking.duty = under_duty
        return ticking

    async def _attach_many(self, handles: list[str], org: Organization) -> None:
        """Claim ``handles`` and read their pause rows, each in one go; then start their loops, a bounded few at once.

        Claims and pause rows are statements on the coordination store, which
        serialises them anyway: asked per seat, a company of thousands waits a
        commit per seat before its last seat runs.
        """
        if not handles:
            return
        claimed = await self.ownership.claim_many(handles)
        pauses = await actions.apause_states(claimed) if claimed else {}
        if len(claimed) > SEAT_CONCURRENCY:  # more than one round of attaches: one memory read for all, not one each
            await self.memory.acquire_many(claimed)
            await self.sandbox.acquire_many(claimed)
        await bounded_each(claimed, lambda h: self._attach(h, org, pauses.get(h)), SEAT_CONCURRENCY)

    async def _attach(self, handle: str, org: Organization, row: Optional["SeatPause"]) -> None:
        """Start the loop of ``handle``, claimed by this node, under its pause row's hold (None: never paused)."""
        if not await self.memory.acquired(handle):  # the seat's memory first, then its inbox
            await self.ownership.release(handle)
            return
        loop = InboxLoop(
            self.queue,
            self.holder,
            handle,
            gate=self.gate,
            runner=self.runner,
            ownership=self.ownership,
            options=batch_options(org),
            store_retry_s=self.store_retry_s,
            merge=self.merge,
            stop_grace_s=self.stop_grace_s,
            budget=self.budget,
            sandbox=self.sandbox,
        )
        await self.sandbox.acquire(handle)  # a coding run's hold, like a pause's, before the mailbox is attached
        if row is not None and row.paused:
            await loop.pause(version=row.version)  # the hold is taken before the mailbox is attached
        elif row is not None:
            await loop.resume(version=row.version)
        await loop.start()
        self.loops[handle] = loop
        await self.sandbox.attached(handle)
        seat = org.seat_by_handle(handle)
        await self._emit(
            AgentSpawned(seat=handle, role=seat.role if seat else "", agent_id=seat.agent_id if seat else "", reason="claimed")
        )

    async def _detach(
        self, handle: str, reason: str, *, wait_turn: bool = True, keep_lease_if_busy: bool = False, batched: bool = False
    ) -> bool:
        """Stop fetching, let a running turn finish under the lease (unless it is lost), then give the lease back.

        ``keep_lease_if_busy`` (a node stopping): a delivery still being handled keeps the lease; whoever cuts
        that handler gives it back. ``batched``: the lease and the memory copy are left to the caller, who lets
        go of many at once (the leases of those this returns True for: the ones not kept).
        """
        loop = self.loops.pop(handle, None)
        busy = False
        if loop is not None:
            await loop.stop()
            if wait_turn:
                await loop.turn_finished()
            busy = loop.handling
        await self.sandbox.release(handle)
        if isinstance(self.runner.toolbox, SeatSessions):
            await self.runner.toolbox.release(handle)  # the seat's tool servers go with it
        if not batched:
            await self.memory.release(handle)
        kept = busy and keep_lease_if_busy
        if kept:
            log.info("seat_lease_kept_until_cut", extra={"seat": handle, "node": self.node_id})
        elif not batched:
            await self.ownership.release(handle)
        seat = self.holder.current().seat_by_handle(handle)
        await self._emit(
            AgentTerminated(seat=handle, role=seat.role if seat else "", agent_id=seat.agent_id if seat else "", reason=reason)
        )
        return not kept

    # -- pauses ---------------------------------------------------------------------------

    async def on_pause_change(self, change: actions.PauseChange) -> None:
        """The runtime hook: apply a won pause/resume to this node's loop for the seat, if it runs one."""
        loop = self.loops.get(change.handle)
        if loop is None:
            return
        await _apply_pause(
            loop, change.paused, change.version,
            stop_running=change.stop_running, by=change.by, by_seat=change.by_seat, reason=change.reason,
            sandbox=self.sandbox,
        )

    async def reconcile_pauses(self, handles: Optional[list[str]] = None) -> None:
        """Bring this node's holds to the store's pause rows (the row is the state; events only nudge)."""
        if handles is None:
            # The poll reads the whole table, which holds a row only for a seat ever paused: what it costs
            # grows with those, not with the company's idle seats (a query naming thousands every poll).
            rows = await actions.apause_states(None)
            wanted = [h for h in rows if h in self.loops]
        else:
            wanted = [h for h in handles if h in self.loops]
            if not wanted:
                return
            rows = await actions.apause_states(wanted)
        for handle in wanted:
            loop, row = self.loops.get(handle), rows.get(handle)
            if loop is None or row is None or row.version <= loop.pause_version:
                continue
            await _apply_pause(
                loop, row.paused, row.version,
                stop_running=row.stop_running, by=row.paused_by, by_seat=row.paused_by_seat, reason=row.reason,
                sandbox=self.sandbox,
            )

    async def _subscribe_nudges(self) -> None:
        async def nudge(_topic: str, event: Event) -> None:
            seat = getattr(event.data, "seat", "")
            if seat:
                await self.reconcile_pauses([seat])

        for etype in ("seat_paused", "seat_resumed"):
            try:
                self._nudges.append(await self.queue.subscribe_stream(topics.event(etype), nudge))
            except QueueError:
                # The poll is the authoritative path; a missing nudge costs one poll interval.
                log.warning("seat_pause_nudge_unavailable", extra={"type": etype}, exc_info=True)

    # -- the maintenance duty ----------------------------------------------------------------

    async def sweep(self) -> SweepReport:
        """Retire mailboxes absent past ``absent_after_s`` and prune the ledger: once per fleet, under its duty lease."""
        if not await self.hold_duty(DUTY_RETIREMENT):
            return SweepReport()
        async with self._guard():
            report = await retire_absent(
                self.queue, self.holder.current(), absent_after_s=self.absent_after_s, now=self.now(),
                claim=self.ownership.claim, release=self.ownership.release, before_delete=self.sandbox.retire,
            )
            await self.memory.purge_retired(report.retired)
        pruned = await aprune(older_than_s=self.ledger_keep_s, now=self.now())
        pruned += await aprune_firings(self.now() - timedelta(seconds=self.ledger_keep_s))
        pruned += await in_store(prune_leases)(older_than_s=self.ledger_keep_s, now=self.now())
        pruned += await self.budget.prune()
        pruned += await in_store(prune_runs)(self.now() - timedelta(seconds=self.ledger_keep_s))
        if report.retired or report.found_unrecorded or pruned:
            log.info(
                "seat_sweep_done",
                extra={"retired": report.retired, "unrecorded": report.found_unrecorded, "rows_pruned": pruned},
            )
        return report

    # -- token budgets ------------------------------------------------------------------------------

    async def release_budget_holds(self) -> list[str]:
        """Lift the budget holds no window justifies any more (:meth:`BudgetKeeper.review`); the seats released."""
        released = await self.budget.review()
        for handle in released:
            loop = self.loops.get(handle)
            if loop is not None:
                await loop.budget_released()
        return released

    async def budget_tick(self) -> None:
        """Every node, every ``budget_meters_every_s``: held seats looked at again, then ``budget_meters``."""
        await self.release_budget_holds()
        await self.budget.publish()

    async def _run_wake(self, handle: str, event: Event, partition_key: str) -> Optional[bool]:
        """A coding run's turn for the seat (:meth:`InboxLoop.run_wake`); None when no loop of the seat runs here."""
        loop = self.loops.get(handle)
        return await loop.run_wake(event, partition_key) if loop is not None else None

    async def _reopen(self, handle: str) -> None:
        if (loop := self.loops.get(handle)) is not None:
            await loop.reopen()

    async def _emit(self, body: Any) -> None:
        await self.runner.emitter.emit(body, trace_of(), log_event="seat_runtime_publish_failed")


__all__ = [
    "DUTY_PLACEMENT_REPORT",
    "DUTY_RETIREMENT",
    "DUTY_SCHEDULER",
    "PAUSE_POLL_S",
    "PLACEMENT_EVERY_S",
    "SWEEP_EVERY_S",
    "SeatRuntime",
    "TOOLBOX",
]
