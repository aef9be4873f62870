"""The sandbox coordinator: this node's coding runs, the hold they keep on their seats' inboxes, and their control subjects.

One per seat runtime, owning every run of the seats this node holds:

* **Launch** (:meth:`launch`, the ``sandbox_run`` tool): the run's row is
  opened, the seat's inbox held, the seat's control subscription made and
  attached, and the start published on the control subject — all before the
  launching turn can return, so no delivery of the seat starts a turn beside
  the run. The turn may end; the run goes on.
* **The control subject** is consumed even while the inbox is held. A start
  starts the job (:mod:`seats.sandbox.jail`) for its attempt; a question
  wakes the seat in a turn that puts it to the person; an ending (decided
  once on the row, published under the id and instant recorded there)
  wakes the seat with the result in a turn of its own, and only then does
  the run stop holding the seat — so the mail that waited is worked after
  that turn, in order.
* **The hold** is the queue's ``sandbox`` key on the seat's inbox: taken
  while any run of the seat holds it (:attr:`Run.holds`), lifted the moment
  none does. Held, the consumer fetches nothing: the mail waits on the broker
  with its order and delivery counts.
* **Recovery** (:meth:`acquire`, before the seat's inbox is attached): the
  hold is taken for every run that holds, a run whose job is gone (its node
  stopped) is started again at its next attempt — failed once its attempts
  are spent — and an ending whose turn never ran is published again.
* **Answers** are :mod:`seats.sandbox.answers`: each delivery to the seat is
  offered to a parked run's question first.

A seat given up (:meth:`release`) has its jobs ended here without ending the
runs: the seat's next holder starts them again.
"""
from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Optional

from django.db import DatabaseError

from crewlet.base.db import in_store
from crewlet.base.logfmt import short_reason
from crewlet.company.org import CompanyHolder, Seat
from crewlet.company.sandbox import SandboxConfig
from crewlet.events import Event
from crewlet.events.tracing import trace_of
from crewlet.events.types import SandboxClarificationRequested, SandboxRunCompleted, SandboxRunFailed, SandboxRunStarted
from crewlet.queue import topics
from crewlet.queue.contract import Delivery, EventQueue, Outcome, Partition, Subscription
from crewlet.queue.emit import Emitter
from crewlet.queue.errors import QueueError
from seats.inbox_state import HOLD_SANDBOX
from seats.mailboxes import ensure_control_mailbox
from seats.sandbox import answers, runs, wakes
from seats.sandbox.errors import SandboxError
from seats.sandbox.jail import Job, JobEnd, check_available, prepare_workdir
from seats.sandbox.runs import Run
from seats.turn_types import Trigger

log = logging.getLogger("crewlet.seats.sandbox")

#: Runs the tool, the wake turn and the reopening of a seat's inbox through the seat runtime: (handle, wake, partition key) ->
#: True when the turn completed, False when it failed, None when this node runs no loop of the seat.
RunWake = Callable[[str, Event, str], Awaitable[Optional[bool]]]
Reopen = Callable[[str], Awaitable[None]]
#: How long the coordinator waits before it tries a store write of a run again.
STORE_RETRY_S = 1.0
#: Why a run was failed (``sandbox_run_failed.error``).
LOST = "lost with its node after {attempts} attempt(s)"
NOT_STARTED = "the sandbox could not start: {reason}"
NO_SANDBOX = "the company configures no sandbox"
RETIRED = "its seat was removed"
#: A wake turn that failed this close to the dead-letter is given up, so the run settles and the seat's mail runs.
WAKE_GIVE_UP_REMAINING = 1


class SandboxUnconfigured(SandboxError):
    """A launch in a company with no ``sandbox`` section."""


