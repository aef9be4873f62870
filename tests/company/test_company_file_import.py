"""The company file at start: a changed file (its included instruction files too) becomes the active revision, an
unchanged one keeps it, and an activation in the admin since the last import is never overwritten — each said in one log line."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from django.test import Client

from crewlet.company import revisions
from crewlet.company.fields import CompanyError
from crewlet.company.revisions import FILE_IMPORTED, FILE_NOT_ACTIVATED, FILE_NOT_GIVEN, FILE_UNCHANGED
from crewlet.engine import activation
from crewlet.models import ConfigRevision

pytestmark = pytest.mark.django_db(databases=["default", "events"])

COMPANY = """\
org: acme
providers:
  llm: [{kind: echo}]
seats:
  - {handle: ada, kind: agent, role: engineer, instructions_file: ada.md}
"""


def write(tmp_path: Path, instructions: str = "Own the deploy.", window_s: int = 0) -> Path:
    (tmp_path / "ada.md").write_text(instructions)
    path = tmp_path / "acme.yaml"
    path.write_text(COMPANY + f"notification_coalesce_window_seconds: {window_s}\n")
    return path


def said(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The import's own log lines."""
    return [r for r in caplog.records if r.getMessage().startswith("company_file_")]


def test_the_first_start_imports_the_file_with_its_instruction_file_and_activates_it_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "crewlet.company.revisions")
    path = write(tmp_path)
    done = revisions.import_company_file(path)
    [stored] = ConfigRevision.objects.all()
    assert (done.outcome, done.serving, done.revision) == (FILE_IMPORTED, stored.pk, stored.pk)
    assert stored.included_files == {"ada.md": "Own the deploy."}
    assert stored.imported_from == str(path.resolve())
    assert revisions.active_revision().pk == stored.pk
    assert done.activation is not None
    event = done.activation.event()
    assert (event.data.revision, event.data.previous_revision, event.data.source_file) == (stored.pk, 0, str(path.resolve()))
    [line] = said(caplog)
    assert (line.getMessage(), line.revision) == ("company_file_imported", stored.pk)  # type: ignore[attr-defined]
    assert line.reason == "the store had no active revision"  # type: ignore[attr-defined]


def test_an_unchanged_file_keeps_the_active_revision_and_says_which_and_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path)
    first = revisions.import_company_file(path)
    caplog.clear()
    caplog.set_level(logging.INFO, "crewlet.company.revisions")
    again = revisions.import_company_file(path)
    assert (again.outcome, again.serving, again.activation) == (FILE_UNCHANGED, first.serving, None)
    assert ConfigRevision.objects.count() == 1
    [line] = said(caplog)
    assert line.getMessage() == "company_file_unchanged" and line.revision == first.serving  # type: ignore[attr-defined]
    assert line.reason == "the file is unchanged since it was imported as this revision"  # type: ignore[attr-defined]


def test_a_changed_instruction_file_alone_is_a_changed_company_imported_and_activated(tmp_path: Path) -> None:
    first = revisions.import_company_file(write(tmp_path))
    done = revisions.import_company_file(write(tmp_path, instructions="Own the deploy. Never on Fridays."))
    assert done.outcome == FILE_IMPORTED and done.serving != first.serving
    assert done.reason == f"the file differs from revision {first.serving}, which it was last imported as"
    assert done.activation is not None and done.activation.previous == first.serving
    active = revisions.active_revision()
    assert active.pk == done.serving and active.yaml_text == ConfigRevision.objects.get(pk=first.serving).yaml_text
    assert revisions.content_of(active).company().seat_by_handle("ada").instructions == "Own the deploy. Never on Fridays."


def test_an_activation_in_the_admin_since_the_last_import_stays_while_the_file_is_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path)
    first = revisions.import_company_file(path)
    admins = revisions.create_revision(COMPANY + "notification_coalesce_window_seconds: 9\n", "ana", files={"ada.md": "x"})
    activation.activate(admins.pk, "ana")
    caplog.clear()
    caplog.set_level(logging.INFO, "crewlet.company.revisions")
    done = revisions.import_company_file(path)
    assert (done.outcome, done.serving, done.revision, done.activation) == (FILE_UNCHANGED, admins.pk, first.serving, None)
    [line] = said(caplog)
    assert line.reason == (  # type: ignore[attr-defined]
        f"revision {admins.pk} was activated in the admin after the file was imported as revision {first.serving}, "
        "and the file is unchanged since"
    )


