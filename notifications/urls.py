"""Webhook routes, mounted at ``/webhooks/`` by ``crewlet.urls``: one per registered source (:mod:`notifications.sources`).

A source whose route names more (the generic source's ``<seat>``) gets its
``path`` after its name.
"""
from __future__ import annotations

from django.urls import URLPattern, path

from notifications.sources import REGISTRY
from notifications.views import incomplete, webhook

app_name = "notifications"


def _routes(name: str, suffix: str) -> list[URLPattern]:
    route = f"{name}/{suffix}" if suffix else name
    # Both spellings, so a provider registered with a trailing slash is not a 404.
    routes = [path(route, webhook, {"source": name}, name=name), path(f"{route}/", webhook, {"source": name})]
    if suffix:  # the route without what it names: a 404 that says what is missing
        routes += [path(spelling, incomplete, {"source": name, "pattern": suffix}) for spelling in (name, f"{name}/")]
    return routes


urlpatterns = [pattern for name, source in REGISTRY.items() for pattern in _routes(name, source.path)]
