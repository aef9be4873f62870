"""``manage.py up``: everything one node needs, in one process and one command.

In order: the data directory (``--data-dir``: the SQLite files and, unless
``--store-dir`` says otherwise, the embedded broker's JetStream directory),
migrations of both databases (``default`` and ``events``), the company
(``--company``: imported as a new active revision when it changed since its
last import, see :func:`crewlet.company.revisions.import_company_file`),
``CREWLET_OPERATOR_TOKEN``, then the engine — embedded broker,
event store writer, seat runtime (mailboxes, inbox loops, scheduler, sweeps),
notifications — with the ASGI app served by Daphne on ``--addr`` on the
engine's own loop (``crewlet.http.web``). ``Crewlet is up: <url> (node <id>)`` is
printed once the server listens and the seat loops run. SIGTERM/Ctrl-C stops
the web server first, then drains the loops, then stops the broker.

``--data-dir`` must be known before Django reads its settings: ``manage.py``
reads it from the command line and sets ``CREWLET_VAR_DIR`` first. Called any
other way (``call_command``), set ``CREWLET_VAR_DIR`` instead.
"""
from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError

from crewlet.engine import activation
from crewlet.http import web
from crewlet.company.conf import SettingsError
from crewlet.company.loading import load_settings
from crewlet.engine.core import Engine
from crewlet.engine.services import Service
from crewlet.engine.interfaces import WEB
from crewlet.management.commands.runconsumers import Command as RunConsumersCommand

DEFAULT_ADDR = "127.0.0.1:8000"
DATABASES = ("default", "events")


class Command(RunConsumersCommand):
    help = (
        "Run Crewlet on this machine in one process: migrations, the embedded broker, every loop and duty, "
        "and the web server, until SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--data-dir",
            help="where the SQLite files, the secret key and the broker's store live "
            "(default: CREWLET_VAR_DIR, else var/ in the repository)",
        )
        parser.add_argument("--addr", default=DEFAULT_ADDR, help=f"host:port the web server listens on (default {DEFAULT_ADDR}; port 0 picks one)")

    def data_dir(self, options: dict[str, Any]) -> Path:
        var_dir = Path(django_settings.VAR_DIR).resolve()
        wanted = options.get("data_dir")
        if wanted and Path(wanted).resolve() != var_dir:
            raise CommandError(
                f"--data-dir={wanted!r}: Django's settings already use {var_dir}; "
                "pass --data-dir to manage.py up on the command line, or set CREWLET_VAR_DIR"
            )
        return var_dir

    def settings_overrides(self, options: dict[str, Any]) -> dict[str, Any]:
        overrides = super().settings_overrides(options)
        if options.get("store_dir") is None:
            try:
                configured = load_settings(overrides=overrides)
                # A leaf keeps no streams (the members do): it is given no store.
                wanted = configured.stream.type == "embedded" and not configured.stream.store_dir and not configured.stream.leaf.enabled
            except SettingsError as exc:
                if exc.field != "stream.store_dir":
                    raise CommandError(str(exc)) from None
                wanted = True  # a clustered member needs a store: the one up gives it anyway
            if wanted:
                # A laptop's mailboxes survive a restart: the broker's store sits with the databases.
                overrides["stream.store_dir"] = str(self.data_dir(options) / "jetstream")
        return overrides

    def engine(self, options: dict[str, Any]) -> Engine:
        try:
            host, port = web.parse_addr(options.get("addr") or DEFAULT_ADDR)
        except web.AddressError as exc:
            raise CommandError(str(exc)) from None
        engine = super().engine(options)

        async def announce(bound: tuple[str, int]) -> None:
            # The web server starts after every other service: the seat loops already run.
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            self.stdout.write(f"Crewlet is up: http://{shown}:{bound[1]}/ (node {engine.settings.node.id})")
            self.stdout.flush()

        def application() -> Any:
            from crewlet.asgi import application, with_static_files

            return with_static_files(application)

        engine.add(
            Service(
                WEB,
                web.service(application, host, port, announce),
                depends_on=tuple(s.name for s in engine.registered),
                stop_first=True,
            )
        )
        return engine

    def migrate(self) -> None:
        from django.db import connections

        for alias in DATABASES:
            call_command("migrate", database=alias, interactive=False, verbosity=0)
        connections.close_all()  # the engine's threads open their own

    def import_company(self, options: dict[str, Any]) -> Any:
        """The company file becomes the active revision unless it says nothing new or an admin's activation stands.

        What happens and why is :func:`crewlet.company.revisions.import_company_file`'s
        (and its one log line); the activation it made, if any, to be announced once the engine runs.
        """
        from crewlet.company.fields import CompanyError
        from crewlet.company.parse import EXAMPLE_COMPANY
        from crewlet.company.revisions import import_company_file

        given = options.get("company")
        try:
            return import_company_file(given or EXAMPLE_COMPANY, author="up", given=bool(given)).activation
        except CompanyError as exc:
            raise CommandError(str(exc)) from None

    def hint_staff_user(self, data_dir: Path) -> None:
        """The dashboard needs a staff account to sign in with; say how to make one when there is none."""
        from django.contrib.auth import get_user_model
        from django.db import connections

        if not get_user_model().objects.filter(is_staff=True, is_active=True).exists():
            self.stdout.write(
                "No staff user yet: to sign in to the dashboard, run "
                f"`CREWLET_VAR_DIR={data_dir} .venv/bin/python manage.py createsuperuser`."
            )
        connections.close_all()

    def handle(self, *args: Any, **options: Any) -> None:
        data_dir = self.data_dir(options)
        engine = self.engine(options)
        self.migrate()
        self.seed_operator_token()
        imported = self.import_company(options)
        if imported is not None:
            activation.announce_at_start(engine, imported)
        self.adopt_active_revision()
        self.hint_staff_user(data_dir)
        self.stdout.write(
            f"Crewlet node {engine.settings.node.id} starting "
            f"({engine.settings.stream.type} broker, data in {data_dir}); SIGTERM or Ctrl-C stops it."
        )
        self.run(engine)
