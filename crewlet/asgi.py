"""ASGI entry point: Django over HTTP, and the dashboard's ``/ws/stream`` over WebSocket.

Daphne serves this on the engine's own loop (``crewlet.http.web``). HTTP is
Django's ASGI handler exactly as before; a WebSocket goes through Channels'
session/auth middleware (so a signed-in staff session is ``scope["user"]``)
to the routes of :mod:`eventstore.stream`. No channel layer: each tab opens
its own broadcast consumer on the engine's queue. ``manage.py up`` serves
:func:`with_static_files` of it, so the admin has its CSS and JS.

Every HTTP request runs inside an OpenTelemetry server span made by the
OpenTelemetry ASGI instrumentation (the semantic conventions' ``http.*``
attributes, named ``{method} {route}`` after the Django route it resolves to,
joining an inbound W3C ``traceparent``). The one ``traceparent`` rule of this
code base applies there too: a header that :func:`crewlet.events.trace.traceparent_from_headers`
refuses (malformed, or sent twice) is dropped before the instrumentation sees
it, so the request starts a fresh trace rather than joining a bogus one.

No credential in a request's query reaches the collector: the
instrumentation copies the query into the span (``http.url``, ``url.query``,
and ``http.target``/``url.full`` where a convention puts it there), so a Jira
or Confluence webhook's ``?secret=`` or an API call's ``?token=`` would be
exported verbatim. :func:`redact_query_attributes`, the instrumentation's
server request hook, rewrites those attributes from the raw query with every
credential parameter's value replaced (:func:`crewlet.base.redact.redact_query`)
before the app runs, so the span that ends — and is exported — never held one
past its first instant.
"""
from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application
from opentelemetry.semconv._incubating.attributes.http_attributes import HTTP_TARGET, HTTP_URL
from opentelemetry.semconv.attributes.url_attributes import URL_FULL, URL_QUERY

from crewlet.events.trace import TRACEPARENT_HEADER, traceparent_from_headers
from crewlet.base.redact import redact, redact_query

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")

# Django first: the routes below import models, which need the app registry ready.
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from eventstore.console.operator_mcp import OperatorMCP  # noqa: E402
from eventstore.stream import websocket_urlpatterns  # noqa: E402

_TRACE_HEADERS = (TRACEPARENT_HEADER.encode(), b"tracestate")


