"""Company config revisions: create (validated), move the activation pointer (compare-and-set), read the active one.

A revision is the company file's text and the text of the files it includes
(a seat's ``instructions_file``, :mod:`crewlet.company.instructions`),
validated exactly as the file is (:func:`crewlet.company.parse.parse_company_text`,
so a bad value is refused with the same ``field=value: allowed`` message). Exactly one revision is active: the
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional

from django.db import IntegrityError, transaction
from django.utils import timezone

from crewlet import events
from crewlet.company.fields import CompanyError
from crewlet.company.org import Organization
from crewlet.company.parse import load_company, parse_company_text
from crewlet.events import Trace
from crewlet.events.types import ConfigRevisionActivated

log = logging.getLogger("crewlet.company.revisions")

#: How often every node reads the activation pointer (the authoritative path).
POLL_EVERY_S = 10.0
_CAS_ATTEMPTS = 8

#: The steps of applying a revision, in order; ``reached`` names the last one completed.
STEPS = ("read", "parsed", "applied")


def validate(yaml_text: str, files: Optional[Mapping[str, str]] = None) -> Organization:
    """The revision's company (``files``: its included files, path -> text), or the file's own :class:`CompanyError`."""
    return parse_company_text(yaml_text, files=files)


def create_revision(
    yaml_text: str, author: str, note: str = "", files: Optional[Mapping[str, str]] = None, imported_from: str = ""
) -> Any:
    """Store a new (inactive) revision after validating it; raises :class:`CompanyError` when bad.

    Of ``files`` only those the company includes are stored.
    """
    from crewlet.models import ConfigRevision

    org = validate(yaml_text, files)
    return ConfigRevision.objects.create(
        yaml_text=yaml_text, included_files=dict(org.source_files), author=author, note=note,
        imported_from=imported_from[:500],
    )


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
    #: The company file the revision was imported from, when ``up`` activated it at start.
    source_file: str = ""

    def event(self) -> events.Event:
        body = ConfigRevisionActivated(
            revision=self.revision, previous_revision=self.previous, activated_by=self.by, source_file=self.source_file
        )
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


# -- reading the active one ----------------------------------------------------------


class StoredContent(NamedTuple):
    """A stored revision's content: its YAML text and its included files."""

    revision: int
    text: str
    files: dict[str, str]

    def company(self) -> Organization:
        """The revision's company, parsed from what it stores; a :class:`CompanyError` when it no longer parses."""
        return validate(self.text, self.files)

    def served_by(self, org: Organization) -> bool:
        """Whether ``org`` was parsed from exactly this content."""
        return org.source_text == self.text and dict(org.source_files) == self.files


def content_of(revision: Any) -> StoredContent:
    return StoredContent(revision.pk, revision.yaml_text, dict(revision.included_files or {}))


def active_row() -> Optional[StoredContent]:
    """The active revision's content, or None when none was ever activated."""
    revision = active_revision()
    return content_of(revision) if revision is not None else None


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
        org = row.company()
    except CompanyError as exc:
        log.error("config_revision_unusable", extra={"revision": row.revision, "error": str(exc)})
        return None
    holder.swap(org)
    return row.revision


# -- the company file at start -------------------------------------------------------

#: What became of ``up``'s company file at start (:attr:`FileImport.outcome`).
FILE_IMPORTED = "imported"  # stored as a new revision and activated
FILE_UNCHANGED = "unchanged"  # the active revision runs: the file says nothing new
FILE_NOT_ACTIVATED = "not_activated"  # changed, stored, but an activation in the admin since the last import wins
FILE_NOT_GIVEN = "not_given"  # no --company: the example is imported only into an empty store


@dataclass(frozen=True)
class FileImport:
    """What the company file came to at start: which revision serves, which holds the file, and why."""

    outcome: str
    #: The active revision once the import is done.
    serving: int
    #: The revision whose content is the file's (new or matched); 0 when the file was not compared.
    revision: int
    reason: str
    #: The move of the pointer this import made, to be announced once the engine runs; None when it made none.
    activation: Optional[Activation] = None


