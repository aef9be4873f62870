"""The fleet's leases (node presence, seats, duties) in the coordination store, and the event store's identity row in ``events``."""
from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('crewlet', '0002_operator_token'),
    ]

    operations = [
        migrations.CreateModel(
            name='DutyLease',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('holder', models.CharField(blank=True, default='', max_length=63)),
                ('expires_at', models.DateTimeField(db_index=True)),
                ('acquired_at', models.DateTimeField()),
                ('epoch', models.BigIntegerField(default=0)),
            ],
            options={
                'verbose_name': 'duty lease',
                'db_table': 'crewlet_duty_lease',
            },
        ),
        migrations.CreateModel(
            name='NodeLease',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('holder', models.CharField(blank=True, default='', max_length=63)),
                ('expires_at', models.DateTimeField(db_index=True)),
                ('acquired_at', models.DateTimeField()),
                ('epoch', models.BigIntegerField(default=0)),
                ('labels', models.JSONField(blank=True, default=list)),
                ('protocol', models.IntegerField(default=0)),
                ('store', models.CharField(blank=True, default='', max_length=64)),
            ],
            options={
                'verbose_name': 'node lease',
                'db_table': 'crewlet_node_lease',
            },
        ),
        migrations.CreateModel(
            name='SeatLease',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('holder', models.CharField(blank=True, default='', max_length=63)),
                ('expires_at', models.DateTimeField(db_index=True)),
                ('acquired_at', models.DateTimeField()),
                ('epoch', models.BigIntegerField(default=0)),
            ],
            options={
                'verbose_name': 'seat lease',
                'db_table': 'crewlet_seat_lease',
            },
        ),
        migrations.CreateModel(
            name='StoreIdentity',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('identity', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'verbose_name': 'event store identity',
                'db_table': 'crewlet_store_identity',
            },
        ),
    ]
