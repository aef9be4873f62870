"""A revision stores the files its company includes, and which company file ``up`` imported it from.

The revisions ``up`` imported before (author ``up``, note ``imported from <name>``)
are marked as imported from that name, so the first start after the upgrade
compares the file with the revision it was imported as, rather than taking
the active revision for an admin's.
"""
from __future__ import annotations

from typing import Any

from django.db import migrations, models

IMPORTED_NOTE = "imported from "


def mark_imported(apps: Any, schema_editor: Any) -> None:
    revisions = apps.get_model("crewlet", "ConfigRevision").objects.using(schema_editor.connection.alias)
    for revision in revisions.filter(author="up", note__startswith=IMPORTED_NOTE, imported_from=""):
        revision.imported_from = revision.note[len(IMPORTED_NOTE):][:500]
        revision.save(update_fields=["imported_from"])


class Migration(migrations.Migration):

    dependencies = [
        ('crewlet', '0003_fleet_leases'),
    ]

    operations = [
        migrations.AddField(
            model_name='configrevision',
            name='included_files',
            field=models.JSONField(blank=True, default=dict, help_text='The files the company includes, by path relative to the company file: their text.'),
        ),
        migrations.AddField(
            model_name='configrevision',
            name='imported_from',
            field=models.CharField(blank=True, default='', help_text='The company file this revision was imported from by up.', max_length=500),
        ),
        migrations.RunPython(mark_imported, migrations.RunPython.noop, hints={'model_name': 'configrevision'}),
    ]
