"""The operator token leaves this app's state for the core's (``crewlet`` 0002); its table and rows stay."""
from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("seats", "0001_squashed_0002_delivery"),
        ("crewlet", "0002_operator_token"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="OperatorToken")],
            database_operations=[],
        ),
    ]
