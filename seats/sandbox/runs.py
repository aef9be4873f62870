"""The coordination store's side of a coding run: every change to a :class:`~seats.sandbox.models.SandboxRun` row.

Each function is one short transaction, called through ``in_store`` by the
coordinator; the row is the run's truth across nodes, the coordinator's
memory only a copy of the rows of the seats this node holds. A change that
depends on the row's state (record a reply only on a parked run, decide an
ending only once) is a conditional update, so two nodes racing over a run
cannot both win.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Optional

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from seats.delivery_models import LedgerEntry
from seats.ledger import record as record_worked
from seats.sandbox.models import SandboxRun

RUNNING = SandboxRun.STATUS_RUNNING
PARKED = SandboxRun.STATUS_PARKED
ANSWERED = SandboxRun.STATUS_ANSWERED
ENDED = SandboxRun.STATUS_ENDED
#: How a run ended (``sandbox_run_completed.outcome``, or failed).
OUTCOME_SUCCEEDED = "succeeded"
OUTCOME_EXITED = "exited_nonzero"
OUTCOME_TIMED_OUT = "timed_out"
OUTCOME_FAILED = "failed"


@dataclass
class Run:
    """A snapshot of one row, as the coordinator keeps it."""

    run_id: str
    seat: str
    status: str
    task: str
    work_key: str = ""
    launch: dict[str, Any] = field(default_factory=dict)
    turn_id: str = ""
    node: str = ""
    attempt: int = 0
    question: str = ""
    asked_at: Optional[datetime] = None
    answer: Optional[dict[str, Any]] = None
    answered_at: Optional[datetime] = None
    outbox: Optional[dict[str, Any]] = None
    outcome: str = ""
    ending_id: str = ""
    ended_at: Optional[datetime] = None
    result: dict[str, Any] = field(default_factory=dict)
    woken_at: Optional[datetime] = None
    created_at: Optional[datetime] = None

    @property
    def holds(self) -> bool:
        """Whether the run holds its seat's inbox now: working, resuming, or ended and its seat not yet told."""
        return holds(self.status, self.woken_at)

    def as_dict(self) -> dict[str, Any]:
        """The run as the API answers it (the reply's wire form left out: who answered is enough)."""
        answer = self.answer or {}
        return {
            "run_id": self.run_id,
            "seat": self.seat,
            "status": self.status,
            "holds": self.holds,
            "task": self.task,
            "work_key": self.work_key,
            "turn_id": self.turn_id,
            "node": self.node,
            "attempt": self.attempt,
            "question": self.question,
            "asked_at": self.asked_at.isoformat() if self.asked_at else None,
            "answered_by": answer.get("answered_by", ""),
            "answer_route": answer.get("route", ""),
            "outcome": self.outcome,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "result": self.result,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


def holds(status: str, woken_at: Optional[datetime]) -> bool:
    return status in (RUNNING, ANSWERED) or (status == ENDED and woken_at is None)


_FIELDS = [f.name for f in SandboxRun._meta.fields]


def _run(row: SandboxRun) -> Run:
    return Run(**{name: getattr(row, name) for name in _FIELDS})


#: What a run's id looks like (:func:`new_run_id`): a path naming anything else names no run.
RUN_ID = re.compile(r"run-[0-9a-f]{16}")


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:16]}"


def open_run(*, run_id: str, seat: str, task: str, work_key: str, launch: dict[str, Any], turn_id: str, node: str) -> Run:
    """The run's row, created running on ``node`` at its first attempt."""
    row = SandboxRun.objects.create(
        run_id=run_id, seat=seat, status=RUNNING, task=task, work_key=work_key[:255], launch=launch,
        turn_id=turn_id, node=node, attempt=1,
    )
    return _run(row)


def get(run_id: str) -> Optional[Run]:
    row = SandboxRun.objects.filter(run_id=run_id).first()
    return _run(row) if row is not None else None


def open_runs(seats: Iterable[str]) -> dict[str, list[Run]]:
    """The runs of ``seats`` that still matter to whoever holds them: not ended, or ended and unsettled, oldest first."""
    wanted = list(seats)
    rows = SandboxRun.objects.filter(seat__in=wanted).filter(
        ~Q(status=ENDED) | Q(woken_at__isnull=True) | Q(outbox__isnull=False)
    ).order_by("created_at")
    found: dict[str, list[Run]] = {}
    for row in rows:
        found.setdefault(row.seat, []).append(_run(row))
    return found


