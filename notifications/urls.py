"""Webhook routes, mounted at ``/webhooks/`` by ``crewlet.urls``: one per registered source (:mod:`notifications.sources`)."""
from __future__ import annotations

from django.urls import path

from notifications.sources import NAMES
from notifications.views import webhook

app_name = "notifications"

# Both spellings, so a provider registered with a trailing slash is not a 404.
urlpatterns = [path(f"{source}", webhook, {"source": source}, name=source) for source in NAMES] + [
    path(f"{source}/", webhook, {"source": source}) for source in NAMES
]
