"""The notifications app's tables, squashed from ``0001_initial`` and ``0002_source_token`` (docs/architecture.md, Migrations)."""
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    replaces = [('notifications', '0001_initial'), ('notifications', '0002_source_token')]

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='SeenDelivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=400, unique=True)),
                ('event_id', models.CharField(max_length=64)),
                ('seen_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
            options={
                'db_table': 'notifications_seen_delivery',
            },
        ),
        migrations.CreateModel(
            name='RateCounter',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seat', models.CharField(max_length=63)),
                ('window_start', models.BigIntegerField()),
                ('count', models.IntegerField(default=0)),
            ],
            options={
                'db_table': 'notifications_rate_counter',
                'indexes': [models.Index(fields=['window_start'], name='notifications_rate_window_idx')],
                'constraints': [models.UniqueConstraint(fields=('seat', 'window_start'), name='notifications_rate_seat_window_uniq')],
            },
        ),
        migrations.CreateModel(
            name='ThreadFollow',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seat', models.CharField(max_length=63)),
                ('conversation', models.CharField(max_length=512)),
                ('source', models.CharField(blank=True, default='', max_length=32)),
                ('followed_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_woken_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
            options={
                'db_table': 'notifications_thread_follow',
                'indexes': [models.Index(fields=['conversation'], name='notifications_follow_conv_idx')],
                'constraints': [models.UniqueConstraint(fields=('seat', 'conversation'), name='notifications_follow_seat_conv_uniq')],
            },
        ),
        migrations.CreateModel(
            name='SourceToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('token_hash', models.CharField(max_length=64, unique=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('seat', models.CharField(max_length=63, unique=True)),
            ],
            options={
                'db_table': 'notifications_source_token',
            },
        ),
    ]
