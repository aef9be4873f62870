"""Django's wiring: the system checks pass, every app is installed, the router keeps each app in its database, and the two databases are what the settings say."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections, router
from django.db.utils import ConnectionHandler

from crewlet import settings as crewlet_settings


def test_django_system_checks_pass() -> None:
    call_command("check", fail_level="WARNING")


@pytest.mark.django_db(databases=["default", "events"])
def test_django_database_checks_pass() -> None:
    call_command("check", databases=["default", "events"], fail_level="WARNING")


def test_every_app_is_installed() -> None:
    from django.apps import apps

    labels = {app.label for app in apps.get_app_configs()}
    assert {"admin", "auth", "contenttypes", "sessions", "messages", "staticfiles"} <= labels
    assert {"crewlet", "seats", "notifications", "eventstore", "a2a"} <= labels


def _model(app_label: str) -> Any:
    return SimpleNamespace(_meta=SimpleNamespace(app_label=app_label))


def test_router_sends_eventstore_to_events() -> None:
    assert router.db_for_read(_model("eventstore")) == "events"
    assert router.db_for_write(_model("eventstore")) == "events"
    for label in ("seats", "notifications", "a2a", "auth"):
        assert router.db_for_write(_model(label)) == "default"
        assert router.db_for_read(_model(label)) == "default"


def test_router_keeps_each_app_in_one_database() -> None:
    assert router.allow_migrate("events", "eventstore") is True
    assert router.allow_migrate("default", "eventstore") is False
    for label in ("seats", "notifications", "a2a", "auth", "contenttypes"):
        assert router.allow_migrate("default", label) is True
        assert router.allow_migrate("events", label) is False
    assert router.allow_relation(_model("eventstore"), _model("seats")) is False
    assert router.allow_relation(_model("seats"), _model("a2a")) is True


@pytest.mark.django_db(databases=["default", "events"])
def test_migrations_follow_the_router() -> None:
    default_tables = set(connections["default"].introspection.table_names())
    events_tables = set(connections["events"].introspection.table_names())
    assert {"auth_user", "django_session", "django_migrations"} <= default_tables
    assert "eventstore_event" in events_tables and "eventstore_event" not in default_tables
    # The events database holds the event store, the one row naming that store and the memory of the seats the
    # node holds (with its search table on SQLite), nothing of the coordination store.
    own = {"django_migrations", "crewlet_store_identity"}
    assert all(t in own or t.startswith(("eventstore_", "seats_memory_")) for t in events_tables), events_tables
    assert "seats_memory_row" in events_tables and "seats_memory_row" not in default_tables
    assert "crewlet_store_identity" not in default_tables and "crewlet_seat_lease" in default_tables


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default", "events"])
def test_the_test_databases_are_two_postgresql_databases() -> None:
    assert os.environ.get("CREWLET_DATABASE") == "postgres"
    names = {}
    for alias in ("default", "events"):
        conn = connections[alias]
        assert conn.vendor == "postgresql"
        with conn.cursor() as cursor:
            cursor.execute("select current_database()")
            names[alias] = cursor.fetchone()[0]
    # bin/test's defaults, or the names CREWLET_PG_DBNAME / CREWLET_PG_EVENTS_DBNAME give (a pytest-xdist
    # worker's carry its id: tests/conftest.py).
    expected = {
        "default": "test_" + (os.environ.get("CREWLET_PG_DBNAME") or "crewlet"),
        "events": "test_" + (os.environ.get("CREWLET_PG_EVENTS_DBNAME") or "crewlet_events"),
    }
    assert names == expected


def test_solo_default_is_two_sqlite_files_in_wal_mode(tmp_path: Path, django_db_blocker: Any) -> None:
    # Real connections built from the solo settings, outside the test databases.
    handler = ConnectionHandler(crewlet_settings.database_settings({}, tmp_path))
    with django_db_blocker.unblock():
        files = set()
        for alias in ("default", "events"):
            conn = handler[alias]
            assert conn.vendor == "sqlite"
            with conn.cursor() as cursor:
                cursor.execute("PRAGMA journal_mode")
                assert cursor.fetchone()[0] == "wal"
                cursor.execute("PRAGMA busy_timeout")
                assert cursor.fetchone()[0] == 20000
            files.add(Path(conn.settings_dict["NAME"]))
        assert files == {tmp_path / "crewlet.sqlite3", tmp_path / "events.sqlite3"}
        assert all(f.exists() for f in files)
        handler.close_all()


def test_postgres_settings_from_env(tmp_path: Path) -> None:
    dbs = crewlet_settings.database_settings(
        {"CREWLET_DATABASE": "postgres", "CREWLET_PG_PORT": "5433", "CREWLET_PG_DBNAME": "co"}, tmp_path
    )
    assert dbs["default"]["ENGINE"] == dbs["events"]["ENGINE"] == "django.db.backends.postgresql"
    assert (dbs["default"]["HOST"], dbs["default"]["PORT"]) == ("/var/run/postgresql", "5433")
    assert (dbs["default"]["NAME"], dbs["events"]["NAME"]) == ("co", "crewlet_events")
    assert dbs["default"]["TEST"]["NAME"] != dbs["events"]["TEST"]["NAME"]
    with pytest.raises(ImproperlyConfigured, match="CREWLET_DATABASE='mysql'"):
        crewlet_settings.database_settings({"CREWLET_DATABASE": "mysql"}, tmp_path)


def test_router_keeps_the_event_store_identity_with_the_event_store_and_the_leases_with_the_fleet() -> None:
    from crewlet.models import SeatLease, StoreIdentity

    assert router.db_for_write(StoreIdentity) == "events"
    assert router.db_for_write(SeatLease) == "default"
    assert router.allow_migrate("events", "crewlet", model_name="storeidentity") is True
    assert router.allow_migrate("default", "crewlet", model_name="storeidentity") is False
    assert router.allow_migrate("events", "crewlet", model_name="seatlease") is False