def import_company_file(path: str | Path, author: str = "up", *, given: bool = True) -> FileImport:
    """Make the company file at ``path`` (with its included files) the served company, unless an admin's choice stands.

    * The store has no active revision, or its active revision is the one
      the last import made and the file's content differs from it: the file
      is stored as a new revision and activated (:attr:`FileImport.activation`
      for ``config_revision_activated`` naming the file).
    * The file's content is the active revision's, or the last import's while
      a revision activated in the admin since serves: nothing changes.
    * The file changed, but a revision was activated in the admin since the
      last import: the admin's choice wins. The file is stored as a new,
      inactive revision (one click activates it), and the log says so naming
      both revisions.
    * ``given`` False (``up`` without ``--company``, the example company): it
      is imported only into a store with no revision at all.

    A bad file raises :class:`CompanyError` (naming the field) and stores nothing.
    One log line says what happened and why.
    """
    from crewlet.models import ActivationPointer, ConfigRevision

    p = Path(path)
    shown = str(p.resolve())
    org = load_company(p)

    def store(note: str) -> Any:
        return ConfigRevision.objects.create(
            yaml_text=org.source_text, included_files=dict(org.source_files), author=author,
            note=f"imported from {p.name}{note}"[:300], imported_from=shown[:500],
        )

    with transaction.atomic(using="default"):
        pointer = (
            ActivationPointer.objects.select_for_update().select_related("revision")
            .filter(pk=ActivationPointer.ROW_ID).first()
        )
        active = content_of(pointer.revision) if pointer is not None else None
        last_row = ConfigRevision.objects.exclude(imported_from="").order_by("-pk").first()
        last = content_of(last_row) if last_row is not None else None
        file_is_last = last is not None and last.served_by(org)
        if not given and (active is not None or ConfigRevision.objects.exists()):
            why = "no --company given: the store's active revision runs"
            done = FileImport(FILE_NOT_GIVEN, active.revision if active else 0, 0, why)
        elif active is not None and active.served_by(org):
            imported_as_this = last is not None and last.revision == active.revision
            why = ("the file is unchanged since it was imported as this revision" if imported_as_this
                   else "the file's content is the active revision's")
            done = FileImport(FILE_UNCHANGED, active.revision, active.revision, why)
        elif active is None or (last is not None and last.revision == active.revision):
            stored = last_row if file_is_last else store("")
            change = activate_cas(stored.pk, author)
            why = (f"the file differs from revision {active.revision}, which it was last imported as"
                   if active is not None else "the store had no active revision")
            announce = replace(change, source_file=shown) if change is not None else None
            done = FileImport(FILE_IMPORTED, stored.pk, stored.pk, why, announce)
        elif last is not None and file_is_last:
            why = (f"revision {active.revision} was activated in the admin after the file was imported as "
                   f"revision {last.revision}, and the file is unchanged since")
            done = FileImport(FILE_UNCHANGED, active.revision, last.revision, why)
        else:
            stored = store(", not activated")
            since = f"since the last import (revision {last.revision})" if last is not None else "and no file was imported before"
            why = (f"revision {active.revision} was activated in the admin {since}: it stays active, "
                   f"and the file is stored as revision {stored.pk}; activate that in the admin to serve the file")
            done = FileImport(FILE_NOT_ACTIVATED, active.revision, stored.pk, why)
    level = logging.WARNING if done.outcome == FILE_NOT_ACTIVATED else logging.INFO
    log.log(level, f"company_file_{done.outcome}",
            extra={"revision": done.serving, "file_revision": done.revision, "path": shown, "reason": done.reason})
    return done


__all__ = [
    "POLL_EVERY_S",
    "STEPS",
    "Activation",
    "activate_cas",
    "active_revision",
    "active_row",
    "adopt_active",
    "FILE_IMPORTED",
    "FILE_NOT_ACTIVATED",
    "FILE_NOT_GIVEN",
    "FILE_UNCHANGED",
    "FileImport",
    "content_of",
    "create_revision",
    "import_company_file",
    "StoredContent",
    "validate",
]
