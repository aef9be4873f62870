from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from seats.hooks import TurnHooks


class SeatSandboxConfig(AppConfig):
    name = "seats.sandbox"
    label = "seats_sandbox"
    default_auto_field = "django.db.models.BigAutoField"

    def turn_hooks(self) -> "TurnHooks":
        """The ``sandbox_run`` built-in, granted by naming it in a seat's ``tools``."""
        from seats.hooks import TurnHooks
        from seats.sandbox.tool import SANDBOX_TOOLS

        return TurnHooks.of(builtin_tools=SANDBOX_TOOLS)
