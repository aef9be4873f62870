"""The ``crewlet`` app: the project package itself, installed for its management commands and its models (config revisions, operator tokens)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.engine.services import Service


class CrewletConfig(AppConfig):
    name = "crewlet"
    verbose_name = "Crewlet engine"

    def ready(self) -> None:
        from crewlet.http import schema  # noqa: F401  (registers the OpenAPI descriptions of the API's credentials)

    def engine_services(self, engine: "Engine") -> list["Service"]:
        """This node's fleet membership (its leases) and its config-revision poller."""
        from crewlet.engine import activation
        from crewlet.fleet import member

        return [*member.services(engine), *activation.services(engine)]
