"""Coordination-store rows behind seat delivery: seat records, the completion ledger, pause rows, schedule firings.

They live in ``default`` because a fleet shares them: whichever node a
redelivery reaches must see the completion ledger, whichever node a person's
pause reaches must win or lose the same compare-and-set, and a schedule slot
must be claimable exactly once across every node.

* :class:`SeatRecord` — every seat the mailbox walk has seen, so a removed
  seat's retirement clock has somewhere to live once its handle is gone from
  the company the names are derived from.
* :class:`LedgerEntry` — the completion ledger: one row per (seat, trigger
  identity) a finished turn worked, so a redelivery is skipped, not rerun.
* :class:`SeatPause` — a person's pause of a seat, changed only by
  compare-and-set on ``version`` so exactly one caller announces each change.
* :class:`ScheduleFiring` — one row per (schedule, slot): the unique key is
  what makes a fleet fire each slot once.
* :class:`ScheduleSeen` — when the fleet first saw each (schedule, cadence):
  a ``cron`` schedule fires no slot that began before it existed.
"""
from __future__ import annotations

from django.db import models
from django.utils import timezone

__all__ = ["SeatRecord", "LedgerEntry", "SeatPause", "ScheduleFiring", "ScheduleSeen"]


class SeatRecord(models.Model):
    """A seat the mailbox walk recorded, and its retirement clock.

    ``absent_since`` is when the handle stopped having an AGENT seat in the
    active company (removed, or flipped to human): the clock the maintenance
    duty reads before deleting its mailboxes. ``retired_at`` says the
    mailboxes were deleted; both clear when the seat comes back.
    """

    KIND_AGENT = "agent"
    KIND_HUMAN = "human"
    #: A mailbox found on the broker that no walk recorded (it escaped the record).
    KIND_UNKNOWN = "unknown"

    handle = models.CharField(max_length=63, unique=True)
    kind = models.CharField(max_length=16, default=KIND_AGENT)
    first_seen = models.DateTimeField(default=timezone.now)
    last_active_at = models.DateTimeField(default=timezone.now)
    absent_since = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "seats_seat_record"

    def __str__(self) -> str:
        return f"{self.handle} ({self.kind})"


class LedgerEntry(models.Model):
    """One trigger a completed turn worked, keyed on the trigger's identity.

    The identity is the provider's message/delivery id where the wake carries
    one, else the event id (``seats.ledger.trigger_identity``). Unique per
    seat: one chat message can wake two seats, and each owes it a turn.
    """

    seat = models.CharField(max_length=63)
    trigger = models.CharField(max_length=255)
    turn_id = models.CharField(max_length=64)
    event_id = models.CharField(max_length=64, blank=True, default="")
    worked_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "seats_ledger_entry"
        constraints = [models.UniqueConstraint(fields=["seat", "trigger"], name="seats_ledger_seat_trigger_uniq")]

    def __str__(self) -> str:
        return f"{self.seat}:{self.trigger} by {self.turn_id}"


class SeatPause(models.Model):
    """A seat's pause state; every change bumps ``version`` by compare-and-set.

    The caller whose conditional update matched the version it read is the
    one that publishes ``seat_paused`` / ``seat_resumed``, so each change is
    announced once however many people (or nodes) clicked at the same time.
    """

    handle = models.CharField(max_length=63, unique=True)
    paused = models.BooleanField(default=False)
    paused_by = models.CharField(max_length=200, blank=True, default="")
    paused_by_seat = models.CharField(max_length=63, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    stop_running = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    resumed_by = models.CharField(max_length=200, blank=True, default="")
    resumed_at = models.DateTimeField(null=True, blank=True)
    version = models.BigIntegerField(default=0)

    class Meta:
        db_table = "seats_seat_pause"

    def __str__(self) -> str:
        return f"{self.handle} {'paused' if self.paused else 'running'} v{self.version}"


class ScheduleFiring(models.Model):
    """One firing of one schedule slot; the unique pair is the fleet's fire-once guarantee.

    ``slot`` is the slot's start in epoch milliseconds (slots are aligned to
    the epoch, ``every`` long), so every node computes the same slot for the
    same instant with no coordination beyond this insert.
    """

    schedule = models.CharField(max_length=200)
    slot = models.BigIntegerField()
    seat = models.CharField(max_length=63)
    task_event_id = models.CharField(max_length=64)
    node = models.CharField(max_length=63, blank=True, default="")
    fired_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "seats_schedule_firing"
        constraints = [models.UniqueConstraint(fields=["schedule", "slot"], name="seats_schedule_slot_uniq")]

    def __str__(self) -> str:
        return f"{self.schedule}@{self.slot}"


class ScheduleSeen(models.Model):
    """The first instant any node of the fleet saw a schedule with this cadence (epoch milliseconds, its clock).

    The first insert wins and every node reads the same row, so a schedule
    added (or given a new cadence) at 10:00 does not fire its 09:00 slot
    anywhere, while a slot that began after it was first seen is still owed
    to a node that was down at the boundary.
    """

    schedule = models.CharField(max_length=200)
    cadence = models.CharField(max_length=300)
    first_seen_ms = models.BigIntegerField()

    class Meta:
        db_table = "seats_schedule_seen"
        constraints = [models.UniqueConstraint(fields=["schedule", "cadence"], name="seats_schedule_seen_uniq")]

    def __str__(self) -> str:
        return f"{self.schedule} ({self.cadence})"
