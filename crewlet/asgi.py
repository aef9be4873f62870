"""ASGI entry point: Django over HTTP, and the dashboard's ``/ws/stream`` over WebSocket.

Daphne serves this on the engine's own loop (``crewlet.web``). HTTP is
Django's ASGI handler exactly as before; a WebSocket goes through Channels'
session/auth middleware (so a signed-in staff session is ``scope["user"]``)
to the routes of :mod:`eventstore.stream`. No channel layer: each tab opens
its own broadcast consumer on the engine's queue. ``manage.py up`` serves
:func:`with_static_files` of it, so the admin has its CSS and JS.
"""
from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")

# Django first: the routes below import models, which need the app registry ready.
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from eventstore.stream import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)


def with_static_files(app: Any) -> Any:
    """``app`` with ``STATIC_URL`` (the admin's CSS and JS, found in the apps) served in front of it.

    ``manage.py up`` is the whole site on one machine, with no web server in
    front to serve ``collectstatic``'s output, so it serves the files itself,
    through Django's static handler (read from the installed apps; nothing to
    collect first). A deployment behind a web server serves ``STATIC_ROOT``
    there instead and runs :data:`application` bare.
    """
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    return ASGIStaticFilesHandler(app)
