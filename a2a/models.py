"""The coordination store's ``channels`` slot: one row per ephemeral A2A channel.

A row lives in ``default`` because the two parties are usually on different
nodes: the node that authorizes the answer (the one running the target seat)
is never the one that opened the channel. ``opened_at`` and ``closed_at`` are
both written by the store's own clock (``Now()``), so the duration a close
reports is one clock's difference, never two nodes' skew.
"""
from __future__ import annotations

import uuid

from django.db import models

__all__ = ["Channel"]


class Channel(models.Model):
    """One question, one answer, then closed; a closed row is kept so a late reply can say why it bounced."""

    OPEN = "open"
    CLOSED = "closed"
    STATES = [(OPEN, "open"), (CLOSED, "closed")]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    asker = models.CharField(max_length=63)
    target = models.CharField(max_length=63)
    state = models.CharField(max_length=8, choices=STATES, default=OPEN)
    message_count = models.PositiveIntegerField(default=0)
    brief = models.TextField(blank=True, default="")
    opened_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    #: The answering seat, its run and its work; all empty on a sweep's close.
    closed_by = models.CharField(max_length=63, blank=True, default="")
    turn_id = models.CharField(max_length=64, blank=True, default="")
    work_key = models.CharField(max_length=255, blank=True, default="")
    #: The asking turn and its place in a chain of asks (the answer wakes the asker at this depth).
    asker_turn_id = models.CharField(max_length=64, blank=True, default="")
    delegation_depth = models.PositiveIntegerField(default=0)
    delegation_chain = models.JSONField(default=list, blank=True)
    #: The channel the asker still owes an answer on, when its asking turn was itself answering one: the
    #: answer to THIS channel wakes the asker, and that turn's final response answers the owed channel.
    on_behalf_of = models.UUIDField(null=True, blank=True)

    class Meta:
        db_table = "a2a_channel"
        ordering = ["-opened_at"]
        indexes = [
            models.Index(fields=["state", "opened_at"], name="a2a_channel_state_opened"),
            models.Index(fields=["state", "closed_at"], name="a2a_channel_state_closed"),
            models.Index(fields=["on_behalf_of", "asker_turn_id"], name="a2a_channel_behalf"),
        ]

    def __str__(self) -> str:
        return f"{self.asker} → {self.target} ({self.state})"

    @property
    def participants(self) -> list[str]:
        return [self.asker, self.target]

    @property
    def open_seconds(self) -> float:
        """The record's own closed_at - opened_at; 0 while open."""
        if self.closed_at is None or self.opened_at is None:
            return 0.0
        return max((self.closed_at - self.opened_at).total_seconds(), 0.0)
