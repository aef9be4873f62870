from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.engine.services import Service


class SeatsConfig(AppConfig):
    name = "seats"

    def engine_services(self, engine: "Engine") -> list["Service"]:
        """Each seat's MCP tool sessions, and the seat runtime: mailboxes, inbox loops, scheduler, retirement sweep, pause reconcile."""
        from seats import runtime
        from seats.tools import mcp

        return [*mcp.services(engine), *runtime.services(engine)]
