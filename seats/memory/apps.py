from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from seats.hooks import TurnHooks


class SeatMemoryConfig(AppConfig):
    name = "seats.memory"
    label = "seats_memory"
    default_auto_field = "django.db.models.BigAutoField"

    def turn_hooks(self) -> "TurnHooks":
        """The ``memory`` built-ins a seat is granted by naming ``memory`` in its ``tools``; a completed turn handed to reflection."""
        from seats.hooks import TurnHooks
        from seats.memory.reflection import hand_to_reflection
        from seats.memory.tools import MEMORY_TOOLS

        return TurnHooks.of(builtin_tools=MEMORY_TOOLS, after_turn=[hand_to_reflection])
