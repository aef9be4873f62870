"""The usage domain's token counters: one row per (scope, period, window) a seat or the company spent in."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('seats', '0004_schedule_seen'),
    ]

    operations = [
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
