"""The fleet's leases (node presence, seats, duties) in the coordination store, and the event store's identity row in ``events``."""
from __future__ import annotations

from django.db import migrations, models


def _lease_table(name: str, verbose_name: str, db_table: str, *extra: tuple[str, models.Field]) -> migrations.CreateModel:
    """A table of a ``crewlet.models.Lease`` subclass: the abstract base's columns, then the table's own."""
    return migrations.CreateModel(
        name=name,
        fields=[
            ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
            ('holder', models.CharField(blank=True, default='', max_length=63)),
            ('expires_at', models.DateTimeField(db_index=True)),
            ('acquired_at', models.DateTimeField()),
            ('epoch', models.BigIntegerField(default=0)),
            *extra,
        ],
        options={'verbose_name': verbose_name, 'db_table': db_table},
    )


class Migration(migrations.Migration):

    dependencies = [
        ('crewlet', '0002_operator_token'),
    ]

    operations = [
        _lease_table('DutyLease', 'duty lease', 'crewlet_duty_lease'),
        _lease_table(
            'NodeLease',
            'node lease',
            'crewlet_node_lease',
            ('labels', models.JSONField(blank=True, default=list)),
            ('protocol', models.IntegerField(default=0)),
            ('store', models.CharField(blank=True, default='', max_length=64)),
        ),
        _lease_table('SeatLease', 'seat lease', 'crewlet_seat_lease'),
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
