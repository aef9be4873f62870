"""a2a: channels, ask/answer, sweep."""
from __future__ import annotations

from django.apps import AppConfig


class A2AConfig(AppConfig):
    name = "a2a"

    def ready(self) -> None:
        """Put the answer-back hook on every inbox loop of this process."""
        from seats.hooks import register_after_turn

        from a2a.hooks import answer_after_turn

        register_after_turn(answer_after_turn)
