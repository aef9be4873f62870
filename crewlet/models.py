"""Company config revisions: the YAML text of every revision, and the one pointer to the active one.

(The core's other model, the operator token, is defined in :mod:`crewlet.tokens`
and imported here, where Django looks for an app's models.)

Both live in the coordination store (``default``): every node of a fleet
polls the same pointer. A revision is immutable once written (a change is a
new revision); activation is a compare-and-set on the single pointer row, so
exactly one revision is active and only the caller that moved it announces it.
"""
from __future__ import annotations

from django.db import models

from crewlet.tokens import OperatorToken  # noqa: F401  (a model of this app: Django finds models here)


class ConfigRevision(models.Model):
    """One version of the company file, validated when it was written."""

    yaml_text = models.TextField(help_text="The company file (YAML), validated on save like the file is.")
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
