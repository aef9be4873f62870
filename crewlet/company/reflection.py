"""A seat's post-turn reflection mode (``seats[].reflection``), read from the company file.

Beside the other per-key readers of the company file (:mod:`crewlet.company.episodes`,
:mod:`crewlet.company.thread_bounds`), so :mod:`crewlet.company.parse` stays the order of the steps.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

from crewlet.company.org import REFLECTION_MODES, REFLECTION_OFF, REFLECTION_ON
from crewlet.company.refusal import one_of

#: A seat's post-turn reflection mode, and the ``providers`` entry naming the chain reflections call.
REFLECTION_KEY = "reflection"
REFLECTION_RULE = f"must be one of {', '.join(REFLECTION_MODES)}"


def _mode_of_boolean(value: Any) -> Any:
    """YAML reads an unquoted ``on``/``off`` as a boolean, which means the mode of that name."""
    return {True: REFLECTION_ON, False: REFLECTION_OFF}[value] if isinstance(value, bool) else value


#: ``seats[].reflection``'s type: one of :data:`~crewlet.company.org.REFLECTION_MODES`, ``on``/``off`` read as YAML booleans too.
ReflectionMode = Annotated[str, BeforeValidator(_mode_of_boolean), one_of(*REFLECTION_MODES)]


__all__ = ["REFLECTION_KEY", "REFLECTION_RULE", "ReflectionMode"]
