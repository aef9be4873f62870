"""A seat's running turn: the runner in a task of its own, so that it can be stopped.

The inbox loop runs one turn of its seat at a time and waits for it here. A
person's pause (``stop_running``) ends it at its next round, or cancels it
where it is once ``stop_grace_s`` has passed; a lost seat lease cancels it at
once and hands its mail back to the seat's next holder. A turn that crashes
is a failed ``crashed`` result rather than an exception, so the loop settles
it like any other failed turn.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from crewlet.base.logfmt import short_reason
from crewlet.company.org import Seat
from seats import steering
from seats.hooks import begin_turn
from seats.turn_types import ERR_CRASHED, OUTCOME_FAILED, Trigger, TurnResult, TurnStop
from seats.turns import TurnRunner


def log_failure(
    log: logging.Logger,
    seat: str,
    event: str,
    exc: BaseException,
    first_delivery: bool,
    *,
    level: int = logging.WARNING,
    **fields: object,
) -> None:
    """One line per failed delivery; the traceback only on a first delivery (and at DEBUG after).

    A message that fails on every one of its deliveries then logs one
    traceback, not one per delivery.
    """
    log.log(level, event, extra={"seat": seat, "error": short_reason(exc), **fields}, exc_info=first_delivery)
    if not first_delivery:
        log.debug(f"{event}_traceback", extra={"seat": seat}, exc_info=exc)


class TurnTask:
    """The task one seat's turn runs in, and how it is stopped.

    It logs under ``log``, the inbox loop's logger: its lines are the loop's.
    """

    def __init__(self, runner: TurnRunner, handle: str, *, stop_grace_s: float, log: logging.Logger) -> None:
        self.runner = runner
        self.handle = handle
        self.stop_grace_s = stop_grace_s
        self.log = log
        self._task: Optional[asyncio.Task[TurnResult]] = None
        self._trigger: Optional[Trigger] = None
        self._stop_request: Optional[TurnStop] = None
        #: The stopped turn's mail goes back to the broker for the seat's next holder (a lost lease).
        self._hand_back = False
        self._stop_timer: Optional[asyncio.TimerHandle] = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def trigger(self) -> Optional[Trigger]:
        """The running turn's trigger (where a person's note waits for its next round); None when none runs."""
        return self._trigger if self.running else None

    def take_hand_back(self) -> bool:
        """Whether the turn that ended was stopped to hand its mail back (a lost lease); asking clears it."""
        handed_back, self._hand_back = self._hand_back, False
        return handed_back

    def stop(
        self, *, by: str = "", by_seat: str = "", reason: str = "", at_next_round: bool = False, hand_back: bool = False
    ) -> bool:
        """End the running turn (published as stopped, with ``reason``); False when none runs.

        ``at_next_round`` (a person's pause): the turn ends at its next round —
        what is in flight finishes, nothing new starts — and is cancelled where
        it is only if that takes longer than ``stop_grace_s``. Without it (a
        lost lease: another node may run the seat already) the turn is
        cancelled at once.

        ``hand_back`` (a lost lease): the work was not this node's to finish,
        so its mail is deferred to the seat's next holder rather than recorded
        as worked. A turn that already called a tool that can change the
        world wrote its ledger row first, so the next holder skips it: a turn
        that has acted is never run twice (one that only read is).
        """
        task = self._task
        if task is None or task.done():
            return False
        self._stop_request = TurnStop(by=by, by_seat=by_seat, reason=reason)
        self._hand_back = self._hand_back or hand_back
        trigger = self._trigger
        if at_next_round and trigger is not None:
            trigger.stop = self._stop_request
            if self._stop_timer is None:
                self._stop_timer = asyncio.get_running_loop().call_later(self.stop_grace_s, self._stop_overdue, task)
        else:
            task.cancel()
        self.log.info(
            "seat_turn_stop_requested", extra={"seat": self.handle, "by": by, "reason": reason, "at_next_round": at_next_round}
        )
        return True

    def _stop_overdue(self, task: asyncio.Task[TurnResult]) -> None:
        """The grace is over and the stopped turn has not reached its next round: cancel it where it is."""
        if task is self._task and not task.done():
            self.log.warning("seat_turn_stop_overdue", extra={"seat": self.handle, "grace_s": self.stop_grace_s})
            task.cancel()

    @property
    def stopping(self) -> bool:
        """A stop of the running turn was asked for and the turn has not ended yet."""
        return self.running and self._stop_request is not None

    async def finished(self) -> None:
        """Return once no turn of this seat runs (at once when none does)."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def run(self, seat: Seat, trigger: Trigger) -> TurnResult:
        """The runner in its own task, so a person's stop_running can end it; a crash is a failed ``crashed`` result.

        The around-turn hooks (the chat working indicator) start with it and
        end once it has ended, however it ended; neither is waited on.
        """
        end_hooks = begin_turn(self.runner.hooks, self.runner.holder.current(), seat, trigger)
        task = asyncio.get_running_loop().create_task(
            self.runner.run(seat, trigger), name=f"seat-turn:{seat.handle}:{trigger.turn_id}"
        )
        self._task, self._trigger = task, trigger
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            stop = self._stop_request
            if stop is None or not task.cancelled() or (me is not None and me.cancelling()):
                task.cancel()
                raise
            return await self.runner.stopped(seat, trigger, by=stop.by, by_seat=stop.by_seat, reason=stop.reason)
        except Exception as exc:
            log_failure(self.log, self.handle, "seat_turn_crashed", exc, trigger.first_delivery, turn_id=trigger.turn_id)
            return TurnResult(turn_id=trigger.turn_id, outcome=OUTCOME_FAILED, error=short_reason(exc, 1000), error_kind=ERR_CRASHED)
        finally:
            end_hooks()
            steering.dropped(trigger, self.handle)
            if self._stop_timer is not None:
                self._stop_timer.cancel()
            self._task = self._trigger = self._stop_timer = None
            self._stop_request = None


__all__ = ["TurnTask", "log_failure"]
