"""A seat's post-turn reflection mode (``seats[].reflection``), read from the company file.

Beside the other per-key readers of the company file (:mod:`crewlet.company.episodes`,
:mod:`crewlet.company.thread_bounds`), so :mod:`crewlet.company.parse` stays the order of the steps.
"""
from __future__ import annotations

from typing import Any, Optional

from crewlet.company.fields import CompanyError
from crewlet.company.org import REFLECTION_MODES, REFLECTION_OFF, REFLECTION_ON

#: A seat's post-turn reflection mode, and the ``providers`` entry naming the chain reflections call.
REFLECTION_KEY = "reflection"


def parse_reflection(value: Any, name: str, source: Optional[str]) -> str:
    """A mode; YAML reads an unquoted ``on``/``off`` as a boolean, which means the mode of that name."""
    value = {True: REFLECTION_ON, False: REFLECTION_OFF}.get(value, value) if isinstance(value, bool) else value
    if value not in REFLECTION_MODES:
        raise CompanyError(name, value, f"must be one of {', '.join(REFLECTION_MODES)}", source)
    return str(value)


__all__ = ["REFLECTION_KEY", "parse_reflection"]
