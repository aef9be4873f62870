"""The ``crewlet`` app: the project package itself, installed for its management commands and its models (config revisions, operator tokens)."""
from __future__ import annotations

from django.apps import AppConfig


class CrewletConfig(AppConfig):
    name = "crewlet"
    verbose_name = "Crewlet engine"

    def ready(self) -> None:
        from crewlet import schema  # noqa: F401  (registers the OpenAPI descriptions of the API's credentials)
