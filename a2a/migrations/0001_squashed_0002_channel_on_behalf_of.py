"""The a2a app's table, squashed from ``0001_initial`` and ``0002_channel_on_behalf_of`` (docs/architecture.md, Migrations)."""
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    replaces = [('a2a', '0001_initial'), ('a2a', '0002_channel_on_behalf_of')]

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Channel',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('asker', models.CharField(max_length=63)),
                ('target', models.CharField(max_length=63)),
                ('state', models.CharField(choices=[('open', 'open'), ('closed', 'closed')], default='open', max_length=8)),
                ('message_count', models.PositiveIntegerField(default=0)),
                ('brief', models.TextField(blank=True, default='')),
                ('opened_at', models.DateTimeField()),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('closed_by', models.CharField(blank=True, default='', max_length=63)),
                ('turn_id', models.CharField(blank=True, default='', max_length=64)),
                ('work_key', models.CharField(blank=True, default='', max_length=255)),
                ('asker_turn_id', models.CharField(blank=True, default='', max_length=64)),
                ('delegation_depth', models.PositiveIntegerField(default=0)),
                ('delegation_chain', models.JSONField(blank=True, default=list)),
                ('on_behalf_of', models.UUIDField(blank=True, null=True)),
            ],
            options={
                'db_table': 'a2a_channel',
                'ordering': ['-opened_at'],
                'indexes': [models.Index(fields=['state', 'opened_at'], name='a2a_channel_state_opened'), models.Index(fields=['state', 'closed_at'], name='a2a_channel_state_closed'), models.Index(fields=['on_behalf_of', 'asker_turn_id'], name='a2a_channel_behalf')],
            },
        ),
    ]
