"""The generic source's per-seat tokens: ``notifications.models.SourceToken``, a ``crewlet.base.tokens.HashedToken``."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("notifications", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="SourceToken",
            fields=[("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                    ("token_hash", models.CharField(max_length=64, unique=True)),
                    ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                    ("last_used_at", models.DateTimeField(blank=True, null=True)),
                    ("seat", models.CharField(max_length=63, unique=True))],
            options={"db_table": "notifications_source_token"},
        ),
    ]
