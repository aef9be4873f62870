"""The engine: one asyncio loop that owns the queue connection and the one registry of named services.

``manage.py up`` and ``manage.py runconsumers`` are thin shells around
:meth:`Engine.run`. Each installed app contributes its services from its
``AppConfig.engine_services(engine)`` (:func:`app_services` collects them), so
the commands name no app. A :class:`~crewlet.engine.services.Service` is a key
(:class:`~crewlet.engine.interfaces.ServiceKey`), the names it depends on, and
a factory of a :class:`~crewlet.engine.interfaces.Lifecycle`: the engine
connects the queue (starting the embedded broker when ``stream.type`` is
``embedded``), starts every service after the ones it depends on, and hands
out what each started, typed by its key (:meth:`Engine.get`, :meth:`Engine.find`)
— to other services and, through :func:`crewlet.engine.runtime.service`, to
the request threads of the same process. There is no other process-wide registry.

The service primitives — :class:`~crewlet.engine.services.Periodic` (a duty
now and every ``every_s``; :meth:`Engine.add_periodic`) and
:class:`~crewlet.engine.services.Task` (a coroutine that runs until cancelled,
whose failure stops the engine; :meth:`Engine.add_service`) — and the order
services start in are :mod:`crewlet.engine.services`, named here too for the
modules that import them from the engine. The engine also owns the one
telemetry :class:`~crewlet.queue.emit.Emitter` of the process
(:attr:`Engine.emitter`), closed once every service has stopped.

On SIGTERM/SIGINT it drains: it stops fetching (the queue hands back at once
what no handler is working on), runs the stop hooks (the seat runtime's
concurrency gate turns away what waits at it), stops the front services (the
web server), waits for handlers in flight, stops the other services in the
reverse of their start order, closes the emitter and the queue (handing back
the mail of any handler that outlived the drain, which ends it), stops the
``stop_last`` services (the fleet membership, whose seat leases a handler
still running must keep until it has ended), stops the broker and exports the
spans still batched.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Awaitable, Callable, Optional, Protocol, TypeVar

from crewlet.company.conf import ClusterSettings, EngineSettings, LeafSettings, redact_url
from crewlet.company.loading import cluster_secret
from crewlet.engine import runtime
from crewlet.engine.interfaces import Lifecycle, ServiceKey
from crewlet.engine.metrics import EngineMetrics
from crewlet.engine.services import (
    Interval,
    Named,
    NoService,
    Service,
    Task,
    cancel_and_wait,
    ordered,
    periodic,
)
from crewlet.queue.contract import EventQueue, Timings
from crewlet.queue.emit import Emitter

log = logging.getLogger("crewlet.engine.core")

_T = TypeVar("_T")

#: A coroutine service: given the running engine, runs until cancelled (or returns early when it only had set-up to do).
ServiceFactory = Callable[["Engine"], Awaitable[None]]
#: Run at the start of a stop, once delivery is paused: turn away work that has not started.
StopHook = Callable[[], Awaitable[None]]


class Broker(Protocol):
    """What the engine needs of ``crewlet.queue.broker.EmbeddedBroker``."""

    @property
    def client_url(self) -> str:
        """Where it listens, without the credential."""

    async def stop(self) -> None: ...


class Connect(Protocol):
    """The signature of ``crewlet.queue.connect.connect_queue``."""

    def __call__(
        self,
        *,
        stream_type: str,
        url: str,
        store_dir: str,
        node: str,
        timings: Timings,
        event_retention_hours: float,
        replicas: int,
        max_consumers: int,
        cluster: Optional[ClusterSettings],
        cluster_secret: str,
        monitor_port: int,
        leaf: Optional[LeafSettings],
    ) -> Awaitable[tuple[EventQueue, Optional[Broker]]]: ...


def _default_connect() -> Connect:
    # Imported on first use: the engine module stays importable (Django checks,
    # settings tests) without loading nats-py or the broker code.
    from crewlet.queue.connect import connect_queue

    return connect_queue


def app_services(engine: "Engine") -> list[Service]:
    """Every installed app's services, in ``INSTALLED_APPS`` order (``AppConfig.engine_services``)."""
    from django.apps import apps

    found: list[Service] = []
    for config in apps.get_app_configs():
        contribute = getattr(config, "engine_services", None)
        if contribute is not None:
            found.extend(contribute(engine))
    return found


