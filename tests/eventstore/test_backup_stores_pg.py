"""A PostgreSQL store's backup and restore: ``pg_dump`` of the node's database, ``pg_restore`` into an empty one.

The events test database gets a probe table with a committed row; the copy is
restored into a new, empty database beside it and the row is there. Restoring
into a database that already holds the tables is refused with pg_restore's
reason, not merged.
"""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from django.db import connections

from eventstore import backups

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["default", "events"], transaction=True)]


def _admin(sql: str) -> None:
    with connections["events"].cursor() as cursor:
        cursor.execute(sql)


def test_a_postgres_store_is_dumped_and_restored_into_an_empty_database_and_never_into_a_full_one(tmp_path: Path) -> None:
    conf = dict(connections["events"].settings_dict)
    restored_name = f"{conf['NAME']}_restored"
    _admin("CREATE TABLE backup_probe (v text)")
    _admin("INSERT INTO backup_probe VALUES ('kept')")
    _admin(f'DROP DATABASE IF EXISTS "{restored_name}" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{restored_name}"')
    try:
        entries = backups.copy_stores(tmp_path, {"events": conf})
        assert entries == [{"alias": "events", "engine": "postgres", "file": "stores/events.pgdump"}]
        manifest = json.loads(json.dumps({"stores": entries}))

        assert backups.restore_stores(tmp_path, manifest, {"events": {**conf, "NAME": restored_name}}) == ["events"]
        with psycopg.connect(
            host=conf["HOST"], port=conf["PORT"] or 5432, user=conf["USER"], password=conf["PASSWORD"], dbname=restored_name,
        ) as restored:
            assert restored.execute("SELECT v FROM backup_probe").fetchall() == [("kept",)]

        with pytest.raises(backups.BackupFailed, match="pg_restore into the events database failed"):
            backups.restore_stores(tmp_path, manifest, {"events": conf})
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{restored_name}" WITH (FORCE)')
        _admin("DROP TABLE IF EXISTS backup_probe")
