"""``GET /healthz``: 200 only when this process's broker connection is up and its loops run.

``{"status": "ok", "broker": "connected", "loops": "running", "node": ...}``;
otherwise 503 with the same keys saying which part is down
(``broker``: ``connected`` | ``disconnected`` | ``engine not running``;
``loops``: ``running`` | ``not running``). No authentication: it reveals
nothing but the node id, and load balancers and ``up``'s users poll it.
"""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from crewlet import runtime


def health() -> tuple[bool, dict[str, Any]]:
    """(healthy, body) for this process, right now."""
    import seats.runtime

    queue = runtime.current_queue()
    seat_runtime = seats.runtime.current()
    loops = "running" if seat_runtime is not None and seat_runtime.healthy() else "not running"
    if queue is None:
        return False, {"status": "down", "broker": "engine not running", "loops": loops, "node": None}
    broker = "connected" if runtime.is_connected(queue) else "disconnected"
    ok = broker == "connected" and loops == "running"
    return ok, {"status": "ok" if ok else "down", "broker": broker, "loops": loops, "node": queue.node}


@require_GET
async def healthz(request: HttpRequest) -> JsonResponse:
    ok, body = health()
    return JsonResponse(body, status=200 if ok else 503)
