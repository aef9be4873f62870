"""The node's materialized copy of the memory of the seats it holds (in the ``events`` database: the node's own store)."""
from __future__ import annotations

from django.db import models


class MemoryRow(models.Model):
    """One row of one seat's memory as this node last saw it on CREWLET_MEMORY.

    A forgotten row stays as a tombstone (``deleted``, no text) so a write that
    arrives late can be told from a newer forget: the newer of two writes, by
    ``(written_at, event_id)``, is the one kept. ``text`` is what search reads
    (the table, the key and the value's words).
    """

    seat = models.CharField(max_length=200)
    table = models.CharField(max_length=64)
    key = models.CharField(max_length=200)
    value = models.TextField(default="null")
    text = models.TextField(default="")
    deleted = models.BooleanField(default=False)
    written_at = models.DateTimeField()
    event_id = models.CharField(max_length=64, default="")
    written_by = models.CharField(max_length=32, default="")
    turn_id = models.CharField(max_length=64, default="")

    class Meta:
        db_table = "seats_memory_row"
        constraints = [models.UniqueConstraint(fields=["seat", "table", "key"], name="seats_memory_row_one_per_key")]
        indexes = [models.Index(fields=["seat", "table"], name="seats_memory_row_seat_table")]
