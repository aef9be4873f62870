"""When the fleet first saw each (schedule, cadence): a cron schedule fires no slot from before it existed."""
from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

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
    ]
