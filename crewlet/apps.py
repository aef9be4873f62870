"""The ``crewlet`` app: the project package itself, installed so its management commands are found."""
from __future__ import annotations

from django.apps import AppConfig


class CrewletConfig(AppConfig):
    name = "crewlet"
    verbose_name = "Crewlet engine"
