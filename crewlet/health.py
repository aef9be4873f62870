"""``GET /healthz``: 200 only when this process's broker answers and its loops run.

``{"status": "ok", "broker": "connected", "loops": "running", "node": ...}``;
otherwise 503 with the same keys saying which part is down
(``broker``: ``connected`` | ``disconnected`` | ``unresponsive`` | ``engine not running``;
``loops``: ``running`` | ``not running``). No authentication: it reveals
nothing but the node id, and load balancers and ``up``'s users poll it.

"Connected" is a round trip, not the connection's state: a broker frozen
(SIGSTOP, a hung host) keeps its socket open, so the client believes it is
connected for minutes; a PING it does not answer within
``HEALTH_BROKER_TIMEOUT_S`` (1.5 s) makes it ``unresponsive``.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from crewlet import runtime
from crewlet.interfaces import seat_loops
from crewlet.queue.errors import QueueError

BROKER_CONNECTED = "connected"
BROKER_DISCONNECTED = "disconnected"
BROKER_UNRESPONSIVE = "unresponsive"
BROKER_NO_ENGINE = "engine not running"
LOOPS_RUNNING = "running"
LOOPS_NOT_RUNNING = "not running"
DEFAULT_BROKER_TIMEOUT_S = 1.5


async def health() -> tuple[bool, dict[str, Any]]:
    """(healthy, body) for this process, right now: the broker asked for a round trip.

    The loops are the running engine's seat runtime (:data:`~crewlet.interfaces.SEAT_RUNTIME`).
    """
    running = runtime.current_engine()
    queue = running.queue if running is not None else None
    seat_runtime = seat_loops(running) if running is not None else None
    loops = LOOPS_RUNNING if seat_runtime is not None and seat_runtime.healthy() else LOOPS_NOT_RUNNING
    if queue is None:
        return False, {"status": "down", "broker": BROKER_NO_ENGINE, "loops": loops, "node": None}
    if not runtime.is_connected(queue):
        broker = BROKER_DISCONNECTED
    else:
        try:
            await queue.round_trip(float(getattr(settings, "HEALTH_BROKER_TIMEOUT_S", DEFAULT_BROKER_TIMEOUT_S)))
            broker = BROKER_CONNECTED
        except QueueError:
            broker = BROKER_DISCONNECTED if not runtime.is_connected(queue) else BROKER_UNRESPONSIVE
    ok = broker == BROKER_CONNECTED and loops == LOOPS_RUNNING
    return ok, {"status": "ok" if ok else "down", "broker": broker, "loops": loops, "node": queue.node}


@require_GET
async def healthz(request: HttpRequest) -> JsonResponse:
    ok, body = await health()
    return JsonResponse(body, status=200 if ok else 503)
