"""URL routes: /healthz, the admin and the /api/ reads (OpenAPI at /api/schema/); and the dashboard's pages at the root."""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from crewlet.health import healthz
from eventstore.operator_views import OperatorActView

#: Where the webhook routes are mounted (the web server gives their bodies the webhook limit).
WEBHOOKS_PREFIX = "webhooks/"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/seats/", include("seats.urls")),
    path("api/a2a/", include("a2a.urls")),
    path("api/", include("eventstore.urls")),
    path("operator/act", OperatorActView.as_view(), name="operator-act"),
    path(WEBHOOKS_PREFIX, include("notifications.urls")),
    path("", include("crewlet.dashboard_urls")),
]
