"""``manage.py runconsumers``: run this node's engine (queue, consumers, duties) until SIGTERM/SIGINT."""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from crewlet.conf import STREAM_TYPES, SettingsError, load_settings
from crewlet.engine import Engine

#: Command-line flag -> dotted setting it overrides (flags win over env and the settings file).
FLAG_SETTINGS = {
    "store_dir": "stream.store_dir",
    "node": "node.id",
    "stream_type": "stream.type",
    "stream_url": "stream.url",
}


class Command(BaseCommand):
    help = "Run the engine for this node: connect the queue and run its consumers until SIGTERM/SIGINT."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--store-dir", help="stream.store_dir: the embedded broker's JetStream directory (empty = in memory)")
        parser.add_argument("--node", help="node.id: this node's id (default: CREWLET_NODE_ID, else from the hostname)")
        parser.add_argument("--stream-type", choices=STREAM_TYPES, help="stream.type: embedded (default) or nats")
        parser.add_argument("--stream-url", help="stream.url: nats://host:port to dial when --stream-type nats")

    def engine(self, options: dict[str, Any]) -> Engine:
        """The validated settings from file, env and flags, as an engine ready to run."""
        overrides = {dotted: options[flag] for flag, dotted in FLAG_SETTINGS.items() if options.get(flag) is not None}
        try:
            settings = load_settings(overrides=overrides)
        except SettingsError as exc:
            raise CommandError(str(exc)) from None
        engine = Engine(settings)
        import eventstore  # the store's writer and retention duty

        eventstore.install(engine)
        return engine

    def seed_operator_token(self) -> None:
        """CREWLET_OPERATOR_TOKEN, when set, becomes an operator token before anything serves."""
        from django.db import DatabaseError

        from eventstore.auth import seed_operator_token_from_env

        try:
            seed_operator_token_from_env()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"could not store CREWLET_OPERATOR_TOKEN ({exc}); run manage.py migrate first") from None

    def handle(self, *args: Any, **options: Any) -> None:
        engine = self.engine(options)
        self.seed_operator_token()
        self.stdout.write(
            f"Crewlet node {engine.settings.node.id} starting "
            f"({engine.settings.stream.type} broker); SIGTERM or Ctrl-C stops it."
        )
        status = engine.run()
        if status != 0:
            raise CommandError("the engine stopped after an error (see the log above)", returncode=status)
