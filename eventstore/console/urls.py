"""The dashboard's pages, and the operator action its dead-letter page posts (mounted at the site root by crewlet.urls)."""
from __future__ import annotations

from django.urls import path

from eventstore.console import dashboard, screens
from eventstore.console.backup_views import BackupView
from eventstore.console.operator_views import OperatorActView
from eventstore.console.replay_views import BulkReplayView

urlpatterns = [
    path("", dashboard.overview, name="dash-overview"),
    path("login/", dashboard.LoginView.as_view(), name="dash-login"),
    path("logout/", dashboard.LogoutView.as_view(), name="dash-logout"),
    path("events/", dashboard.events, name="dash-events"),
    path("traces/<str:trace_id>/", screens.trace, name="dash-trace"),
    path("turns/<str:turn_id>/", screens.turn, name="dash-turn"),
    path("deliveries/event/<str:event_id>/", screens.delivery_of_event, name="dash-delivery-of-event"),
    path("deliveries/<str:delivery_id>/", screens.delivery, name="dash-delivery"),
    path("spend/", screens.spend, name="dash-spend"),
    path("seats/<str:handle>/", dashboard.seat, name="dash-seat"),
    path("seats/<str:handle>/memory/", dashboard.seat_memory, name="dash-seat-memory"),
    path("dead-letters/", dashboard.dead_letters, name="dash-dead-letters"),
    path("operator/act", OperatorActView.as_view(), name="operator-act"),
    path("backup", BackupView.as_view(), name="backup"),
    path("operator/dead-letters/replay", BulkReplayView.as_view(), name="operator-dead-letters-replay"),
]
