"""a2a: channels, ask/answer, sweep."""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine, Service


class A2AConfig(AppConfig):
    name = "a2a"

    def ready(self) -> None:
        """Put the answer-back hook on every inbox loop of this process, and offer turns ``a2a_ask``."""
        from seats.hooks import register_after_turn, register_builtin_tool

        from a2a.hooks import A2A_ASK, answer_after_turn

        register_after_turn(answer_after_turn)
        register_builtin_tool(A2A_ASK)

    def engine_services(self, engine: "Engine") -> list["Service"]:
        """The A2A channel sweep (idle close, closed-record deletion)."""
        from a2a import runtime

        return runtime.engine_services(engine)
