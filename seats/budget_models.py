"""The usage domain's token counters: one row per (scope, period, window), in the coordination store.

They live in ``default`` beside the fleet's leases because every node charges
the same counts: the company's day is one number however many nodes ran its
turns, and a node that leaves the fleet takes none of it with it. A row is
only ever incremented in place (``tokens = tokens + n``, one statement), so
two nodes charging the same window at once both count; a new window is a new
row, so nothing is ever reset.
"""
from __future__ import annotations

from django.db import models

__all__ = ["TokenUsage"]


class TokenUsage(models.Model):
    """Tokens spent in one calendar window by the company (``scope`` ``company``) or one seat (``seat:<handle>``)."""

    scope = models.CharField(max_length=80)
    period = models.CharField(max_length=8)
    window = models.CharField(max_length=16)
    tokens = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "seats_token_usage"
        verbose_name = "token usage window"
        constraints = [models.UniqueConstraint(fields=("scope", "period", "window"), name="seats_token_usage_window")]

    def __str__(self) -> str:
        return f"{self.scope} {self.period} {self.window}: {self.tokens}"
