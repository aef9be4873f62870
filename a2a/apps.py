from __future__ import annotations

from django.apps import AppConfig


class A2AConfig(AppConfig):
    name = "a2a"
