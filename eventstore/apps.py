"""eventstore: event rows, publish-listener writer, retention, REST API, /ws/stream, live projection, fleet reads (routed to the events database)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.engine.services import Service


class EventStoreConfig(AppConfig):
    name = "eventstore"

    def engine_services(self, engine: "Engine") -> list["Service"]:
        """The store's writer, its retention sweep and the live projection."""
        from eventstore import services

        return services.services(engine)
