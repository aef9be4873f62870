"""The process's one handle on its running engine, and the one way a request thread reaches it.

The engine attaches itself here once its queue is connected (and detaches
before closing it), so code served by the same process — webhook views,
``/healthz``, the dashboard, the API — asks :func:`service` for the service it
needs by its key (:mod:`crewlet.engine.interfaces`), typed by what the key
provides, or :func:`find_service` when doing without it is an answer too.
That reference is the only process-wide state: every service lives in the
engine's registry.

Whatever a thread cannot have of the engine — no engine in this process, no
queue, no such service, no fleet to ask, no answer in time — is one error,
:class:`EngineAway`: ``missing`` says which (:data:`MISSING_ENGINE` ...), and
its words (``reason``, its ``str()``) are the ones below, defined once. A
view lets it go: the API's exception handler (``crewlet.http.bodies``) answers
every one of them 503 with that reason.

:func:`call_on_loop` is the one way a thread that is not the engine's (a sync
view, an admin action, an ``on_commit`` announcement) runs a coroutine on the
engine's loop and waits for its answer; :func:`on_engine` is it for the common
case of asking the engine's queue.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
from typing import TYPE_CHECKING, Awaitable, Callable, Optional, TypeVar

from asgiref.sync import SyncToAsync
from opentelemetry import context as otel_context

from crewlet.engine.interfaces import ServiceKey
from crewlet.queue.emit import Emitter
from crewlet.queue.contract import EventQueue

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.company.org import Organization

log = logging.getLogger("crewlet.engine.runtime")

_T = TypeVar("_T")

#: What :class:`EngineAway` says is missing: no engine runs in this process (a web-only process, or it stopped).
MISSING_ENGINE = "engine"
#: The engine has no queue client (none in this process, or not connected yet).
MISSING_QUEUE = "queue"
#: The engine runs no service under the key asked for (not registered, not started yet, or stopped).
MISSING_SERVICE = "service"
#: The fleet cannot be asked from this process (its history reads run only beside an engine).
MISSING_FLEET = "fleet"
#: The engine's loop did not answer in time, or cannot be waited on from this thread.
MISSING_ANSWER = "answer"

#: The words of each, when the raiser has none more precise.
NO_ENGINE = "no engine runs in this process to reach the queue"
NO_QUEUE = (
    "no queue in this process: the engine is not running here "
    "(run manage.py up, or manage.py runconsumers beside the web server)"
)
NO_SERVICE = "the engine running in this process runs no such service"
NO_FLEET = (
    "no engine runs in this process, so it cannot ask the fleet: each node's store holds only what that node "
    "published, and one store's rows alone would read like a quiet company (ask a node that runs manage.py up "
    "or runconsumers)"
)
NO_ANSWER = "the engine's loop did not answer"
WORDS: dict[str, str] = {
    MISSING_ENGINE: NO_ENGINE,
    MISSING_QUEUE: NO_QUEUE,
    MISSING_SERVICE: NO_SERVICE,
    MISSING_FLEET: NO_FLEET,
    MISSING_ANSWER: NO_ANSWER,
}
#: How long a request thread waits for the engine's loop by default.
ENGINE_TIMEOUT_S = 10.0

_engine: Optional["Engine"] = None


class EngineAway(RuntimeError):
    """This process cannot have what it asked of its engine: the one "no engine here" error.

    ``missing`` is which part is away (one of :data:`WORDS`' keys: the
    engine, its queue, a service, the fleet, an answer); ``reason`` (also the
    ``str()``) is the sentence a person reads, :data:`WORDS`' unless the raiser
    knows better. A :class:`RuntimeError`, as a refusal of the process's
    current state: a caller that turns away a call it cannot make here (the
    admin's pause action) catches it as such.
    """

    def __init__(self, missing: str = MISSING_ENGINE, reason: str = "") -> None:
        self.missing = missing
        self.reason = reason or WORDS.get(missing, NO_ENGINE)
        super().__init__(self.reason)


def attach(engine: "Engine") -> None:
    """Make ``engine`` this process's running engine (the engine calls this once its queue is connected)."""
    global _engine
    _engine = engine


def detach(engine: Optional["Engine"] = None) -> None:
    """Forget the running engine (only ``engine`` itself, when given, so a stale stop cannot remove a newer one)."""
    global _engine
    if engine is None or _engine is engine:
        _engine = None


def current_engine() -> Optional["Engine"]:
    """The engine running in this process, or None."""
    return _engine


def engine() -> "Engine":
    """The engine running in this process; :class:`EngineAway` when none does."""
    if _engine is None:
        raise EngineAway(MISSING_ENGINE)
    return _engine


def service(key: ServiceKey[_T], *, missing: str = "") -> _T:
    """The running engine's service under ``key``; :class:`EngineAway` when there is no engine or no such service.

    The one way code outside the engine's services (a view, a page, a
    socket) reaches a service. ``missing`` names the absence for an asker to
    whom either case is one (the history reads: no fleet to ask); otherwise it
    is :data:`MISSING_ENGINE` or :data:`MISSING_SERVICE`, saying which.
    """
    running = _engine
    if running is None:
        raise EngineAway(missing or MISSING_ENGINE)
    found = running.find(key)
    if found is None:
        raise EngineAway(missing or MISSING_SERVICE, "" if missing else f"no {key.name} service runs in this engine")
    return found


def find_service(key: ServiceKey[_T]) -> Optional[_T]:
    """The running engine's service under ``key``, or None (no engine, or it runs none): for an asker that can do without."""
    running = _engine
    return running.find(key) if running is not None else None


def company() -> "Organization":
    """The company the running engine serves (its active revision); :class:`EngineAway` without one.

    A web-only process does not know which seats there are: that is the
    running engine's company file or active revision, never a guess.
    """
    holder = engine().company
    if holder is None:
        raise EngineAway(MISSING_ENGINE)
    found: "Organization" = holder.current()
    return found


def current_queue() -> Optional[EventQueue]:
    """The running engine's queue, or None."""
    return _engine.queue if _engine is not None else None


def get_queue() -> EventQueue:
    """The running engine's queue; :class:`EngineAway` (``MISSING_QUEUE``) with what to do when there is none."""
    queue = current_queue()
    if queue is None:
        raise EngineAway(MISSING_QUEUE)
    return queue


async def aget_queue() -> EventQueue:
    """The running engine's queue; :class:`EngineAway` saying why a process without an engine has none."""
    queue = current_queue()
    if queue is not None:
        return queue
    from crewlet.company.loading import load_settings

    stream_type = load_settings().stream.type
    if stream_type == "embedded":
        raise EngineAway(
            MISSING_QUEUE,
            f"no queue in this process and stream.type is {stream_type!r}: "
            "an embedded broker lives inside manage.py up",
        )
    raise EngineAway(MISSING_QUEUE, f"no queue in this process: the engine is not running here (stream.type is {stream_type!r})")


def emitter_for(queue: EventQueue) -> Emitter:
    """The running engine's telemetry emitter when ``queue`` is its queue, else one for this publish alone.

    A one-off announcement (a pause, an activation, an operator audit) then
    shares the engine's retry of a broker that is away for a moment, and is
    flushed when the engine stops.
    """
    running = _engine
    if running is not None and running.queue is queue and running.emitter is not None:
        return running.emitter
    return Emitter(queue)


def is_connected(queue: EventQueue) -> bool:
    """Whether ``queue``'s broker connection is up."""
    return queue.connected


def on_engine(make: Callable[[EventQueue], Awaitable[_T]], timeout_s: float = ENGINE_TIMEOUT_S) -> _T:
    """Run ``make(queue)`` on the engine's loop and wait for it; :class:`EngineAway` when it cannot be asked.

    The way a request thread (a view) reaches the engine's queue: the queue
    lives on the engine's asyncio loop, so its verbs are awaited there,
    through :func:`call_on_loop` (which cannot deadlock on the request's own
    thread).
    """
    running = engine()
    queue = running.queue
    if queue is None:
        raise EngineAway(MISSING_QUEUE, NO_ENGINE)
    return call_on_loop(lambda: make(queue), running.loop, timeout_s)


def start_on_loop(
    make: Callable[[], Awaitable[_T]], loop: Optional[asyncio.AbstractEventLoop]
) -> "concurrent.futures.Future[_T]":
    """Start ``make()`` as a task on ``loop`` and return its future at once (:func:`call_on_loop` waits on it).

    For a thread with work of its own to do meanwhile (a history read reads
    this node's store while the loop asks the others). The same refusals and
    the same fresh context as :func:`call_on_loop`; the caller waits on the
    future with a timeout and cancels it when that runs out.
    """
    if loop is None or loop.is_closed():
        raise EngineAway(MISSING_ENGINE)
    try:
        running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None:
        raise EngineAway(MISSING_ANSWER, "a thread running an event loop must await the coroutine, not block on a loop")
    if SyncToAsync.deadlock_context.get(False):
        raise EngineAway(MISSING_ANSWER, "this is the store thread the engine's coroutine needs: blocking here would deadlock")
    carried = otel_context.get_current()

    async def run() -> _T:
        token = otel_context.attach(carried)
        try:
            return await make()
        finally:
            otel_context.detach(token)

    coro = run()
    try:
        # run_coroutine_threadsafe schedules the task with the context current at the call: a fresh one.
        future = contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, loop)
    except RuntimeError as exc:  # the loop closed since the check above
        coro.close()
        raise EngineAway(MISSING_ENGINE) from exc
    return future


