"""The operator token joins the core, in the state only: its table, ``seats_operator_token``, stays as it is.

``seats`` 0001 (since squashed with 0002) created the table; ``seats`` 0003 drops the model from that
app's state after this adds it here, so a database migrated before keeps
every token, and a fresh one gets the table from ``seats`` 0001 (squashed) as before.
The admin's permissions follow the model: its content type is relabelled.
"""
from __future__ import annotations

from typing import Any

import django.utils.timezone
from django.db import migrations, models

MODEL = "operatortoken"


def _relabel(apps: Any, schema_editor: Any, old: str, new: str) -> None:
    """Move the model's content type (and with it the admin permissions) from app ``old`` to ``new``."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    if ContentType.objects.using(db).filter(app_label=new, model=MODEL).exists():
        return  # already there (post_migrate made it): the old one is left as a stale type
    ContentType.objects.using(db).filter(app_label=old, model=MODEL).update(app_label=new)


def forwards(apps: Any, schema_editor: Any) -> None:
    _relabel(apps, schema_editor, "seats", "crewlet")


def backwards(apps: Any, schema_editor: Any) -> None:
    _relabel(apps, schema_editor, "crewlet", "seats")


class Migration(migrations.Migration):

    dependencies = [
        ("crewlet", "0001_initial"),
        ("seats", "0001_squashed_0002_delivery"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="OperatorToken",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=100, unique=True)),
                        ("token_hash", models.CharField(max_length=64, unique=True)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={"db_table": "seats_operator_token"},
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
