from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.engine.services import Service


class NotificationsConfig(AppConfig):
    name = "notifications"

    def engine_services(self, engine: "Engine") -> list["Service"]:
        """The webhook edge, the router into seat inboxes and the hourly prune."""
        from notifications import runtime

        return runtime.services(engine)
