"""eventstore: event rows, publish-listener writer, retention, REST API, /ws/stream, live projection, fleet reads (routed to the events database)."""
from __future__ import annotations

from django.apps import AppConfig


class EventStoreConfig(AppConfig):
    name = "eventstore"
