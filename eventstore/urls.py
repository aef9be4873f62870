"""/api/ routes (mounted by crewlet.urls). Every one needs an operator token or a staff session."""
from __future__ import annotations

from django.urls import path

from eventstore import views
from eventstore.console import replay_views

urlpatterns = [
    path("events", views.EventsView.as_view(), name="api-events"),
    path("events/series", views.EventSeriesView.as_view(), name="api-event-series"),
    path("events/<str:event_id>", views.EventView.as_view(), name="api-event"),
    path("traces/<str:trace_id>", views.TraceView.as_view(), name="api-trace"),
    path("turns", views.TurnsView.as_view(), name="api-turns"),
    path("turns/<str:turn_id>", views.TurnView.as_view(), name="api-turn"),
    path("deliveries/<str:delivery_id>", views.DeliveryView.as_view(), name="api-delivery"),
    path("dead-letters", replay_views.FilteredDeadLettersView.as_view(), name="api-dead-letters"),
    path("dead-letters/preview", replay_views.DeadLetterPreviewView.as_view(), name="api-dead-letters-preview"),
    path("schema/", views.SchemaView.as_view(), name="api-schema"),
    path("docs/", views.SwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("redoc/", views.RedocView.as_view(url_name="api-schema"), name="api-redoc"),
]
