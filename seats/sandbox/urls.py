"""/api/sandbox/ routes (mounted by crewlet.urls before /api/). Operator token or staff session, like all of /api/."""
from __future__ import annotations

from django.urls import path

from seats.sandbox import api

urlpatterns = [
    path("runs", api.RunsView.as_view(), name="api-sandbox-runs"),
    path("runs/<str:run_id>", api.RunView.as_view(), name="api-sandbox-run"),
    path("runs/<str:run_id>/answer", api.RunAnswerView.as_view(), name="api-sandbox-run-answer"),
]