class Engine:
    """Runs the engine for one node until told to stop, then drains.

    ``company`` is the company holder the node serves (services read it);
    ``connect`` and ``timings`` are injectable so tests run the real lifecycle
    against a twin in seconds; production uses the defaults.
    """

    def __init__(
        self,
        settings: EngineSettings,
        *,
        company: Any = None,
        timings: Optional[Timings] = None,
        drain_timeout_s: float = 30.0,
        connect: Optional[Connect] = None,
    ) -> None:
        self.settings = settings
        self.company = company
        self.timings = timings or Timings()
        self.drain_timeout_s = drain_timeout_s
        self._connect = connect
        self._registered: list[Service] = []
        self._running: list[tuple[Service, Lifecycle]] = []
        self._provided: dict[str, Any] = {}
        self._stop_hooks: list[StopHook] = []
        self._starting: Optional[asyncio.Task[None]] = None
        self._stop: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._signals = 0
        self._drain_task: Optional[asyncio.Task[bool]] = None
        self._skip_drain = False
        self._failed = False
        #: Why the queue could not be connected at start, when it could not (what a command tells its user).
        self.start_error: Optional[BaseException] = None
        self.queue: Optional[EventQueue] = None
        self.broker: Optional[Broker] = None
        self.emitter: Optional[Emitter] = None
        #: This engine's Prometheus registry and the queue observer that fills it (``GET /metrics``).
        self.metrics = EngineMetrics(self)

    # -- registry ---------------------------------------------------------

    def add(self, service: Service) -> None:
        """Register ``service``; started once the queue is connected and its dependencies run."""
        if self._stop is not None:
            raise RuntimeError("services must be added before the engine starts")
        if any(s.name == service.name for s in self._registered):
            raise RuntimeError(f"engine service {service.name!r} is registered twice")
        self._registered.append(service)

    def add_service(
        self,
        factory: ServiceFactory,
        *,
        name: Optional[str] = None,
        stop_first: bool = False,
        depends_on: tuple[Named, ...] = (),
    ) -> None:
        """Register a coroutine that runs until cancelled (a :class:`Task`); one that raises stops the engine."""
        label = name or str(getattr(factory, "__name__", repr(factory)))
        self.add(
            Service(
                label,
                lambda engine: Task(label, lambda: factory(engine), engine._service_failed),
                depends_on=depends_on,
                stop_first=stop_first,
            )
        )

    def add_periodic(
        self,
        name: str,
        every_s: Interval,
        fn: Callable[[], Awaitable[Any]],
        *,
        depends_on: tuple[Named, ...] = (),
        first_after_s: float = 0.0,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        """Register a :class:`~crewlet.engine.services.Periodic` duty: ``fn`` now (or after ``first_after_s``) and every ``every_s``."""
        self.add(periodic(name, every_s, fn, depends_on=depends_on, first_after_s=first_after_s, logger=logger))

    @property
    def registered(self) -> list[Service]:
        """The services registered so far, in registration order."""
        return list(self._registered)

    def add_stop_hook(self, hook: StopHook) -> None:
        """Run ``hook`` at the start of a stop, right after delivery pauses.

        For work a service holds that has not started yet (a turn waiting at
        the concurrency gate): it is handed back at once rather than started
        during the drain or held until the drain's deadline. A service adds it
        once it is running; a hook that raises is logged and the stop goes on.
        """
        self._stop_hooks.append(hook)

    def provide(self, key: ServiceKey[_T], thing: _T) -> None:
        """Hand out ``thing`` under ``key`` without the engine starting it (a test's own runtime)."""
        self._provided[key.name] = thing

    def get(self, key: ServiceKey[_T]) -> _T:
        """What the running service under ``key`` made; :class:`NoService` when none runs under its name.

        For a service's factory whose dependency the engine started first
        (``depends_on``): its absence is a wiring fault, not a state to handle.
        """
        found = self.find(key)
        if found is None:
            raise NoService(f"no {key.name} service runs in this engine")
        return found

    def find(self, key: ServiceKey[_T]) -> Optional[_T]:
        """What the running service under ``key`` made, or None (a service that is optional to the asker).

        The registry holds what each service's factory made, and a factory
        registered under ``key`` makes what ``key`` provides (``Service``
        checks it): so what is found is a ``_T``.
        """
        found: Optional[_T] = self._provided.get(key.name)
        return found

    def duties(self) -> dict[str, bool]:
        """Every running service by name, with whether it is alive (``/readyz``, ``crewlet_engine_service_up``).

        A service that runs a task says so through ``alive``; one that runs
        several (the seat runtime) through ``healthy()``; one with neither is
        alive while it runs.
        """
        found: dict[str, bool] = {}
        for name, thing in list(self._provided.items()):
            healthy = getattr(thing, "healthy", None)
            if callable(healthy):
                found[name] = bool(healthy())
            else:
                found[name] = bool(getattr(thing, "alive", True))
        return found

    def status_reports(self) -> dict[str, dict[str, Any]]:
        """What each running service that reports its own state (``status_report()``) says, by service name.

        ``/readyz`` lists each as a component (``ok`` and ``state``, plus
        what the service adds: a surface's socket says whether it is
        connected, its last frame and its last error) and the dashboard's
        overview shows them; the engine names no app to get them.
        """
        found: dict[str, dict[str, Any]] = {}
        for name, thing in list(self._provided.items()):
            report = getattr(thing, "status_report", None)
            if callable(report):
                found[name] = dict(report())
        return found

    @property
    def loop(self) -> Optional[asyncio.AbstractEventLoop]:
        """The loop the engine serves on (None before :meth:`serve` or :meth:`bind_queue`)."""
        return self._loop

    def bind_queue(self, queue: Optional[EventQueue], loop: Optional[asyncio.AbstractEventLoop] = None) -> "Engine":
        """Make this engine a registry around ``queue`` on ``loop`` (default: the running one, if any) without serving.

        For code that runs services by hand (tests): with :func:`crewlet.engine.runtime.attach`
        the process then answers as it does while the engine serves.
        """
        self.queue = queue
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._loop = loop
        return self

    def call(self, make: Callable[[], Awaitable[_T]], timeout_s: float) -> _T:
        """From another thread: run ``make()`` on the engine's loop and wait for it (:func:`crewlet.engine.runtime.call_on_loop`)."""
        return runtime.call_on_loop(make, self._loop, timeout_s)

    # -- lifecycle --------------------------------------------------------

    def run(self) -> int:
        """Own a fresh event loop until stopped; returns the process exit status (0 = clean)."""
        return asyncio.run(self.serve())

    def stop(self) -> None:
        """Ask a serving engine to stop and drain; safe from any thread or signal handler."""
        loop = self._loop
        if loop is None or self._stop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._stop.set()
        else:
            loop.call_soon_threadsafe(self._stop.set)

    def _service_failed(self, name: str, exc: BaseException) -> None:
        self._failed = True
        self.stop()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("engine_stopping", extra={"signal": signal.Signals(signum).name})
            self.stop()
        elif not self._skip_drain:
            # A second signal means "now": stop waiting for handlers in flight,
            # whether the drain has begun or the web server is still stopping.
            self._skip_drain = True
            log.warning("engine_drain_skipped", extra={"signal": signal.Signals(signum).name})
            if self._drain_task is not None and not self._drain_task.done():
                self._drain_task.cancel()

    async def serve(self) -> int:
        """Connect, start the services in order, wait for a stop, drain. Returns the exit status."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        installed = self._install_signal_handlers()
        node = self.settings.node.id
        stream = self.settings.stream
        try:
            try:
                plan = ordered(self._registered)
            except RuntimeError:
                log.exception("engine_start_failed", extra={"node": node})
                return 1
            try:
                connect = self._connect or _default_connect()
                self.queue, self.broker = await connect(
                    stream_type=stream.type,
                    url=stream.url,
                    store_dir=stream.store_dir,
                    node=node,
                    timings=self.timings,
                    event_retention_hours=stream.event_retention_hours,
                    replicas=stream.replicas,
                    max_consumers=stream.max_consumers,
                    cluster=stream.cluster if stream.cluster.enabled else None,
                    cluster_secret=cluster_secret() if stream.cluster.enabled or stream.leaf.enabled else "",
                    monitor_port=stream.monitor_port,
                    leaf=stream.leaf if stream.leaf.enabled else None,
                )
            except Exception as exc:
                # connect_queue stops a broker it started before failing; nothing to tear down here.
                self.start_error = exc
                log.exception("engine_start_failed", extra={"node": node, "stream_type": stream.type})
                return 1
            self.queue.add_observer(self.metrics)
            self.emitter = Emitter(self.queue)
            log.info(
                "engine_started",
                extra={
                    "node": node,
                    "stream_type": stream.type,
                    "broker_url": self._broker_url(),
                    "store_dir": stream.store_dir or ("(the members')" if stream.leaf.enabled else "(memory)"),
                    "backend": self.queue.name,
                    "services": len(plan),
                },
            )
            runtime.attach(self)
            self._starting = asyncio.create_task(self._start_all(plan), name="engine:start")
            await self._stop.wait()
            await self._shutdown()
            log.info("engine_stopped", extra={"node": node, "clean": not self._failed})
            return 1 if self._failed else 0
        finally:
            runtime.detach(self)
            for signum in installed:
                self._loop.remove_signal_handler(signum)

    async def _start_all(self, plan: list[Service]) -> None:
        """Start each service after those it depends on; one that fails to start stops the engine."""
        for service in plan:
            try:
                thing: Lifecycle = service.make(self)
                self._running.append((service, thing))
                self._provided[service.name] = thing
                await thing.start()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine_service_failed", extra={"service": service.name})
                self._failed = True
                self.stop()
                return

    async def _shutdown(self) -> None:
        """Drain in the order that loses nothing and delays nothing.

        Fetching stops first, and with it everything fetched that no handler
        is working on goes back to the broker at once, so another node (or
        the next start) has it in milliseconds; then the stop hooks turn away
        what waits to start; then the web server stops taking requests (a
        publish still works: the queue stays open); then the handlers in
        flight get ``drain_timeout_s``. Whatever they still hold after that
        is handed back when the queue closes, not left to the ack clock; the
        close cancels those handlers and waits for them, and only then do the
        ``stop_last`` services stop (the fleet membership gives back the seat
        leases those handlers worked under).
        """
        queue = self.queue
        assert queue is not None
        try:
            await queue.pause_delivery()
        except Exception:
            log.exception("engine_pause_delivery_failed")
        for hook in list(self._stop_hooks):
            try:
                await hook()
            except Exception:
                log.exception("engine_stop_hook_failed", extra={"hook": getattr(hook, "__qualname__", repr(hook))})
        if self._starting is not None:
            await cancel_and_wait([self._starting])  # a stop during start-up: what started is stopped below
        await self._stop_services(front=True)
        try:
            self._drain_task = asyncio.create_task(queue.wait_idle(0.0 if self._skip_drain else self.drain_timeout_s))
            idle = await self._drain_task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the engine itself is being cancelled, not just the drain
            idle = False
        except Exception:
            log.exception("engine_drain_failed")
            idle = False
        if not idle:
            log.warning("engine_drain_incomplete", extra={"in_flight": queue.in_flight(), "timeout_s": self.drain_timeout_s})

        await self._stop_services()
        if self.emitter is not None:
            try:
                await self.emitter.close()
            except Exception:
                log.exception("engine_emitter_close_failed")
        runtime.detach(self)
        try:
            if idle:
                await queue.close()
            else:  # the handlers had their grace: cancel them now, their mail goes back
                await queue.close(grace_s=0.0)
        except Exception:
            log.exception("engine_queue_close_failed")
        await self._stop_services(last=True)
        await self._stop_broker()
        await self._flush_spans()

    async def _flush_spans(self) -> None:
        """Export the spans still batched, so a clean stop's last requests and turns reach the collector."""
        from crewlet.events.tracing import flush_spans

        try:
            await asyncio.to_thread(flush_spans)
        except Exception:
            log.exception("engine_span_flush_failed")

    async def _stop_services(self, *, front: bool = False, last: bool = False) -> None:
        """Stop the running services of one kind, the last started first; a stop that raises is logged."""
        for service, thing in reversed(list(self._running)):
            if service.stop_first != front or service.stop_last != last:
                continue
            self._running.remove((service, thing))
            if self._provided.get(service.name) is thing:
                del self._provided[service.name]
            try:
                await thing.stop()
            except Exception:
                log.exception("engine_service_stop_failed", extra={"service": service.name})

    async def _stop_broker(self) -> None:
        if self.broker is None:
            return
        try:
            await self.broker.stop()
        except Exception:
            log.exception("engine_broker_stop_failed")

    def _broker_url(self) -> str:
        """Where the queue connected, without credentials (redacted here too: a URL may carry them)."""
        url = self.broker.client_url if self.broker is not None else self.settings.stream.url
        return redact_url(url)

    def _install_signal_handlers(self) -> list[signal.Signals]:
        assert self._loop is not None
        installed = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._loop.add_signal_handler(signum, self._on_signal, signum)
            except (NotImplementedError, RuntimeError, ValueError):
                continue  # not the main thread (tests drive stop() instead)
            installed.append(signum)
        return installed


__all__ = ["Engine", "ServiceFactory", "StopHook", "app_services"]
