"""The PostgreSQL databases a benchmark runs Django against, shared by the benchmarks that need them.

Each benchmark names its own pair of databases so that two benchmarks (or a
benchmark and the test suite) never share rows; how to reach the server and
how to point Django at a pair is the same for every one of them.
"""

from __future__ import annotations

import os
from typing import Any


def conninfo(dbname: str) -> dict[str, Any]:
    """psycopg connection keywords for ``dbname``, from the same CREWLET_PG_* variables the app reads."""
    info: dict[str, Any] = {"dbname": dbname, "host": os.environ.get("CREWLET_PG_HOST", "/var/run/postgresql")}
    for key, env in (("port", "CREWLET_PG_PORT"), ("user", "CREWLET_PG_USER"), ("password", "CREWLET_PG_PASSWORD")):
        if os.environ.get(env):
            info[key] = os.environ[env]
    return info


def admin(sql: str) -> None:
    """Run ``sql`` on the server's ``postgres`` database, autocommit (CREATE / DROP DATABASE)."""
    import psycopg

    with psycopg.connect(**conninfo("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def setup_django(default_db: str, events_db: str) -> None:
    """Start Django on PostgreSQL with the benchmark's two databases and migrate both."""
    os.environ["CREWLET_DATABASE"] = "postgres"
    os.environ["CREWLET_PG_DBNAME"] = default_db
    os.environ["CREWLET_PG_EVENTS_DBNAME"] = events_db
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")
    os.environ.setdefault("CREWLET_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("migrate", database="events", verbosity=0)