def holding_runs(seats: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The runs working for each of ``seats`` (started or resumed: not parked, not ended), for the dashboard's seed."""
    found: dict[str, tuple[str, ...]] = {}
    for seat, runs in open_runs(seats).items():
        working = tuple(run.run_id for run in runs if run.status in (RUNNING, ANSWERED))
        if working:
            found[seat] = working
    return found


def listing(seat: str = "", limit: int = 50) -> list[Run]:
    rows = SandboxRun.objects.all()
    if seat:
        rows = rows.filter(seat=seat)
    return [_run(row) for row in rows.order_by("-created_at")[:limit]]


def restarted(run_id: str, node: str, attempt: int) -> bool:
    """Move a working run to ``node`` at ``attempt`` (one more than the row has); False when it ended or moved already."""
    return bool(
        SandboxRun.objects.filter(run_id=run_id, attempt=attempt - 1)
        .exclude(status=ENDED)
        .update(node=node, attempt=attempt)
    )


def parked(run_id: str, question: str, asked_at: datetime) -> bool:
    """The run asked ``question`` and waits: it holds nothing from now (False: it ended meanwhile).

    A run whose reply is recorded but not yet marked taken parks too: a job
    asks again only once it has read the reply it was given.
    """
    return bool(
        SandboxRun.objects.filter(run_id=run_id, status__in=[RUNNING, ANSWERED]).update(
            status=PARKED, question=question, asked_at=asked_at, answer=None, answered_at=None
        )
    )


def answered(run_id: str, answer: dict[str, Any], event_id: str = "", identity: str = "") -> bool:
    """Record a reply on a parked run (it holds the seat again from now); False when it is not parked any more.

    A chat reply (``identity``: its trigger identity) goes to the completion
    ledger in the same transaction, worked by the run: from then on the reply
    reaches the seat through the run alone, so its original, should it come
    round again on any node, is dropped as worked — and one the ledger holds
    already (a run took it) is refused here, so no second run takes it.
    """
    with transaction.atomic():
        row = SandboxRun.objects.select_for_update().filter(run_id=run_id, status=PARKED).first()
        if row is None or (identity and LedgerEntry.objects.filter(seat=row.seat, trigger=identity).exists()):
            return False
        row.status, row.answer, row.answered_at = ANSWERED, answer, timezone.now()
        row.save(update_fields=["status", "answer", "answered_at"])
        if identity:
            record_worked(row.seat, ledger_turn(run_id), [(identity, event_id)])
        return True


def ledger_turn(run_id: str) -> str:
    """What the completion ledger names as the worker of a reply a run took (``turn_trigger_skipped.turn_id``)."""
    return f"sandbox:{run_id}"


def resumed(run_id: str) -> bool:
    """The job took the recorded reply: the run works again, the reply is its own."""
    return bool(SandboxRun.objects.filter(run_id=run_id, status=ANSWERED).update(status=RUNNING, answer=None))


def ended(run_id: str, outcome: str, result: dict[str, Any], at: datetime) -> Run:
    """Decide the run's ending once: the first caller's id and instant stand, and later callers are handed them.

    A reply recorded but never taken by a job is moved to the row's outbox in
    the same transaction, so it goes back to the seat's inbox as the ordinary
    message it is, whoever settles the run.
    """
    with transaction.atomic():
        row = SandboxRun.objects.select_for_update().get(run_id=run_id)
        if row.status != ENDED:
            if row.status == ANSWERED and row.answer:
                row.outbox = row.answer.get("event")
            row.status, row.outcome, row.result = ENDED, outcome, result
            row.ending_id, row.ended_at, row.answer = str(uuid.uuid4()), at, None
            row.save(update_fields=["status", "outcome", "result", "ending_id", "ended_at", "answer", "outbox"])
        return _run(row)


def woken(run_id: str) -> None:
    """The seat was told of the ending: the run holds nothing from now."""
    SandboxRun.objects.filter(run_id=run_id, woken_at__isnull=True).update(woken_at=timezone.now())


def outbox_sent(run_id: str) -> None:
    SandboxRun.objects.filter(run_id=run_id).update(outbox=None)


def prune(older_than: datetime) -> int:
    """Forget runs settled before ``older_than`` (the maintenance sweep's pass, as for the ledger)."""
    deleted, _ = SandboxRun.objects.filter(status=ENDED, woken_at__lt=older_than, outbox__isnull=True).delete()
    return int(deleted)


__all__ = [
    "ANSWERED", "ENDED", "OUTCOME_EXITED", "OUTCOME_FAILED", "OUTCOME_SUCCEEDED", "OUTCOME_TIMED_OUT", "PARKED",
    "RUNNING", "RUN_ID", "Run", "answered", "ended", "get", "holding_runs", "holds", "ledger_turn", "listing", "new_run_id", "open_run", "open_runs",
    "outbox_sent", "parked", "prune", "restarted", "resumed", "woken",
]
