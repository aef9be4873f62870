"""Conversation sessions' episodes: one row per turn a seat worked on a conversation, read back by its next turn."""
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('seats', '0005_token_usage'),
    ]

    operations = [
        migrations.CreateModel(
            name='Episode',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('episode_id', models.CharField(max_length=36, unique=True)),
                ('seat', models.CharField(max_length=63)),
                ('conversation', models.CharField(max_length=1000)),
                ('turn_id', models.CharField(max_length=64)),
                ('asked', models.TextField(blank=True, default='')),
                ('answered', models.TextField(blank=True, default='')),
                ('tools', models.JSONField(blank=True, default=list)),
                ('outcome', models.CharField(max_length=16)),
                ('error', models.TextField(blank=True, default='')),
                ('written_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                'db_table': 'seats_episode',
                'indexes': [models.Index(fields=['seat', 'conversation', 'written_at'], name='seats_episode_conversation'), models.Index(fields=['seat', 'written_at'], name='seats_episode_seat')],
            },
        ),
    ]
