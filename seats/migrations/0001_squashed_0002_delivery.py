"""The seats app's tables, squashed from ``0001_initial`` and ``0002_delivery`` (``manage.py squashmigrations``).

``replaces`` keeps every database that applied the two upgrading: Django
records this migration as applied there and never runs it again. The
operator token's table is created here as before; ``0003`` moves the model
to the core in the state only.
"""
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    replaces = [('seats', '0001_initial'), ('seats', '0002_delivery')]

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='OperatorToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('token_hash', models.CharField(max_length=64, unique=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'seats_operator_token',
            },
        ),
        migrations.CreateModel(
            name='SeatPause',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('handle', models.CharField(max_length=63, unique=True)),
                ('paused', models.BooleanField(default=False)),
                ('paused_by', models.CharField(blank=True, default='', max_length=200)),
                ('paused_by_seat', models.CharField(blank=True, default='', max_length=63)),
                ('reason', models.TextField(blank=True, default='')),
                ('stop_running', models.BooleanField(default=False)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('resumed_by', models.CharField(blank=True, default='', max_length=200)),
                ('resumed_at', models.DateTimeField(blank=True, null=True)),
                ('version', models.BigIntegerField(default=0)),
            ],
            options={
                'db_table': 'seats_seat_pause',
            },
        ),
        migrations.CreateModel(
            name='SeatRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('handle', models.CharField(max_length=63, unique=True)),
                ('kind', models.CharField(default='agent', max_length=16)),
                ('first_seen', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_active_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('absent_since', models.DateTimeField(blank=True, null=True)),
                ('retired_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'seats_seat_record',
            },
        ),
        migrations.CreateModel(
            name='LedgerEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seat', models.CharField(max_length=63)),
                ('trigger', models.CharField(max_length=255)),
                ('turn_id', models.CharField(max_length=64)),
                ('event_id', models.CharField(blank=True, default='', max_length=64)),
                ('worked_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
            options={
                'db_table': 'seats_ledger_entry',
                'constraints': [models.UniqueConstraint(fields=('seat', 'trigger'), name='seats_ledger_seat_trigger_uniq')],
            },
        ),
        migrations.CreateModel(
            name='ScheduleFiring',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('schedule', models.CharField(max_length=200)),
                ('slot', models.BigIntegerField()),
                ('seat', models.CharField(max_length=63)),
                ('task_event_id', models.CharField(max_length=64)),
                ('node', models.CharField(blank=True, default='', max_length=63)),
                ('fired_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                'db_table': 'seats_schedule_firing',
                'constraints': [models.UniqueConstraint(fields=('schedule', 'slot'), name='seats_schedule_slot_uniq')],
            },
        ),
    ]