class SandboxCoordinator:
    """Every coding run of the seats this node holds (see the module docstring)."""

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        node_id: str,
        emitter: Emitter,
        root: Optional[Path],
        run_wake: RunWake,
        reopen: Reopen,
        environ: Mapping[str, str] = os.environ,
        bwrap: str = "bwrap",
        store_retry_s: float = STORE_RETRY_S,
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.node_id = node_id
        self.emitter = emitter
        #: Where each run's workdir is made (``<var dir>/sandbox`` on a node; a temporary directory otherwise).
        self.root = root or Path(tempfile.gettempdir()) / "crewlet-sandbox" / (node_id or "node")
        self.run_wake = run_wake
        self.reopen = reopen
        self.environ = environ
        self.bwrap = bwrap
        self.store_retry_s = store_retry_s
        #: The runs of each seat held here that still matter (a copy of their rows).
        self.runs: dict[str, dict[str, Run]] = {}
        self.jobs: dict[str, Job] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._subs: dict[str, Subscription] = {}
        self._held: set[str] = set()
        self._primed: dict[str, list[Run]] = {}
        #: ``bwrap`` ran a trial sandbox on this node (:func:`~seats.sandbox.jail.check_available`), once.
        self._bwrap_checked = False

    # -- what the inbox asks --------------------------------------------------------------

    def holding(self, handle: str) -> bool:
        """Whether a run of ``handle`` holds its inbox now."""
        return any(run.holds for run in self.runs.get(handle, {}).values())

    def parked(self, handle: str) -> list[Run]:
        return [run for run in self.runs.get(handle, {}).values() if run.status == runs.PARKED]

    def run_of(self, handle: str, run_id: str) -> Optional[Run]:
        return self.runs.get(handle, {}).get(run_id)

    async def offer(self, seat: Seat, partition: Partition) -> tuple[frozenset[str], str]:
        """The inbox's question (:class:`~seats.inbox_state.SandboxGate`): :func:`seats.sandbox.answers.offer`."""
        offered = await answers.offer(self, seat, partition)
        return offered.consumed, offered.why if offered.defer else ""

    # -- a seat taken and given up ---------------------------------------------------------

    async def acquire_many(self, handles: list[str]) -> None:
        """Read the runs of many seats in one query (a node's share of a company at boot), for their :meth:`acquire`."""
        found = await in_store(runs.open_runs)(handles)
        for handle in handles:
            self._primed[handle] = found.get(handle, [])

    async def acquire(self, handle: str) -> None:
        """Take the seat's runs over before its inbox is attached: the hold first (:meth:`attached` does the rest)."""
        found = self._primed.pop(handle) if handle in self._primed else (await in_store(runs.open_runs)([handle])).get(handle, [])
        if not found:
            return
        self.runs[handle] = {run.run_id: run for run in found}
        await self.sync_hold(handle, reopen=False)

    async def attached(self, handle: str) -> None:
        """The seat's inbox loop runs here now: consume its control subject and give each run what it still needs."""
        found = list(self.runs.get(handle, {}).values())
        if not found:
            return
        await self._attach_control(handle)
        for run in found:
            await self._recover(handle, run)

    async def _recover(self, handle: str, run: Run) -> None:
        """What a run left by its last node still needs: its job again, its ending told, its reply handed back."""
        log.info("sandbox_run_recovered", extra={"seat": handle, "run_id": run.run_id, "status": run.status, "attempt": run.attempt})
        if run.outbox:
            await self._send_outbox(handle, run)
        if run.status == runs.ENDED:
            if run.woken_at is None:
                await self._publish_control(handle, wakes.ending(run))
            return
        if run.status in (runs.RUNNING, runs.ANSWERED):
            await self.start_again(handle, run)

    async def start_again(self, handle: str, run: Run) -> None:
        """Start ``run``'s job at its next attempt on this node, or fail it once its attempts are spent."""
        org = self.holder.current()
        limit = org.sandbox.max_attempts if org.sandbox is not None else 0
        if run.attempt >= limit:
            await self._end(handle, run.run_id, runs.OUTCOME_FAILED, {"error": LOST.format(attempts=run.attempt)})
            return
        if not await in_store(runs.restarted)(run.run_id, self.node_id, run.attempt + 1):
            return  # it ended, or another attempt was started meanwhile
        run.attempt, run.node = run.attempt + 1, self.node_id
        await self._publish_control(handle, wakes.started(run))

    async def release(self, handle: str) -> None:
        """The seat is no longer this node's: end its jobs here (the runs stay for its next holder) and detach."""
        for run in list(self.runs.pop(handle, {}).values()):
            job = self.jobs.pop(run.run_id, None)
            watcher = self._watchers.pop(run.run_id, None)
            if watcher is not None:
                watcher.cancel()
            if job is not None:
                await job.kill()
                log.info("sandbox_job_left", extra={"seat": handle, "run_id": run.run_id, "attempt": run.attempt})
        self._held.discard(handle)
        sub = self._subs.pop(handle, None)
        if sub is not None:
            try:
                await sub.detach()
            except QueueError:
                log.warning("sandbox_control_detach_failed", extra={"seat": handle}, exc_info=True)

    async def stop(self) -> None:
        for handle in list(set(self.runs) | set(self._subs)):
            await self.release(handle)

    async def retire(self, handle: str) -> int:
        """End every run of a seat removed for good (before its subscriptions are deleted); how many were ended."""
        found = (await in_store(runs.open_runs)([handle])).get(handle, [])
        ended = 0
        for run in found:
            if run.status != runs.ENDED:
                self.runs.setdefault(handle, {})[run.run_id] = run
                await self._end(handle, run.run_id, runs.OUTCOME_FAILED, {"error": RETIRED}, tell=False)
                ended += 1
            await in_store(runs.woken)(run.run_id)
        await self.release(handle)
        return ended

    # -- launching ------------------------------------------------------------------------

    async def launch(self, seat: Seat, trigger: Trigger, task: str) -> Run:
        """Open the run's row, hold the seat, attach its control subject and publish the start, in that order."""
        config = self.holder.current().sandbox
        if config is None:
            raise SandboxUnconfigured(NO_SANDBOX)
        launch = wakes.launch_of(trigger)
        run = await in_store(runs.open_run)(
            run_id=runs.new_run_id(), seat=seat.handle, task=task, work_key=launch[wakes.CONVERSATION_IDENTITY],
            launch=launch, turn_id=trigger.turn_id, node=self.node_id,
        )
        self.runs.setdefault(seat.handle, {})[run.run_id] = run
        await self.sync_hold(seat.handle)
        try:
            await self._attach_control(seat.handle)
            started = wakes.started(run)
            await self.queue.publish(topics.agent_control(seat.handle), started)
        except QueueError as exc:
            await self._end(seat.handle, run.run_id, runs.OUTCOME_FAILED, {"error": NOT_STARTED.format(reason=short_reason(exc))}, tell=False)
            await in_store(runs.woken)(run.run_id)
            self._settled(seat.handle, run.run_id)
            await self.sync_hold(seat.handle)
            raise
        await self.emitter.publish(topics.event(started.type), started, log_event="sandbox_event_publish_failed", seat=seat.handle)
        log.info("sandbox_run_launched", extra={"seat": seat.handle, "run_id": run.run_id, "turn_id": trigger.turn_id})
        return run

    # -- the hold -----------------------------------------------------------------------------

    async def sync_hold(self, handle: str, *, reopen: bool = True) -> None:
        """Hold the seat's inbox while a run holds it; lift the hold (and fetch again) the moment none does."""
        inbox, group = topics.agent_inbox(handle), topics.agent_inbox_group(handle)
        if self.holding(handle):
            await self.queue.hold(inbox, group, HOLD_SANDBOX)
            if handle not in self._held:
                self._held.add(handle)
                log.info("sandbox_hold_taken", extra={"seat": handle})
        elif handle in self._held or not reopen:
            self._held.discard(handle)
            await self.queue.release(inbox, group, HOLD_SANDBOX)
            log.info("sandbox_hold_lifted", extra={"seat": handle})
            if reopen:
                await self.reopen(handle)

    # -- the control subject ---------------------------------------------------------------

    async def _attach_control(self, handle: str) -> None:
        if handle in self._subs:
            return
        await ensure_control_mailbox(self.queue, handle)

        async def handler(delivery: Delivery) -> Optional[Outcome]:
            return await self._control(handle, delivery)

        self._subs[handle] = await self.queue.subscribe(topics.agent_control(handle), topics.agent_control_group(handle), handler)

    async def reopen_control(self, handle: str) -> None:
        """Fetch the seat's control subject again after a wake was handed back (the seat was paused)."""
        sub = self._subs.get(handle)
        if sub is not None and await sub.unquiesce():
            log.info("sandbox_control_reopened", extra={"seat": handle})

    async def _publish_control(self, handle: str, event: Event) -> None:
        """Put ``event`` on the seat's control subject until the broker has it (a run's transitions are never dropped).

        The same event then goes to its event topic too, for the live feed and
        every broadcast reader: the store keeps one row, keyed on its id.
        """
        await self._publish_to(topics.agent_control(handle), event, handle)
        await self.emitter.publish(topics.event(event.type), event, log_event="sandbox_event_publish_failed", seat=handle)

    async def _control(self, handle: str, delivery: Delivery) -> Outcome:
        event = delivery.event
        data = event.data
        run_id = getattr(data, "run_id", "")
        try:
            run = self.run_of(handle, run_id) or await self._reload(handle, run_id)
        except DatabaseError as exc:
            log.warning("sandbox_store_failed", extra={"seat": handle, "run_id": run_id, "error": short_reason(exc)})
            return Outcome.NAK
        if run is None:
            return Outcome.ACK
        if isinstance(data, SandboxRunStarted):
            await self._start(handle, run, int(event.payload.get(wakes.K_ATTEMPT) or 0))
            return Outcome.ACK
        if isinstance(data, SandboxClarificationRequested):
            if run.status != runs.PARKED or run.question != data.question:
                return Outcome.ACK  # answered (or ended) before its turn came round
            return await self._wake(handle, run, event, delivery, settle=False)
        if isinstance(data, (SandboxRunCompleted, SandboxRunFailed)):
            if run.status != runs.ENDED or run.woken_at is not None:
                return Outcome.ACK
            return await self._wake(handle, run, event, delivery, settle=True)
        return Outcome.ACK

    async def _reload(self, handle: str, run_id: str) -> Optional[Run]:
        run = await in_store(runs.get)(run_id) if run_id else None
        if run is None or run.seat != handle or not (run.holds or run.status == runs.PARKED):
            return None
        self.runs.setdefault(handle, {})[run_id] = run
        return run

    async def _wake(self, handle: str, run: Run, event: Event, delivery: Delivery, *, settle: bool) -> Outcome:
        """Tell the seat in a turn of its own; an ending settles the run (and lifts the hold) once that turn ran."""
        ok = await self.run_wake(handle, event, str(run.launch.get(wakes.PARTITION_KEY) or f"sandbox:{run.run_id}"))
        if ok is None:  # paused (the resume reopens this subject), or the seat left this node
            log.info("sandbox_wake_deferred", extra={"seat": handle, "run_id": run.run_id, "type": event.type})
            return Outcome.DEFER
        if not ok and delivery.remaining > WAKE_GIVE_UP_REMAINING:
            return Outcome.NAK
        if settle:
            await self.store(runs.woken, run.run_id)
            self._settled(handle, run.run_id)
            await self.sync_hold(handle)
            log.info("sandbox_run_settled", extra={"seat": handle, "run_id": run.run_id, "outcome": run.outcome, "told": ok})
        return Outcome.ACK

    def _settled(self, handle: str, run_id: str) -> None:
        run = self.runs.get(handle, {}).pop(run_id, None)
        if run is not None:
            run.woken_at = datetime.now(timezone.utc)

    # -- the job --------------------------------------------------------------------------------

    async def _start(self, handle: str, run: Run, attempt: int) -> None:
        """Start the job of ``run``'s ``attempt`` here, unless that attempt is not the run's current one or runs already."""
        if run.status == runs.ENDED or attempt != run.attempt or run.run_id in self.jobs:
            return
        config = self.holder.current().sandbox
        if config is None:
            await self._end(handle, run.run_id, runs.OUTCOME_FAILED, {"error": NO_SANDBOX})
            return
        try:
            if not self._bwrap_checked:
                await asyncio.to_thread(check_available, self.bwrap)
                self._bwrap_checked = True
            workdir = await asyncio.to_thread(prepare_workdir, config, self.root, run.run_id)
            job = await Job.start(
                config, run_id=run.run_id, task=run.task, workdir=workdir, environ=self.environ, bwrap=self.bwrap,
                on_question=lambda question: self._asked(handle, run.run_id, question), checked=True,
            )
        except (SandboxError, OSError) as exc:
            log.warning("sandbox_job_start_failed", extra={"seat": handle, "run_id": run.run_id, "error": short_reason(exc)})
            await self._end(handle, run.run_id, runs.OUTCOME_FAILED, {"error": NOT_STARTED.format(reason=short_reason(exc))})
            return
        self.jobs[run.run_id] = job
        self._watchers[run.run_id] = asyncio.get_running_loop().create_task(
            self._watch(handle, run.run_id, job, config), name=f"sandbox-job:{run.run_id}"
        )
        log.info("sandbox_attempt_started", extra={"seat": handle, "run_id": run.run_id, "attempt": attempt, "node": self.node_id})

    async def _watch(self, handle: str, run_id: str, job: Job, config: SandboxConfig) -> None:
        end: JobEnd = await job.wait()
        self.jobs.pop(run_id, None)
        self._watchers.pop(run_id, None)
        if end.killed:
            return  # given up with its seat: the seat's next holder starts it again
        outcome = (
            runs.OUTCOME_TIMED_OUT if end.timed_out else runs.OUTCOME_SUCCEEDED if end.exit_code == 0 else runs.OUTCOME_EXITED
        )
        result = {"exit_code": end.exit_code, "output": end.output, "duration_s": round(end.duration_s, 3),
                  "time_limit_s": config.time_limit_s}
        await self._end(handle, run_id, outcome, result)

    async def _end(self, handle: str, run_id: str, outcome: str, result: dict[str, Any], *, tell: bool = True) -> None:
        """Decide the run's ending on its row (once, whoever asks first) and publish it on the seat's control subject.

        ``tell=False``: the ending is recorded but wakes no turn.
        """
        run = await self.store(runs.ended, run_id, outcome, result, datetime.now(timezone.utc))
        assert isinstance(run, Run)
        self.runs.setdefault(handle, {})[run_id] = run
        log.info("sandbox_run_ended", extra={"seat": handle, "run_id": run_id, "outcome": run.outcome})
        if run.outbox:
            await self._send_outbox(handle, run)
        event = wakes.ending(run)
        if tell:
            await self._publish_control(handle, event)
        else:  # recorded, with no seat to tell (retired, or its launching turn is told by the tool's error)
            await self.emitter.publish(topics.event(event.type), event, log_event="sandbox_event_publish_failed", seat=handle)

    async def _send_outbox(self, handle: str, run: Run) -> None:
        """Hand a reply no job took back to the seat's inbox as the ordinary message it is, then clear the outbox."""
        assert run.outbox is not None
        event = answers.handed_back(run.outbox, run.run_id)
        await self._publish_to(topics.agent_inbox(handle), event, handle)
        await self.store(runs.outbox_sent, run.run_id)
        run.outbox = None
        log.info("sandbox_reply_handed_back", extra={"seat": handle, "run_id": run.run_id, "event_id": event.id})

    async def _publish_to(self, topic: str, event: Event, handle: str) -> None:
        while True:
            try:
                await self.queue.publish(topic, event)
                return
            except QueueError as exc:
                log.warning("sandbox_publish_failed", extra={"seat": handle, "type": event.type, "error": short_reason(exc)})
                await asyncio.sleep(self.store_retry_s)

    async def _asked(self, handle: str, run_id: str, question: str) -> None:
        """The job asked a person something: a reply already recorded (a job started again) is its answer; else it parks."""
        run = self.run_of(handle, run_id)
        if run is None:
            return
        if run.status == runs.ANSWERED and run.answer:
            await answers.resume(self, handle, run)
            return
        at = datetime.now(timezone.utc)
        if not await self.store(runs.parked, run_id, question, at):
            # The run ended meanwhile: its job would wait for an answer nobody is asked for (the jail ends it).
            raise SandboxError(f"run {run_id} ended before its question could be put")
        run.status, run.question, run.asked_at, run.answer = runs.PARKED, question, at, None
        log.info("sandbox_run_parked", extra={"seat": handle, "run_id": run_id})
        await self.sync_hold(handle)
        await self._publish_control(handle, wakes.asked(run, question))

    async def store(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A run's own write, tried until the coordination store takes it: a transition is never dropped."""
        while True:
            try:
                return await in_store(fn)(*args)
            except DatabaseError as exc:
                log.warning("sandbox_store_failed", extra={"call": fn.__name__, "error": short_reason(exc)})
                await asyncio.sleep(self.store_retry_s)

    async def emit(self, body: Any) -> None:
        await self.emitter.emit(body, trace_of(), log_event="sandbox_event_publish_failed")


__all__ = ["RunWake", "SandboxCoordinator", "SandboxUnconfigured"]
