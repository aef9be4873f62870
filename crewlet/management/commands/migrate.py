"""``manage.py migrate`` (and ``up``, which runs it) under the fleet's migration lock.

Django's own command, unchanged but for :func:`crewlet.base.db.migration_lock`
around it: nodes starting together against one empty PostgreSQL
coordination store take turns instead of racing to create the same tables.
"""
from __future__ import annotations

from typing import Any

from django.core.management.commands import migrate

from crewlet.base.db import migration_lock


class Command(migrate.Command):
    def handle(self, *args: Any, **options: Any) -> None:
        with migration_lock():
            super().handle(*args, **options)
