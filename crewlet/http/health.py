"""``GET /healthz``, ``/livez`` and ``/readyz``: is this process alive, and is it ready for work.

``/livez`` answers 200 whenever the process answers at all (what a supervisor
restarts on). ``/readyz`` is 200 only when every component it names is ready —
the broker answers a round trip within ``HEALTH_BROKER_TIMEOUT_S``, every
engine service is alive, and the coordination store and the event store each
answer a query within ``HEALTH_STORE_TIMEOUT_S`` — and 503 naming in ``down``
what is not. Services that report their own state
(:meth:`~crewlet.engine.core.Engine.status_reports`: a surface's socket client,
``surface_socket:<kind>``, with ``connected``, ``last_frame_at`` and
``last_error``) are shown beside them and listed in ``degraded`` when not ok, but
never make the node unready: a chat vendor that cannot be reached is not this
node's fault, and a load balancer that took every node out of service for it
would also stop the webhooks, the dashboard and the seats that still work.
Both use the one broker check below.

``/healthz``: 200 only when this process's broker answers and its loops run.

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

import asyncio
from typing import Any, Optional

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from crewlet.engine import runtime
from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.engine.interfaces import SEAT_RUNTIME
from crewlet.queue.errors import QueueError

BROKER_CONNECTED = "connected"
BROKER_DISCONNECTED = "disconnected"
BROKER_UNRESPONSIVE = "unresponsive"
BROKER_NO_ENGINE = "engine not running"
LOOPS_RUNNING = "running"
LOOPS_NOT_RUNNING = "not running"
DEFAULT_BROKER_TIMEOUT_S = 1.5
DEFAULT_STORE_TIMEOUT_S = 2.0

#: ``/readyz``'s component names and states.
COMPONENT_BROKER = "broker"
COMPONENT_DUTIES = "duties"
COMPONENT_COORDINATION_STORE = "coordination_store"
COMPONENT_EVENT_STORE = "event_store"
DUTIES_ALIVE = "alive"
DUTIES_DEAD = "not alive"
DUTIES_NO_ENGINE = "engine not running"
STORE_REACHABLE = "reachable"
STORE_UNREACHABLE = "unreachable"
STORE_UNRESPONSIVE = "unresponsive"
STATUS_READY = "ready"
STATUS_NOT_READY = "not ready"
STATUS_ALIVE = "alive"
#: Which database alias each store component queries.
STORE_ALIASES = ((COMPONENT_COORDINATION_STORE, "default"), (COMPONENT_EVENT_STORE, EVENTS_ALIAS))


async def broker_state(queue: Any) -> str:
    """The broker as ``queue`` reaches it right now: a round trip, never just the socket's state."""
    if queue is None:
        return BROKER_NO_ENGINE
    if not runtime.is_connected(queue):
        return BROKER_DISCONNECTED
    try:
        await queue.round_trip(float(getattr(settings, "HEALTH_BROKER_TIMEOUT_S", DEFAULT_BROKER_TIMEOUT_S)))
        return BROKER_CONNECTED
    except QueueError:
        return BROKER_DISCONNECTED if not runtime.is_connected(queue) else BROKER_UNRESPONSIVE


async def health() -> tuple[bool, dict[str, Any]]:
    """(healthy, body) for this process, right now: the broker asked for a round trip.

    The loops are the running engine's seat runtime (:data:`~crewlet.engine.interfaces.SEAT_RUNTIME`).
    """
    running = runtime.current_engine()
    queue = running.queue if running is not None else None
    seat_runtime = running.find(SEAT_RUNTIME) if running is not None else None
    loops = LOOPS_RUNNING if seat_runtime is not None and seat_runtime.healthy() else LOOPS_NOT_RUNNING
    if queue is None:
        return False, {"status": "down", "broker": BROKER_NO_ENGINE, "loops": loops, "node": None}
    broker = await broker_state(queue)
    ok = broker == BROKER_CONNECTED and loops == LOOPS_RUNNING
    return ok, {"status": "ok" if ok else "down", "broker": broker, "loops": loops, "node": queue.node}


@require_GET
async def healthz(request: HttpRequest) -> JsonResponse:
    ok, body = await health()
    return JsonResponse(body, status=200 if ok else 503)


def _query(alias: str) -> None:
    """One trivial query on ``alias``, on a worker thread, whose connection is closed after (threads come and go)."""
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        connection.close()


async def store_state(alias: str, timeout_s: float) -> str:
    """Whether the database ``alias`` answers a query within ``timeout_s``."""
    try:
        await asyncio.wait_for(asyncio.to_thread(_query, alias), timeout=timeout_s)
    except asyncio.TimeoutError:
        return STORE_UNRESPONSIVE
    except Exception:
        return STORE_UNREACHABLE
    return STORE_REACHABLE


def _duties(running: Any) -> dict[str, Any]:
    if running is None:
        return {"ok": False, "state": DUTIES_NO_ENGINE, "services": {}}
    services = running.duties()
    ok = bool(services) and all(services.values())
    return {"ok": ok, "state": DUTIES_ALIVE if ok else DUTIES_DEAD, "services": services}


async def readiness() -> tuple[bool, dict[str, Any]]:
    """(ready, body): each component of ``/readyz`` checked now, the broker and the stores at once."""
    running = runtime.current_engine()
    queue: Optional[Any] = running.queue if running is not None else None
    store_timeout_s = float(getattr(settings, "HEALTH_STORE_TIMEOUT_S", DEFAULT_STORE_TIMEOUT_S))
    broker, *stores = await asyncio.gather(
        broker_state(queue), *(store_state(alias, store_timeout_s) for _, alias in STORE_ALIASES)
    )
    components: dict[str, dict[str, Any]] = {
        COMPONENT_BROKER: {"ok": broker == BROKER_CONNECTED, "state": broker},
        COMPONENT_DUTIES: _duties(running),
    }
    for (name, _), state in zip(STORE_ALIASES, stores):
        components[name] = {"ok": state == STORE_REACHABLE, "state": state}
    down = [name for name, part in components.items() if not part["ok"]]
    ready = not down
    reported = running.status_reports() if running is not None else {}
    components.update(reported)
    body = {
        "status": STATUS_READY if ready else STATUS_NOT_READY,
        "node": queue.node if queue is not None else None,
        "down": down,
        "degraded": [name for name, part in reported.items() if not part["ok"]],
        "components": components,
    }
    return ready, body


@require_GET
async def readyz(request: HttpRequest) -> JsonResponse:
    ready, body = await readiness()
    return JsonResponse(body, status=200 if ready else 503)


@require_GET
async def livez(request: HttpRequest) -> JsonResponse:
    """200 while the process answers; the engine's presence is reported, never a reason for a 503."""
    running = runtime.current_engine()
    queue = running.queue if running is not None else None
    return JsonResponse(
        {
            "status": STATUS_ALIVE,
            "node": queue.node if queue is not None else None,
            "components": {"process": STATUS_ALIVE, "engine": "running" if running is not None else DUTIES_NO_ENGINE},
        }
    )
