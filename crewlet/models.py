"""Company config revisions: the YAML text of every revision, and the one pointer to the active one.

(The core's other model, the operator token, is defined in :mod:`crewlet.base.tokens`
and imported here, where Django looks for an app's models.)

Both live in the coordination store (``default``): every node of a fleet
polls the same pointer. A revision is immutable once written (a change is a
new revision); activation is a compare-and-set on the single pointer row, so
exactly one revision is active and only the caller that moved it announces it.
"""
from __future__ import annotations

from django.db import models

from crewlet.base.tokens import OperatorToken  # noqa: F401  (a model of this app: Django finds models here)


class ConfigRevision(models.Model):
    """One version of the company file, validated when it was written.

    Its content is ``yaml_text`` and ``included_files``: the text of every
    file the company includes (a seat's ``instructions_file``), by its path
    relative to the company file, read when the revision was written, so a
    revision is parsed from what it stores and never from a disk.
    ``imported_from`` names the company file a revision was imported from by
    ``up`` ("" for one written in the admin): the last such revision is what
    the next start compares the file with.
    """

    yaml_text = models.TextField(help_text="The company file (YAML), validated on save like the file is.")
    included_files = models.JSONField(
        default=dict, blank=True, help_text="The files the company includes, by path relative to the company file: their text."
    )
    imported_from = models.CharField(
        max_length=500, blank=True, default="", help_text="The company file this revision was imported from by up."
    )
    author = models.CharField(max_length=150, blank=True, default="")
    note = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)
        verbose_name = "config revision"

    def __str__(self) -> str:
        note = f": {self.note}" if self.note else ""
        return f"revision {self.pk}{note}"


class ActivationPointer(models.Model):
    """The single row (pk=1) naming the active revision; moved by a conditional UPDATE."""

    ROW_ID = 1

    id = models.PositiveSmallIntegerField(primary_key=True, default=ROW_ID)
    revision = models.ForeignKey(ConfigRevision, on_delete=models.PROTECT, related_name="+")
    activated_at = models.DateTimeField()
    activated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        verbose_name = "activation pointer"

    def __str__(self) -> str:
        return f"active: revision {self.revision_id}"


class Lease(models.Model):
    """A named right held by one node until ``expires_at``: taken and kept by compare-and-set.

    The database, not a process, decides who holds it: a node takes a row only
    where it is free (``holder`` empty or ``expires_at`` past) or already its
    own, in one conditional UPDATE, so two nodes racing for it cannot both win.
    ``epoch`` counts the changes of holder (a fencing number a reader can
    compare). ``expires_at`` is written from the database's own clock, so the
    nodes' clocks never have to agree.
    """

    name = models.CharField(max_length=200, primary_key=True)
    holder = models.CharField(max_length=63, blank=True, default="")
    expires_at = models.DateTimeField(db_index=True)
    acquired_at = models.DateTimeField()
    epoch = models.BigIntegerField(default=0)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.name}: {self.holder or '(free)'} until {self.expires_at:%Y-%m-%d %H:%M:%S}"


class NodeLease(Lease):
    """A node's presence: the live roster is the unexpired rows.

    ``name`` is the node id; ``holder`` is the id too (a node holds its own
    presence). ``store`` is the identity of the node's event store, so two
    live nodes never write one store.
    """

    labels = models.JSONField(default=list, blank=True)
    protocol = models.IntegerField(default=0)
    store = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        db_table = "crewlet_node_lease"
        verbose_name = "node lease"


class SeatLease(Lease):
    """Which node runs an agent seat (``name`` is the seat's handle): at most one at any instant."""

    class Meta:
        db_table = "crewlet_seat_lease"
        verbose_name = "seat lease"


class DutyLease(Lease):
    """Which node runs a once-per-fleet duty (retirement, retention, the scheduler), or holds an event store."""

    class Meta:
        db_table = "crewlet_duty_lease"
        verbose_name = "duty lease"


class StoreIdentity(models.Model):
    """The one row naming this event store: written once, in the ``events`` database, read at every start.

    It is what a node's presence says about its store, so a second node
    pointed at the same events database is refused rather than mixing two
    nodes' histories in one store.
    """

    ROW_ID = 1

    id = models.PositiveSmallIntegerField(primary_key=True, default=ROW_ID)
    identity = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "crewlet_store_identity"
        verbose_name = "event store identity"

    def __str__(self) -> str:
        return self.identity


class CustodyClaim(models.Model):
    """Which data node keeps one custody batch of a stateless node's events (eventstore.custody).

    Written by the stateless node before the batch is sent, moved to a second
    keeper (a compare-and-set on ``keeper`` while ``closed`` is false) when the
    first does not answer, and closed by the keeper's settle pass. A data node holding
    the batch's rows settles them when the claim names it, and drops them when
    it names another: the row is then the other keeper's.
    """

    batch = models.CharField(max_length=64, primary_key=True)
    origin = models.CharField(max_length=128)
    keeper = models.CharField(max_length=128)
    closed = models.BooleanField(default=False)
    rows = models.IntegerField(default=0)
    claimed_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        db_table = "crewlet_custody_claim"
        verbose_name = "custody claim"
