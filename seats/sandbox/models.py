"""A coding run's row in the coordination store: what it is, where it stands, and what it still owes the seat.

It lives in ``default`` because the run outlives the node that started it:
the seat's next holder (another node, after a ``kill -9``) finds the row,
takes the seat's hold before attaching its inbox and starts the job again.

``status`` is the run's state; ``holds`` is derived from it (see
:func:`seats.sandbox.runs.holds`): a ``running`` or ``answered`` run holds its
seat's inbox, a ``parked`` one holds nothing (the seat must be able to
receive the answer), and an ``ended`` one holds until its ending's turn ran
(``woken_at``), so the seat's waiting mail is worked after that turn.
"""
from __future__ import annotations

from django.db import models

__all__ = ["SandboxRun"]


class SandboxRun(models.Model):
    """One detached job a seat launched."""

    STATUS_RUNNING = "running"
    STATUS_PARKED = "parked"
    STATUS_ANSWERED = "answered"
    STATUS_ENDED = "ended"

    run_id = models.CharField(max_length=64, primary_key=True)
    seat = models.CharField(max_length=64, db_index=True)
    status = models.CharField(max_length=16, default=STATUS_RUNNING)
    task = models.TextField()
    #: The conversation the run was launched from (the launching wake's conversation identity).
    work_key = models.CharField(max_length=255, default="", blank=True)
    #: The launching wake's routing values (partition key, message id, source ...): where its ending answers.
    launch = models.JSONField(default=dict)
    turn_id = models.CharField(max_length=64, default="", blank=True)
    #: The node running its job now, and how many times a job of it was started.
    node = models.CharField(max_length=64, default="", blank=True)
    attempt = models.IntegerField(default=0)
    question = models.TextField(default="", blank=True)
    asked_at = models.DateTimeField(null=True, blank=True)
    #: The reply recorded for its question: the wake (wire JSON), who answered and by which route.
    answer = models.JSONField(null=True, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    #: A reply no job took, on its way back to the seat's inbox as an ordinary message (wire JSON).
    outbox = models.JSONField(null=True, blank=True)
    outcome = models.CharField(max_length=16, default="", blank=True)
    #: The ending's event id and instant, decided once: a node repeating an ending publishes the same event.
    ending_id = models.CharField(max_length=64, default="", blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict)
    #: The ending's turn ran (the seat was told); until then the run still holds the seat.
    woken_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["seat", "status"], name="sandbox_run_seat_status")]

    def __str__(self) -> str:  # pragma: no cover - admin display
        return f"{self.run_id} ({self.seat}, {self.status})"
