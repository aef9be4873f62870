"""URL routes: /healthz, /livez, /readyz, /metrics, the admin, each app's routes (the /api/ reads, OpenAPI at /api/schema/ with Swagger UI at /api/docs/ and Redoc at /api/redoc/; the webhooks);
and the dashboard's pages and ``/operator/act`` at the root (``eventstore.console.urls``).

The project's top: it mounts each app's URL module by name and imports none.
"""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from crewlet.http.health import healthz, livez, readyz
from crewlet.http.scrape import metrics
from crewlet.http.limits import WEBHOOKS_PREFIX

#: An /api/ path no route has, or an /api/ request that broke: the API's JSON error, not Django's page.
handler404 = "crewlet.http.errors.page_not_found"
handler500 = "crewlet.http.errors.server_error"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/seats/", include("seats.urls")),
    path("api/sandbox/", include("seats.sandbox.urls")),
    path("api/a2a/", include("a2a.urls")),
    path("api/", include("eventstore.urls")),
    path(WEBHOOKS_PREFIX, include("notifications.urls")),
    path("", include("eventstore.console.urls")),
]
