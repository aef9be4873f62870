"""Webhook routes, mounted at ``/webhooks/`` by ``crewlet.urls``: one per source."""
from __future__ import annotations

from django.urls import path

from notifications.views import webhook

app_name = "notifications"

SOURCES = ("slack", "github", "jira", "confluence", "mattermost")

# Both spellings, so a provider registered with a trailing slash is not a 404.
urlpatterns = [path(f"{source}", webhook, {"source": source}, name=source) for source in SOURCES] + [
    path(f"{source}/", webhook, {"source": source}) for source in SOURCES
]
