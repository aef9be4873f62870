"""The memory rows of the seats a node holds, and their full-text search: FTS5 on SQLite, a tsvector column on PostgreSQL."""
from __future__ import annotations

from typing import Any

from django.db import migrations, models

#: SQLite: an external-content FTS5 table over ``text``, kept by triggers (porter stemming, like PostgreSQL's english).
SQLITE_SEARCH = [
    "CREATE VIRTUAL TABLE seats_memory_fts USING fts5(text, content='seats_memory_row', content_rowid='id', tokenize='porter unicode61')",
    "CREATE TRIGGER seats_memory_row_ai AFTER INSERT ON seats_memory_row BEGIN "
    "INSERT INTO seats_memory_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER seats_memory_row_ad AFTER DELETE ON seats_memory_row BEGIN "
    "INSERT INTO seats_memory_fts(seats_memory_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER seats_memory_row_au AFTER UPDATE ON seats_memory_row BEGIN "
    "INSERT INTO seats_memory_fts(seats_memory_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO seats_memory_fts(rowid, text) VALUES (new.id, new.text); END",
]
#: PostgreSQL: the row's english tsvector kept in a generated column (ranking reads it rather than parsing the text
#: of every match again), under a GIN index.
POSTGRES_SEARCH = [
    "ALTER TABLE seats_memory_row ADD COLUMN search tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED",
    "CREATE INDEX seats_memory_row_search ON seats_memory_row USING GIN (search)",
]


def search_index(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    for sql in SQLITE_SEARCH if vendor == "sqlite" else POSTGRES_SEARCH if vendor == "postgresql" else []:
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='MemoryRow',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seat', models.CharField(max_length=200)),
                ('table', models.CharField(max_length=64)),
                ('key', models.CharField(max_length=200)),
                ('value', models.TextField(default='null')),
                ('text', models.TextField(default='')),
                ('deleted', models.BooleanField(default=False)),
                ('written_at', models.DateTimeField()),
                ('event_id', models.CharField(default='', max_length=64)),
                ('written_by', models.CharField(default='', max_length=32)),
                ('turn_id', models.CharField(default='', max_length=64)),
            ],
            options={
                'db_table': 'seats_memory_row',
                'indexes': [models.Index(fields=['seat', 'table'], name='seats_memory_row_seat_table')],
                'constraints': [models.UniqueConstraint(fields=('seat', 'table', 'key'), name='seats_memory_row_one_per_key')],
            },
        ),
        migrations.RunPython(search_index, migrations.RunPython.noop, hints={"model_name": "memoryrow"}),
    ]