class StrictTraceparent:
    """ASGI: drop a ``traceparent`` (and its ``tracestate``) that the W3C-strict parser refuses."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = scope.get("headers") or []
        sent = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k.lower() == _TRACE_HEADERS[0]]
        if sent and traceparent_from_headers(sent) is None:
            scope = dict(scope, headers=[(k, v) for k, v in headers if k.lower() not in _TRACE_HEADERS])
        await self.app(scope, receive, send)


def _span_details(scope: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """``{method} {route}`` and ``http.route`` for a path Django routes; the method alone for any other."""
    from django.urls import Resolver404, resolve
    from opentelemetry.util.http import sanitize_method

    method = sanitize_method(str(scope.get("method", "")).strip())
    method = "HTTP" if method == "_OTHER" else method
    try:
        match = resolve(str(scope.get("path", "")))
    except Resolver404:
        return method, {}
    route = "/" + str(match.route)
    return f"{method} {route}", {"http.route": route}


#: The span attributes (the old and the stable HTTP conventions) holding a URL or a target, query included.
URL_ATTRIBUTES = (HTTP_URL, URL_FULL, HTTP_TARGET)


def redact_query_attributes(span: Any, scope: dict[str, Any]) -> None:
    """The instrumentation's ``server_request_hook``: the span's URL attributes with each credential query value replaced.

    Rebuilt from the scope's raw ``query_string`` rather than from the
    attribute, which the instrumentation writes percent-decoded: there an
    encoded ``&`` inside a secret would split it, and half of it would pass
    for a parameter of its own. The part before the query goes through
    :func:`crewlet.base.redact.redact` as well.
    """
    if not span.is_recording():
        return
    attributes = getattr(span, "attributes", None) or {}
    raw = scope.get("query_string") or b""
    query = redact_query(raw.decode("latin-1") if isinstance(raw, (bytes, bytearray)) else str(raw))
    rewritten: dict[str, str] = {}
    for name in URL_ATTRIBUTES:
        value = attributes.get(name)
        if isinstance(value, str):
            base, mark, _ = value.partition("?")
            rewritten[name] = redact(base) + (f"?{query}" if mark else "")
    if isinstance(attributes.get(URL_QUERY), str):
        rewritten[URL_QUERY] = query
    for name, value in rewritten.items():
        if value != attributes.get(name):
            span.set_attribute(name, value)


#: Header names (regular expressions) whose values a span never carries, whatever the capture variables ask.
CREDENTIAL_HEADERS = (".*authorization.*", ".*cookie.*", ".*signature.*", ".*token.*", ".*secret.*")


def traced(app: Any) -> Any:
    """``app`` with a server span per HTTP request (the OpenTelemetry ASGI instrumentation).

    The instrumentation's own variables apply: ``OTEL_PYTHON_ASGI_EXCLUDED_URLS``
    (or ``OTEL_PYTHON_EXCLUDED_URLS``) leaves paths untraced, and
    ``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST``/``_RESPONSE``
    capture headers — with a credential header's value always replaced, as the
    logs replace it — and a credential query value never reaches a span
    (:func:`redact_query_attributes`).
    """
    # The stable HTTP conventions (http.request.method, http.response.status_code, url.path), not the old
    # names the instrumentation still writes by default; an operator's own OTEL_SEMCONV_STABILITY_OPT_IN wins.
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.util.http import (
        OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS,
        get_custom_headers,
        get_excluded_urls,
    )

    from crewlet.events.tracing import configure_tracing

    sanitized = [*get_custom_headers(OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS), *CREDENTIAL_HEADERS]
    return StrictTraceparent(
        OpenTelemetryMiddleware(
            app,
            excluded_urls=get_excluded_urls("ASGI"),
            tracer_provider=configure_tracing(),
            default_span_details=_span_details,
            exclude_spans=["receive", "send"],
            http_capture_headers_sanitize_fields=sanitized,
            server_request_hook=redact_query_attributes,
        )
    )


class WebhookFastPath:
    """ASGI: a POST to a loop-safe view (a vendor's webhook) answered on the loop, without Django's middleware chain.

    Every entry of ``MIDDLEWARE`` is a sync ``MiddlewareMixin``, so under ASGI
    each of its hooks, the request signals and the response's close are a hop
    into the request's own thread-sensitive executor (a new thread per request)
    and back: about a dozen hops, most of what a delivery cost in a burst. A
    company surface's delivery uses nothing the session, authentication, CSRF
    (the view is exempt), sign-in throttle or messages middleware provide, and
    touches no database on a request thread (its check is an HMAC; the edge
    publishes on the engine's loop); its app says so with
    ``crewlet.http.web.loop_safe``. So it is answered by the same view, given the
    request Django builds, with the header-only middleware (security, common:
    the ``ALLOWED_HOSTS`` check, clickjacking) run inline. Any other request,
    and a source that checks a stored token, goes to Django as before.
    """

    def __init__(self, handler: Any) -> None:
        from django.middleware.clickjacking import XFrameOptionsMiddleware
        from django.middleware.common import CommonMiddleware
        from django.middleware.security import SecurityMiddleware

        self.handler = handler  # Django's ASGIHandler: everything else, and the request and response plumbing
        self.inline = [m(lambda request: None) for m in (SecurityMiddleware, CommonMiddleware, XFrameOptionsMiddleware)]

    def _route(self, scope: dict[str, Any]) -> Any:
        """The resolver match of a POST whose view its app marked loop-safe for this route (``crewlet.http.web.loop_safe``), else None."""
        from django.urls import Resolver404, resolve

        from crewlet.http.web import LOOP_SAFE_ATTR

        if scope.get("type") != "http" or scope.get("method") != "POST":
            return None
        try:
            match = resolve(str(scope.get("path", "")))
        except Resolver404:
            return None
        safe = getattr(match.func, LOOP_SAFE_ATTR, None)
        return match if safe is not None and safe(match.kwargs) else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        match = self._route(scope)
        if match is None:
            await self.handler(scope, receive, send)
            return
        from django.core.exceptions import RequestAborted

        try:
            body_file = await self.handler.read_body(receive)
        except RequestAborted:
            return
        try:
            request, response = self.handler.create_request(scope, body_file)
            if request is not None:
                request.resolver_match = match
                response = await self._respond(request, match)
            await self.handler.send_response(response, send)
        finally:
            body_file.close()

    async def _respond(self, request: Any, match: Any) -> Any:
        from django.core.handlers.exception import response_for_exception
        from django.utils.log import log_response

        try:
            response = None
            for middleware in self.inline:
                hook = getattr(middleware, "process_request", None)
                response = hook(request) if hook is not None else None
                if response is not None:
                    break
            if response is None:
                response = await match.func(request, *match.args, **match.kwargs)
        except Exception as exc:  # Django's own answer for it (400 for a disallowed host, 500 otherwise)
            response = response_for_exception(request, exc)
        for middleware in reversed(self.inline):
            response = middleware.process_response(request, response)
        if response.status_code >= 400:
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
        return response


class WithOperatorMCP:
    """ASGI: ``/operator/mcp`` (the operator's MCP server, :mod:`eventstore.console.operator_mcp`) before ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.mcp = OperatorMCP(django_application)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = self.mcp if self.mcp.serves(str(scope.get("path", ""))) else self.app
        await target(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": traced(WithOperatorMCP(WebhookFastPath(django_application))),
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
