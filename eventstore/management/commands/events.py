"""``manage.py events [--follow]``: a node's latest events, one line each, then (``--follow``) its live feed.

Thin: the calls are :mod:`eventstore.opsclient`'s, against ``--url`` with an operator token.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from eventstore import opsclient


#: Said on stderr once the live feed is open and the latest page printed: what follows on stdout is live.
FOLLOWING = "following the live feed of {url} (Ctrl-C stops)"


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # a client of a node over HTTP: nothing of this install is used
    help = "Print a node's latest events (GET /api/events), oldest first; --follow keeps printing its live feed (/ws/stream)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        opsclient.add_node_arguments(parser)
        parser.add_argument("--follow", "-f", action="store_true", help="after the page, print each event as it happens")
        parser.add_argument("--limit", type=int, default=opsclient.DEFAULT_LIMIT, help="events in the latest page (1 to 500)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            node = opsclient.node_from(options)
            if options["follow"]:
                opsclient.follow(node, options["limit"], emit=self._line, ready=lambda: self.stderr.write(FOLLOWING.format(url=node.base)))
                return
            for row in opsclient.latest_events(node, options["limit"]):
                self._line(opsclient.event_line(row))
        except opsclient.OpsError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            return

    def _line(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
