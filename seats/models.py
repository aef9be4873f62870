"""Coordination-store models of the seats app: the rows behind seat delivery (:mod:`seats.delivery_models`).

Operator tokens, which every app's routes accept, are the core's
(:mod:`crewlet.base.tokens`); their table kept its name when they moved.
"""
from __future__ import annotations

from seats.delivery_models import *  # noqa: F401,F403
from seats.budget_models import *  # noqa: F401,F403,E402
from seats.episode_models import *  # noqa: F401,F403,E402