# -- a thread waiting on the engine's loop ---------------------------------------------------

def call_on_loop(
    make: Callable[[], Awaitable[_T]], loop: Optional[asyncio.AbstractEventLoop], timeout_s: float
) -> _T:
    """Run ``make()`` as a task on ``loop`` and wait at most ``timeout_s`` for its result.

    The task runs in a fresh :mod:`contextvars` context, as the engine's own
    tasks do, never in a copy of the calling thread's. A copy would carry
    asgiref's per-request thread marker: the coroutine's store calls
    (``sync_to_async(thread_sensitive=True)``) would then be queued on the very
    request thread that is blocked here waiting for them, and the wait could
    only end by timing out — after the work had been half done. In a fresh
    context they run on the engine's store thread. A copy would also carry the
    request thread's database connections into that thread. The caller's
    OpenTelemetry context (its current span) is carried across explicitly, so
    events the coroutine publishes still hang off the caller's trace.

    Refuses (:class:`EngineAway`) rather than waiting where waiting cannot
    end: on a thread that runs an event loop (await the coroutine instead), and
    on the store thread itself (the coroutine's store calls would queue behind
    this wait). On a timeout the task is cancelled and :class:`EngineAway`
    raised; what the coroutine had already committed stays committed.
    """
    future = start_on_loop(make, loop)
    try:
        return future.result(timeout=timeout_s)
    except TimeoutError as exc:
        future.cancel()
        log.warning("engine_loop_timeout", extra={"timeout_s": timeout_s})
        raise EngineAway(MISSING_ANSWER, f"the engine did not answer within {timeout_s:g}s") from exc


__all__ = [
    "ENGINE_TIMEOUT_S",
    "MISSING_ANSWER",
    "MISSING_ENGINE",
    "MISSING_FLEET",
    "MISSING_QUEUE",
    "MISSING_SERVICE",
    "NO_ANSWER",
    "NO_ENGINE",
    "NO_FLEET",
    "NO_QUEUE",
    "NO_SERVICE",
    "WORDS",
    "EngineAway",
    "aget_queue",
    "attach",
    "call_on_loop",
    "company",
    "current_engine",
    "current_queue",
    "detach",
    "emitter_for",
    "engine",
    "find_service",
    "get_queue",
    "is_connected",
    "on_engine",
    "service",
    "start_on_loop",
]
