"""The episodes of conversation sessions: one row per turn a seat worked on a conversation, in the coordination store.

They live in ``default`` beside the completion ledger because a
conversation's next turn may run on any node of the fleet, and it is that
node which reads them back (:mod:`seats.episodes`). A row is written once, at
its turn's end, and deleted with its seat's retirement or when its
conversation holds more than it keeps.
"""
from __future__ import annotations

from django.db import models
from django.utils import timezone

__all__ = ["Episode"]

#: The longest conversation identity an episode is filed under: the read API's bound on a value, so any it
#: stores can be asked for.
CONVERSATION_MAX_LENGTH = 1000


class Episode(models.Model):
    """What a seat did on one turn of one conversation: asked, the tools it called, what it answered, how it ended.

    ``tools`` is the calls in order, each ``{"name", "ok"}``; ``outcome`` the
    turn's (completed, failed, stopped) with ``error`` saying why when it did
    not complete. The texts are already cut to the company's ``episodes.max_bytes``.
    """

    episode_id = models.CharField(max_length=36, unique=True)
    seat = models.CharField(max_length=63)
    conversation = models.CharField(max_length=CONVERSATION_MAX_LENGTH)
    turn_id = models.CharField(max_length=64)
    asked = models.TextField(blank=True, default="")
    answered = models.TextField(blank=True, default="")
    tools = models.JSONField(default=list, blank=True)
    outcome = models.CharField(max_length=16)
    error = models.TextField(blank=True, default="")
    written_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "seats_episode"
        indexes = [
            models.Index(fields=["seat", "conversation", "written_at"], name="seats_episode_conversation"),
            models.Index(fields=["seat", "written_at"], name="seats_episode_seat"),
        ]

    def __str__(self) -> str:
        return f"{self.seat} on {self.conversation}: {self.outcome} ({self.turn_id})"
