"""``manage.py backup DIR``: ask a running node for a backup into DIR on its disk (``POST /backup``).

Thin: the call is :func:`eventstore.opsclient.backup`, against ``--url`` with
an operator token; the node copies its streams and stores and records
``backup_requested``. ``manage.py restore DIR`` puts a backup back.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from eventstore import opsclient


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # a client of a node over HTTP: nothing of this install is used
    help = "Back a running node up into DIR (an absolute, new or empty directory on the node's disk): its streams and stores."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("dir", help="an absolute path on the node's disk: a new or empty directory")
        opsclient.add_node_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            answer = opsclient.backup(opsclient.node_from(options), options["dir"])
        except opsclient.OpsError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(opsclient.backed_up_line(answer))
