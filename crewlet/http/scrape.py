"""``GET /metrics``: this engine's Prometheus registry, for a bearer of an operator token or the scrape token.

A scraper sends ``Authorization: Bearer <token>``: either an operator token
(the ones ``/api/`` takes) or ``CREWLET_METRICS_TOKEN`` when that is set — a
credential that reads the metrics and nothing else, so the scraper's config
does not hold a key to the API. Anything else is ``401`` with a reason and the
Bearer challenge. A process without an engine has nothing to count: ``503``.
"""
from __future__ import annotations

import hmac
from typing import Optional

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from crewlet.engine import runtime
from crewlet.http.auth import REALM, operator_for
from crewlet.engine.metrics import CONTENT_TYPE

#: Reasons a scrape is refused (the 401's ``detail``).
NO_CREDENTIAL = "a Bearer token is required: an operator token or CREWLET_METRICS_TOKEN"
BAD_AUTHORIZATION = "Authorization must be 'Bearer <token>'"
UNKNOWN_TOKEN = "unknown token"
NO_ENGINE = "engine not running: this process has no metrics"


def _refused(reason: str) -> JsonResponse:
    response = JsonResponse({"detail": reason}, status=401)
    response["WWW-Authenticate"] = f'Bearer realm="{REALM}"'
    return response


def bearer_token(header: str) -> tuple[Optional[str], str]:
    """(token, "") from an Authorization header's value, else (None, why it is no credential)."""
    if not header:
        return None, NO_CREDENTIAL
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1].isascii():
        return None, BAD_AUTHORIZATION
    return parts[1], ""


def is_scrape_token(token: str) -> bool:
    """True when ``token`` is ``CREWLET_METRICS_TOKEN``: a credential for ``/metrics`` and nothing else."""
    expected = str(getattr(settings, "METRICS_TOKEN", "") or "")
    return bool(expected) and hmac.compare_digest(token.encode(), expected.encode())


@require_GET
async def metrics(request: HttpRequest) -> HttpResponse:
    token, why = bearer_token(request.headers.get("Authorization", ""))
    if token is None:
        return _refused(why)
    if not is_scrape_token(token) and await sync_to_async(operator_for)(token) is None:
        return _refused(UNKNOWN_TOKEN)
    engine = runtime.current_engine()
    if engine is None:
        return JsonResponse({"detail": NO_ENGINE}, status=503)
    await engine.metrics.refresh()
    return HttpResponse(engine.metrics.render(), content_type=CONTENT_TYPE)
