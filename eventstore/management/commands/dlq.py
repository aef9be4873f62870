"""``manage.py dlq list`` / ``manage.py dlq replay REF``: a node's dead letters, and putting one back.

Thin: the calls are :mod:`eventstore.opsclient`'s, against ``--url`` with an
operator token; a replay goes through ``/operator/act`` and is audited there.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from eventstore import opsclient


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # a client of a node over HTTP: nothing of this install is used
    help = "List what sits on a node's CREWLET_DLQ (oldest first: ref, topic, deliveries, type, event id, summary), or replay one by its ref."

    def add_arguments(self, parser: ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{list,replay}")
        listing = actions.add_parser("list", help="one line per dead letter")
        opsclient.add_node_arguments(listing)
        again = actions.add_parser("replay", help="publish one back onto the topic it was dead-lettered from")
        again.add_argument("ref", help="the dead letter's ref, as `dlq list` prints it first")
        opsclient.add_node_arguments(again)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            node = opsclient.node_from(options)
            if options["action"] == "replay":
                answer = opsclient.replay(node, options["ref"])
                self.stdout.write(opsclient.replayed_line(options["ref"], answer))
                return
            letters = opsclient.dead_letters(node)
            for row in letters:
                self.stdout.write(opsclient.dead_letter_line(row))
            if not letters:
                self.stderr.write("no dead letters")
        except opsclient.OpsError as exc:
            raise CommandError(str(exc)) from None
