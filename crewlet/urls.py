"""URL routes: the admin and the /api/ reads (OpenAPI at /api/schema/); later issues add the dashboard."""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("eventstore.urls")),
]