def test_a_changed_file_does_not_overwrite_an_activation_in_the_admin_it_is_stored_and_the_warning_names_both(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = revisions.import_company_file(write(tmp_path))
    admins = revisions.create_revision(COMPANY, "ana", files={"ada.md": "From the admin."})
    activation.activate(admins.pk, "ana")
    caplog.clear()
    caplog.set_level(logging.INFO, "crewlet.company.revisions")
    path = write(tmp_path, window_s=5)
    done = revisions.import_company_file(path)
    stored = ConfigRevision.objects.get(pk=done.revision)
    assert (done.outcome, done.serving, done.activation) == (FILE_NOT_ACTIVATED, admins.pk, None)
    assert revisions.active_revision().pk == admins.pk
    assert stored.imported_from == str(path.resolve()) and "notification_coalesce_window_seconds: 5" in stored.yaml_text
    [line] = said(caplog)
    assert line.levelno == logging.WARNING and line.getMessage() == "company_file_not_activated"
    assert line.reason == (  # type: ignore[attr-defined]
        f"revision {admins.pk} was activated in the admin since the last import (revision {first.serving}): it stays "
        f"active, and the file is stored as revision {stored.pk}; activate that in the admin to serve the file"
    )
    # The next start with the same file: nothing new is stored, the admin's revision still runs.
    again = revisions.import_company_file(path)
    assert (again.outcome, again.serving, again.revision) == (FILE_UNCHANGED, admins.pk, stored.pk)
    assert ConfigRevision.objects.count() == 3


def test_up_without_a_company_file_imports_the_example_only_into_an_empty_store(tmp_path: Path) -> None:
    mine = revisions.import_company_file(write(tmp_path))
    from crewlet.company.parse import EXAMPLE_COMPANY

    done = revisions.import_company_file(EXAMPLE_COMPANY, given=False)
    assert (done.outcome, done.serving) == (FILE_NOT_GIVEN, mine.serving)
    assert ConfigRevision.objects.count() == 1


def test_a_bad_instruction_file_at_start_stores_nothing(tmp_path: Path) -> None:
    path = write(tmp_path)
    (tmp_path / "ada.md").unlink()
    with pytest.raises(CompanyError) as info:
        revisions.import_company_file(path)
    assert str(info.value).startswith("seats[0].instructions_file='ada.md': cannot be read (No such file or directory")
    assert not ConfigRevision.objects.exists()


def staff() -> Client:
    from django.contrib.auth import get_user_model

    c = Client()
    c.force_login(get_user_model().objects.create_superuser("grace-admin", password="pw"))
    return c


def test_the_admin_form_takes_the_included_files_and_the_change_page_diffs_them(tmp_path: Path) -> None:
    active = revisions.create_revision(COMPANY, "ops", files={"ada.md": "Own the deploy.\n"})
    activation.activate(active.pk, "ops")
    c = staff()
    form = c.get("/admin/crewlet/configrevision/add/").content.decode()
    assert "ada.md: |" in form and "Own the deploy." in form  # prefilled with the active revision's files

    missing = c.post("/admin/crewlet/configrevision/add/", {"yaml_text": COMPANY, "included": "", "note": "x"})
    assert missing.context["adminform"].form.errors["yaml_text"] == [
        "seats[0].instructions_file='ada.md': is not among the revision's included files (none)"
    ]
    posted = {"yaml_text": COMPANY, "included": "ada.md: |\n  Own the deploy.\n  Never on Fridays.\nunused.md: x\n", "note": "fri"}
    assert c.post("/admin/crewlet/configrevision/add/", posted, follow=True).status_code == 200
    new = ConfigRevision.objects.get(note="fri")
    assert new.included_files == {"ada.md": "Own the deploy.\nNever on Fridays.\n"}  # only what the company includes

    page = c.get(f"/admin/crewlet/configrevision/{new.pk}/change/").content.decode()
    assert f"revision {active.pk} (active): ada.md" in page and "+Never on Fridays." in page
