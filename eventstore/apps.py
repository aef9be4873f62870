from __future__ import annotations

from django.apps import AppConfig


class EventStoreConfig(AppConfig):
    name = "eventstore"
