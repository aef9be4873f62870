"""a2a: channels, ask/answer, sweep."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.engine.services import Service
    from seats.hooks import TurnHooks


class A2AConfig(AppConfig):
    name = "a2a"

    def turn_hooks(self) -> "TurnHooks":
        """The answer-back hook after a completed turn, and the ``a2a_ask`` built-in turns offer (``seats.hooks``)."""
        from seats.hooks import TurnHooks

        from a2a.hooks import A2A_ASK, answer_after_turn

        return TurnHooks.of(after_turn=[answer_after_turn], builtin_tools=[A2A_ASK])

    def engine_services(self, engine: "Engine") -> list["Service"]:
        """The A2A channel sweep (idle close, closed-record deletion)."""
        from a2a import runtime

        return runtime.engine_services(engine)
