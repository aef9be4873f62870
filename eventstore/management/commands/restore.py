"""``manage.py restore DIR``: put a backup back into this install's (stopped, empty) data directory.

Thin: the work is :func:`eventstore.backups.restore_backup` — the stores back
where this install's settings place them, then every stream restored into a
broker of its own on the store directory (``--store-dir``, default the data
directory's ``jetstream/`` as ``up`` uses it). Start ``up`` afterwards.
"""
from __future__ import annotations

import asyncio
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from crewlet.queue.errors import QueueError
from eventstore import backups


class Command(BaseCommand):
    requires_system_checks: list[str] = []
    help = "Restore a backup made by `manage.py backup` / POST /backup into this install's stopped, empty data directory."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("dir", help="the backup's directory (absolute)")
        parser.add_argument(
            "--store-dir", default=None,
            help="the embedded broker's store to restore the streams into (default: <data dir>/jetstream, as up uses)",
        )
        parser.add_argument(
            "--nats-url", default="",
            help="restore the streams into this external NATS server instead (stream.type nats; it must not hold them yet)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        store_dir = Path(options["store_dir"] or Path(settings.VAR_DIR) / "jetstream").absolute()
        try:
            streams, stores = asyncio.run(backups.restore_backup(options["dir"], store_dir, nats_url=options["nats_url"]))
        except (backups.BackupRefused, backups.BackupFailed, QueueError, OSError) as exc:
            raise CommandError(f"restore refused: {exc}" if isinstance(exc, backups.BackupRefused) else f"restore failed: {exc}") from None
        self.stdout.write(
            f"restored {streams} stream{'s' if streams != 1 else ''} and the {', '.join(stores) or 'no'} "
            f"database{'s' if len(stores) != 1 else ''} from {options['dir']}; start the node with `manage.py up`"
        )
