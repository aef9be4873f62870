"""The event store's one table: a row per stored event this node published.

Routed to the ``events`` database (crewlet.base.db_router). The columns are the
envelope, the tags the design promotes, a few values derived once at write time
so a read never has to open a body (``failed``, the token counts, the listing's
summary and actor), and the event's exact JSON (``body``). Rows are written by
the publish listener (:mod:`eventstore.writer`) with raw SQL in
:data:`eventstore.rows.COLUMNS` order; the model exists for migrations, the
admin and tests.
"""
from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q


class BinaryText(models.TextField):
    """Text ordered byte by byte: ``COLLATE "C"`` on PostgreSQL, SQLite's default BINARY elsewhere.

    Ids are half of the (timestamp, id) order every page is cut on; a
    locale-aware collation would order them one way in the database and
    another in Python, where the fleet merge puts nodes' pages together.
    """

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        params = super().db_parameters(connection)
        if connection.vendor == "postgresql":
            params["collation"] = "C"
        return params


def _sparse(column: str) -> Q:
    """Index only rows that carry the tag: most rows have no partition key, many no turn."""
    return Q(**{f"{column}__gt": ""})


class EventRow(models.Model):
    id = BinaryText(primary_key=True)
    ts = models.DateTimeField()  # the event's own timestamp, microseconds
    type = models.TextField()  # the row's label: the type, or an inbound delivery's own label
    category = models.TextField(default="")
    node = models.TextField(default="")
    source = models.TextField(default="")
    trace_id = models.TextField(default="")
    span_id = models.TextField(default="")
    parent_span_id = models.TextField(default="")
    seat = models.TextField(default="")
    turn_id = BinaryText(default="")
    conversation_key = models.TextField(default="")
    partition_key = models.TextField(default="")
    actor_seat = models.TextField(default="")
    tool = models.TextField(default="")
    dir = models.TextField(default="")
    delegation_depth = models.IntegerField(default=0)
    parent_turn_id = models.TextField(default="")
    failed = models.BooleanField(default=False)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    actor = models.TextField(default="")
    summary = models.TextField(default="")
    body = models.TextField()  # the event's JSON exactly as it was published
    # The custody batch a stateless node handed this row in, until this store settles it (eventstore.custody):
    # empty for every row this store keeps for good. Not in rows.COLUMNS: a plain insert leaves it at its default.
    custody_batch = models.TextField(default="", db_default="")

    class Meta:
        db_table = "eventstore_event"
        indexes = [
            # Newest-first pages and the retention sweep.
            models.Index(fields=["ts", "id"], name="eventstore_ts_id"),
            models.Index(fields=["category", "ts", "id"], name="eventstore_category_ts"),
            models.Index(fields=["type", "ts", "id"], name="eventstore_type_ts"),
            models.Index(fields=["node", "ts", "id"], name="eventstore_node_ts"),
            models.Index(fields=["trace_id", "ts", "id"], name="eventstore_trace_ts"),
            models.Index(fields=["seat", "ts", "id"], name="eventstore_seat_ts", condition=_sparse("seat")),
            models.Index(fields=["turn_id", "ts"], name="eventstore_turn_ts", condition=_sparse("turn_id")),
            models.Index(
                fields=["conversation_key", "ts", "id"],
                name="eventstore_conversation_ts",
                condition=_sparse("conversation_key"),
            ),
            models.Index(
                fields=["partition_key", "ts", "id"],
                name="eventstore_partition_ts",
                condition=_sparse("partition_key"),
            ),
            models.Index(fields=["custody_batch"], name="eventstore_custody", condition=_sparse("custody_batch")),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"
