"""Coordination-store rows behind notification routing.

They live in ``default`` — the store a fleet shares — because the node that
wins a delivery is usually not the one that saw the last one:

* :class:`ThreadFollow` — a seat follows a conversation once it was woken in
  it, so a later reply in that thread reaches it without a mention.
* :class:`RateCounter` — the rate valve's per-seat counters, one row per
  (seat, window), incremented atomically so every node counts into the same row.
* :class:`SeenDelivery` — the routing-side dedupe: one row per vendor delivery
  (a retry of it is dropped) and per (seat, message) wake (a second delivery
  of one chat message — Slack's ``app_mention`` beside its ``message``, or two
  apps in one workspace — never wakes a seat twice). Each row remembers the
  inbound event that claimed it, so a broker REDELIVERY of that same event
  (the routing node died half way) is routed again rather than lost.
* :class:`SourceToken` — the generic source's per-seat credential
  (``POST /webhooks/generic/<seat>``), stored only as its hash, so any node
  of the fleet can check a token minted on another.
"""
from __future__ import annotations

from django.db import models
from django.utils import timezone

from crewlet.base.tokens import HashedToken

__all__ = ["RateCounter", "SeenDelivery", "SourceToken", "ThreadFollow"]


class ThreadFollow(models.Model):
    """Seat ``seat`` follows conversation ``conversation`` (a conversation identity, e.g. ``slack:C1:1718.001``)."""

    seat = models.CharField(max_length=63)
    conversation = models.CharField(max_length=512)
    source = models.CharField(max_length=32, blank=True, default="")
    followed_at = models.DateTimeField(default=timezone.now)
    last_woken_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "notifications_thread_follow"
        constraints = [
            models.UniqueConstraint(fields=["seat", "conversation"], name="notifications_follow_seat_conv_uniq")
        ]
        indexes = [models.Index(fields=["conversation"], name="notifications_follow_conv_idx")]

    def __str__(self) -> str:
        return f"{self.seat} follows {self.conversation}"


class RateCounter(models.Model):
    """Wakes routed to ``seat`` in the window starting at ``window_start`` (epoch seconds)."""

    seat = models.CharField(max_length=63)
    window_start = models.BigIntegerField()
    count = models.IntegerField(default=0)

    class Meta:
        db_table = "notifications_rate_counter"
        constraints = [
            models.UniqueConstraint(fields=["seat", "window_start"], name="notifications_rate_seat_window_uniq")
        ]
        indexes = [models.Index(fields=["window_start"], name="notifications_rate_window_idx")]

    def __str__(self) -> str:
        return f"{self.seat}@{self.window_start}: {self.count}"


class SeenDelivery(models.Model):
    """A routing dedupe key (``delivery:<source>:<id>`` or ``wake:<seat>:<source>:<message>``) and who claimed it."""

    key = models.CharField(max_length=400, unique=True)
    event_id = models.CharField(max_length=64)
    seen_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "notifications_seen_delivery"

    def __str__(self) -> str:
        return f"{self.key} (by {self.event_id})"


class SourceToken(HashedToken):
    """The generic source's token for seat ``seat``, one per seat (a :class:`~crewlet.base.tokens.HashedToken`).

    It opens ``/webhooks/generic/<seat>`` and nothing else: not another
    seat's route, not the operator API.
    """

    seat = models.CharField(max_length=63, unique=True)

    class Meta:
        db_table = "notifications_source_token"

    def __str__(self) -> str:
        return f"source token for {self.seat}"
