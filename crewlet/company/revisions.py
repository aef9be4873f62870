"""Company config revisions: create (validated), move the activation pointer (compare-and-set), read the active one.

A revision is the company file's text, validated exactly as the file is
(:func:`crewlet.company.parse.parse_company_text`, so a bad value is refused with the
same ``field=value: allowed`` message). Exactly one revision is active: the
single :class:`~crewlet.models.ActivationPointer` row names it, and
:func:`activate` moves it with a conditional UPDATE, so only the caller whose
update matched announces ``config_revision_activated`` — after the commit — on
``crewlet.config.revision_activated`` (and ``crewlet.events.…``, where the
event is recorded).

That announcement is a best-effort nudge. The authoritative path is
:class:`crewlet.engine.activation.ConfigPoller`, one per node: it reads the pointer every
``interval_s`` (10 s by default; a nudge wakes it early), parses the active
revision, hands it to the running seat runtime (``SeatRuntime.apply``: the
holder swap, ``ensure_mailboxes``, the coalesce knobs and gate, the
no-provider holds) and publishes ``config_revision_applied`` with its node,
the outcome and the last step it reached.

Sync callers (the admin) announce on the loop of the engine running in this
process (:func:`crewlet.engine.runtime.current_engine`); with no engine in the
process the change is stored and every node's poller still applies it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from django.db import IntegrityError, transaction
from django.utils import timezone

from crewlet import events
from crewlet.company.fields import CompanyError
from crewlet.company.org import Organization
from crewlet.company.parse import parse_company_text, read_company_text
from crewlet.events import Trace
from crewlet.events.types import ConfigRevisionActivated

log = logging.getLogger("crewlet.company.revisions")

#: How often every node reads the activation pointer (the authoritative path).
POLL_EVERY_S = 10.0
_CAS_ATTEMPTS = 8

#: The steps of applying a revision, in order; ``reached`` names the last one completed.
STEPS = ("read", "parsed", "applied")


def validate(yaml_text: str) -> Organization:
    """The revision's company, or the file's own :class:`CompanyError`."""
    return parse_company_text(yaml_text)


def create_revision(yaml_text: str, author: str, note: str = "") -> Any:
    """Store a new (inactive) revision after validating it; raises :class:`CompanyError` when bad."""
    from crewlet.models import ConfigRevision

    validate(yaml_text)
    return ConfigRevision.objects.create(yaml_text=yaml_text, author=author, note=note)


def active_revision() -> Any:
    """The active :class:`~crewlet.models.ConfigRevision`, or None when none was ever activated."""
    from crewlet.models import ActivationPointer

    pointer = ActivationPointer.objects.select_related("revision").filter(pk=ActivationPointer.ROW_ID).first()
    return pointer.revision if pointer is not None else None


@dataclass(frozen=True)
class Activation:
    """One won move of the pointer."""

    revision: int
    previous: int
    by: str

    def event(self) -> events.Event:
        body = ConfigRevisionActivated(revision=self.revision, previous_revision=self.previous, activated_by=self.by)
        return events.new(body, Trace.root(), source="operator")


def activate_cas(revision_id: int, by: str) -> Optional[Activation]:
    """Point at ``revision_id``; the change, or None when it already was the active one."""
    from crewlet.models import ActivationPointer, ConfigRevision

    if not ConfigRevision.objects.filter(pk=revision_id).exists():
        raise ConfigRevision.DoesNotExist(f"no config revision {revision_id}")
    for _ in range(_CAS_ATTEMPTS):
        now = timezone.now()
        current = ActivationPointer.objects.filter(pk=ActivationPointer.ROW_ID).values_list("revision_id", flat=True).first()
        if current == revision_id:
            return None
        if current is None:
            try:
                with transaction.atomic(using="default"):
                    ActivationPointer.objects.create(
                        id=ActivationPointer.ROW_ID, revision_id=revision_id, activated_at=now, activated_by=by
                    )
            except IntegrityError:
                continue  # someone activated first: read again
            return Activation(revision_id, 0, by)
        moved = ActivationPointer.objects.filter(pk=ActivationPointer.ROW_ID, revision_id=current).update(
            revision_id=revision_id, activated_at=now, activated_by=by
        )
        if moved:
            return Activation(revision_id, current, by)
    raise RuntimeError(f"could not activate revision {revision_id}: the pointer kept changing")


def import_first_revision(path: str | Path, author: str = "up") -> Any:
    """Store and activate the company file as the first revision — only when the store has none.

    Returns the new revision, or None when revisions already exist. A bad file
    raises :class:`CompanyError` (naming the file) and stores nothing.
    """
    from crewlet.models import ConfigRevision

    p = Path(path)
    text = read_company_text(p)
    parse_company_text(text, source=str(p))
    with transaction.atomic(using="default"):
        if ConfigRevision.objects.exists():
            return None
        revision = ConfigRevision.objects.create(yaml_text=text, author=author, note=f"imported from {p.name}")
        activate_cas(revision.pk, author)
    log.info("config_revision_imported", extra={"revision": revision.pk, "path": str(p)})
    return revision


# -- reading the active one ----------------------------------------------------------


def active_row() -> Optional[tuple[int, str]]:
    revision = active_revision()
    return (revision.pk, revision.yaml_text) if revision is not None else None


def adopt_active(holder: Any) -> Optional[int]:
    """Serve the active revision from the start when the store has one; its id, else None (the file stays)."""
    from django.db import DatabaseError

    try:
        row = active_row()
    except DatabaseError:
        log.warning("config_revisions_unavailable", extra={"reason": "store not migrated"}, exc_info=True)
        return None
    if row is None:
        return None
    try:
        org = parse_company_text(row[1])
    except CompanyError as exc:
        log.error("config_revision_unusable", extra={"revision": row[0], "error": str(exc)})
        return None
    holder.swap(org)
    return row[0]


__all__ = [
    "POLL_EVERY_S",
    "STEPS",
    "Activation",
    "activate_cas",
    "active_revision",
    "active_row",
    "adopt_active",
    "create_revision",
    "import_first_revision",
    "validate",
]
