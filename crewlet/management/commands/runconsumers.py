"""``manage.py runconsumers``: run this node's engine (queue, consume loops, duties) until SIGTERM/SIGINT.

For a fleet (``stream.type: nats``): no migrations and no web server — ``up``
is the one-process, one-command version of the same engine.
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from crewlet.company.capacity import check_fits
from crewlet.company.conf import STREAM_TYPES, SettingsError
from crewlet.company.loading import load_settings
from crewlet.engine.core import Engine, app_services
from crewlet.company.fields import CompanyError
from crewlet.company.org import CompanyHolder
from crewlet.company.parse import EXAMPLE_COMPANY, load_company
from crewlet.queue.topics import DEFAULT_MAX_CONSUMERS

#: Command-line flag -> dotted setting it overrides (flags win over env and the settings file).
FLAG_SETTINGS = {
    "store_dir": "stream.store_dir",
    "node": "node.id",
    "stream_type": "stream.type",
    "stream_url": "stream.url",
}


class Command(BaseCommand):
    help = "Run the engine for this node: connect the queue and run its consumers until SIGTERM/SIGINT."
    #: ``stream.max_consumers`` the company is checked against: the setting's default until :meth:`engine` reads the settings.
    max_consumers: int = DEFAULT_MAX_CONSUMERS

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--store-dir", help="stream.store_dir: the embedded broker's JetStream directory (empty = in memory)")
        parser.add_argument("--node", help="node.id: this node's id (default: CREWLET_NODE_ID, else from the hostname)")
        parser.add_argument("--stream-type", choices=STREAM_TYPES, help="stream.type: embedded (default) or nats")
        parser.add_argument("--stream-url", help="stream.url: nats://host:port to dial when --stream-type nats")
        parser.add_argument("--company", help=f"the company file (YAML; default: the example company, {EXAMPLE_COMPANY.name})")

    def settings_overrides(self, options: dict[str, Any]) -> dict[str, Any]:
        return {dotted: options[flag] for flag, dotted in FLAG_SETTINGS.items() if options.get(flag) is not None}

    def company(self, options: dict[str, Any]) -> CompanyHolder:
        """The company file, validated; a bad one is a one-line command error naming the field."""
        path = options.get("company") or EXAMPLE_COMPANY
        try:
            return CompanyHolder(load_company(path))
        except CompanyError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"--company={str(path)!r}: cannot be read ({exc.strerror or exc})") from None

    def engine(self, options: dict[str, Any]) -> Engine:
        """The validated settings from file, env and flags, as an engine with every installed app's services."""
        try:
            settings = load_settings(overrides=self.settings_overrides(options))
        except SettingsError as exc:
            raise CommandError(str(exc)) from None
        if not settings.node.data and connections["default"].vendor == "sqlite":
            raise CommandError(
                "node.data=false: a stateless node needs a coordination store the fleet shares "
                "(CREWLET_DATABASE=postgres), where the data nodes that keep its events are; "
                "this node's is a SQLite file of its own"
            )
        holder = self.company(options)
        self.holder = holder
        self.max_consumers = settings.stream.max_consumers
        self.check_fits()
        engine = Engine(settings, company=holder, timings=settings.timings())
        for service in app_services(engine):
            engine.add(service)
        return engine

    def seed_operator_token(self) -> None:
        """CREWLET_OPERATOR_TOKEN, when set, becomes an operator token before anything serves."""
        from django.db import DatabaseError

        from crewlet.http.auth import seed_operator_token_from_env

        try:
            seed_operator_token_from_env()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"could not store CREWLET_OPERATOR_TOKEN ({exc}); run manage.py migrate first") from None

    def adopt_active_revision(self) -> None:
        """Serve the active config revision from the start when the store has one (else the file)."""
        from crewlet.company.revisions import adopt_active

        adopt_active(self.holder)
        self.check_fits()

    def check_fits(self) -> None:
        """Refuse, before anything starts, a company whose seats' mailboxes the broker would not all let exist.

        Asked of the company file (before ``up`` imports it as a revision) and
        again of the active revision the node adopts from the store.
        """
        try:
            check_fits(self.holder.current(), self.max_consumers)
        except SettingsError as exc:
            raise CommandError(f"the company does not fit: {exc}") from None

    def handle(self, *args: Any, **options: Any) -> None:
        engine = self.engine(options)
        self.seed_operator_token()
        self.adopt_active_revision()
        self.stdout.write(
            f"Crewlet node {engine.settings.node.id} starting "
            f"({engine.settings.stream.type} broker); SIGTERM or Ctrl-C stops it."
        )
        self.run(engine)

    def run(self, engine: Engine) -> None:
        status = engine.run()
        if engine.start_error is not None:
            reason = str(engine.start_error).splitlines()[0] if str(engine.start_error) else repr(engine.start_error)
            raise CommandError(f"the engine could not start: {reason}", returncode=status or 1)
        if status != 0:
            raise CommandError("the engine stopped after an error (see the log above)", returncode=status)

