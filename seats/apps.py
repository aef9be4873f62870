from __future__ import annotations

from django.apps import AppConfig


class SeatsConfig(AppConfig):
    name = "seats"
