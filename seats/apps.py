from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.engine.services import Service
    from seats.hooks import TurnHooks


class SeatsConfig(AppConfig):
    name = "seats"

    def turn_hooks(self) -> "TurnHooks":
        """The chat working indicator around every turn (``seats.indicator``)."""
        from seats.hooks import TurnHooks
        from seats.indicator import working_indicator

        return TurnHooks.of(around_turn=[working_indicator])

    def engine_services(self, engine: "Engine") -> list["Service"]:
        """Each seat's MCP tool sessions, the working indicators, and the seat runtime: mailboxes, inbox loops, scheduler, retirement sweep, pause reconcile."""
        from seats import indicator, runtime_service
        from seats.tools import mcp

        return [*mcp.services(engine), *indicator.services(engine), *runtime_service.services(engine)]
