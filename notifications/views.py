"""``POST /webhooks/<source>``: the Django face of :mod:`notifications.edge`.

Thin on purpose: it reads the request, refuses an oversized body before
reading it, and hands the rest to the :class:`~notifications.edge.Edge` of the
engine running in this process (its :data:`~crewlet.engine.interfaces.NOTIFY`
service holds it). No edge means this process has no broker connection: 503
in the webhook's own shape, with a ``Retry-After``, so the vendor retries.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from crewlet.engine import runtime
from crewlet.engine.interfaces import NOTIFY
from crewlet.http.web import loop_safe

from notifications.edge import EdgeResponse, refuse
from notifications.sources import source_for
from notifications.sources.base import InboundRequest

log = logging.getLogger("crewlet.notifications.edge")

#: Why a delivery is answered 503 where no engine's notify service runs (the vendor retries after ``Retry-After``).
NO_EDGE = "this process has no broker connection for webhooks (is the engine running?)"


def _respond(resp: EdgeResponse) -> HttpResponse:
    out = HttpResponse(status=resp.status) if resp.body is None else JsonResponse(resp.body, status=resp.status)
    for name, value in resp.headers.items():
        out[name] = value
    return out


def _error(status: int, reason: str, **headers: str) -> HttpResponse:
    return _respond(refuse(status, reason, **headers))


@csrf_exempt
async def webhook(request: HttpRequest, source: str, **route: str) -> HttpResponse:
    """One delivery to ``source``, answered, and counted in the engine's metrics by source and status with its latency.

    What the route names beyond the source (the generic source's seat) the edge reads from the path.
    """
    started = time.perf_counter()
    response = await _webhook(request, source)
    running = runtime.current_engine()
    if running is not None:
        running.metrics.webhook(source, response.status_code, time.perf_counter() - started)
    return response


async def _webhook(request: HttpRequest, source: str) -> HttpResponse:
    if request.method != "POST":
        return _error(405, f"{request.method} is not accepted: webhooks are POSTed", Allow="POST")
    notify = runtime.find_service(NOTIFY)
    edge = notify.edge if notify is not None else None
    if edge is None:
        return _error(503, NO_EDGE, **{"Retry-After": "5"})
    limit = edge.limit()
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return _error(413, f"the body is {declared} bytes, over the {limit}-byte limit")
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, f"the body is over the {limit}-byte limit")
    headers = {name.lower(): value for name, value in request.headers.items()}
    query = {key: request.GET.get(key, "") for key in request.GET}
    resp = await edge.receive(InboundRequest(source=source, body=body, headers=headers, query=query, route=request.path))
    return _respond(resp)


def _checks_no_stored_token(route: dict[str, Any]) -> bool:
    """A company surface verifies with an HMAC or a configured secret; only a source with ``authenticate`` reads the store."""
    source = source_for(str(route.get("source", "")))
    return source is not None and source.authenticate is None


loop_safe(webhook, _checks_no_stored_token)


async def incomplete(request: HttpRequest, source: str, pattern: str) -> HttpResponse:
    """A source whose route names more (the generic source's seat), posted to without it: 404 saying what is missing."""
    return _error(404, f"{request.path} names no {pattern.strip('<>').split(':')[-1]}: POST to /webhooks/{source}/{pattern}")
