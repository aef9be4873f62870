"""Schedules' first sightings and the token-usage counters, squashed from ``0004_schedule_seen`` and ``0005_token_usage`` (docs/architecture.md, Migrations)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    replaces = [('seats', '0004_schedule_seen'), ('seats', '0005_token_usage')]

    dependencies = [
        ('seats', '0003_operator_token_moves_to_crewlet'),
    ]

    operations = [
        migrations.CreateModel(
            name='ScheduleSeen',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('schedule', models.CharField(max_length=200)),
                ('cadence', models.CharField(max_length=300)),
                ('first_seen_ms', models.BigIntegerField()),
            ],
            options={
                'db_table': 'seats_schedule_seen',
                'constraints': [models.UniqueConstraint(fields=('schedule', 'cadence'), name='seats_schedule_seen_uniq')],
            },
        ),
        migrations.CreateModel(
            name='TokenUsage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scope', models.CharField(max_length=80)),
                ('period', models.CharField(max_length=8)),
                ('window', models.CharField(max_length=16)),
                ('tokens', models.BigIntegerField(default=0)),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'token usage window',
                'db_table': 'seats_token_usage',
                'constraints': [models.UniqueConstraint(fields=('scope', 'period', 'window'), name='seats_token_usage_window')],
            },
        ),
    ]
