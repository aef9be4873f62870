"""/api/seats/ routes (mounted by crewlet.urls before /api/). Operator token or staff session, like all of /api/."""
from __future__ import annotations

from django.urls import path

from seats import api
from seats.memory import api as memory_api

urlpatterns = [
    path("", api.SeatsView.as_view(), name="api-seats"),
    path("<str:handle>/pause", api.SeatPauseView.as_view(), name="api-seat-pause"),
    path("<str:handle>/resume", api.SeatResumeView.as_view(), name="api-seat-resume"),
    path("<str:handle>/steer", api.SeatSteerView.as_view(), name="api-seat-steer"),
    path("<str:handle>/memory", memory_api.SeatMemoryView.as_view(), name="api-seat-memory"),
]
