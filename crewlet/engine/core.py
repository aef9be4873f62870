"""The engine: one asyncio loop that owns the queue connection and the one registry of named services.

``manage.py up`` and ``manage.py runconsumers`` are thin shells around
:meth:`Engine.run`. Each installed app contributes its services from its
``AppConfig.engine_services(engine)`` (:func:`app_services` collects them), so
the commands name no app. A :class:`Service` is a name, the names it depends
on, and a factory of a :class:`Lifecycle` (``start()``/``stop()``): the engine
connects the queue (starting the embedded broker when ``stream.type`` is
``embedded``), starts every service after the ones it depends on, and hands
out what each started (:meth:`Engine.service`) — to other services and, through
:func:`crewlet.engine.runtime.engine`, to the request threads of the same process.
There is no other process-wide registry.

Two shapes cover every duty: :class:`Periodic` (run a duty now and every
``every_s``, a failing pass logged and retried; :meth:`Engine.add_periodic`)
and :class:`Task` (a coroutine that runs until cancelled, whose failure stops
the engine; :meth:`Engine.add_service`). The engine also owns the one
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
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Optional, Protocol, TypeVar, Union

from crewlet.base.aio import keeping_cancel
from crewlet.company.conf import ClusterSettings, EngineSettings, cluster_secret, redact_url
from crewlet.queue.emit import Emitter
from crewlet.engine.metrics import EngineMetrics
from crewlet.queue.contract import EventQueue, Timings

log = logging.getLogger("crewlet.engine.core")

_T = TypeVar("_T")

#: A coroutine service: given the running engine, runs until cancelled (or returns early when it only had set-up to do).
ServiceFactory = Callable[["Engine"], Awaitable[None]]
#: Run at the start of a stop, once delivery is paused: turn away work that has not started.
StopHook = Callable[[], Awaitable[None]]
#: A periodic duty's interval: fixed seconds, or asked again after every pass (a schedule's next slot).
Interval = Union[float, Callable[[], float]]

#: A task still running this long after its cancellation is cancelled again.
RECANCEL_AFTER_S = 5.0


class Lifecycle(Protocol):
    """What a service's factory makes: started once its dependencies run, stopped before they stop."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class Service:
    """A named part of the engine.

    ``make(engine)`` builds the :class:`Lifecycle` once the queue is connected
    and every service named in ``depends_on`` has started (so it may ask the
    engine for them); what it builds is what :meth:`Engine.service` hands out
    under ``name``. ``stop_first`` services (the web server) stop at the very
    start of a stop, before the drain, so nothing new comes in while the loops
    finish what they hold. ``stop_last`` services (the fleet membership) stop
    only once the queue has closed: its close ends the handlers that outlived
    the drain, and until they have ended another node must not be let in on
    the seat leases they work under. ``after`` orders without requiring: the service
    starts after those names when the engine has them (a seat runtime after
    the event store's writer, so what it publishes is stored), and without
    them when it does not (a test's engine with the seats alone).
    """

    name: str
    make: Callable[["Engine"], Lifecycle]
    depends_on: tuple[str, ...] = ()
    stop_first: bool = False
    after: tuple[str, ...] = ()
    stop_last: bool = False


class NoService(LookupError):
    """The engine runs no service of that name (not registered, not started yet, or stopped)."""


async def cancel_and_wait(tasks: Iterable["asyncio.Task[Any]"]) -> None:
    """Cancel ``tasks`` and wait for them; cancel again any that swallowed the cancellation.

    A cancellation can be lost inside a library (Python 3.11's ``asyncio.wait_for``
    returns a result that raced with ``cancel()``): a task caught mid-start
    would then run on and wedge the stop. One still running after
    ``RECANCEL_AFTER_S`` is cancelled again.
    """
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    while pending:
        _done, pending = await asyncio.wait(pending, timeout=RECANCEL_AFTER_S)
        for task in pending:
            log.warning("engine_service_cancelled_again", extra={"service": task.get_name()})
            task.cancel()


class Task:
    """A coroutine run as a task from ``start()`` until ``stop()`` cancels it.

    ``on_failure`` hears of an exception that ended it early (the engine's:
    stop with a failure, since a duty that died silently would leave a node
    that looks healthy and does nothing).
    """

    def __init__(
        self,
        name: str,
        run: Callable[[], Awaitable[None]],
        on_failure: Optional[Callable[[str, BaseException], None]] = None,
    ) -> None:
        self.name = name
        self._run = run
        self._on_failure = on_failure
        self._task: Optional[asyncio.Task[None]] = None

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def task(self) -> Optional["asyncio.Task[None]"]:
        """The running task (None before start and after stop)."""
        return self._task

    async def start(self) -> None:
        self._task = asyncio.create_task(self._guarded(), name=f"service:{self.name}")

    async def _guarded(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("engine_service_failed", extra={"service": self.name})
            if self._on_failure is not None:
                self._on_failure(self.name, exc)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])


class Periodic:
    """Run ``duty`` now (or after ``first_after_s``) and then every ``every_s`` until stopped.

    A pass that raises is logged as ``<name>_failed`` on ``logger`` and the
    next pass runs on time: a database hiccup must not stop the engine.
    :meth:`wake` runs the next pass at once (a nudge that something changed);
    ``pause`` is how it waits between passes (injectable so a test can count
    the intervals without living through them).
    """

    def __init__(
        self,
        name: str,
        every_s: Interval,
        duty: Callable[[], Awaitable[Any]],
        *,
        logger: Optional[logging.Logger] = None,
        first_after_s: float = 0.0,
        pause: Optional[Callable[[float], Awaitable[None]]] = None,
    ) -> None:
        self.name = name
        self.every_s = every_s
        self.duty = duty
        self.logger = logger or log
        self.first_after_s = first_after_s
        self._pause = pause or self._wait
        self._wake: Optional[asyncio.Event] = None
        self._task = Task(name, self.run)

    @property
    def alive(self) -> bool:
        return self._task.alive

    @property
    def task(self) -> Optional["asyncio.Task[None]"]:
        """The task running the passes (None before start and after stop)."""
        return self._task.task

    def interval_s(self) -> float:
        return self.every_s() if callable(self.every_s) else self.every_s

    def wake(self) -> None:
        """Run the next pass now rather than at the end of the interval (on the loop's thread)."""
        if self._wake is not None:
            self._wake.set()

    async def _wait(self, seconds: float) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        try:
            await keeping_cancel(asyncio.wait_for(self._wake.wait(), timeout=max(seconds, 0.0)))
        except asyncio.TimeoutError:
            pass

    async def run(self) -> None:
        """The passes, until cancelled (what :meth:`start` runs as a task)."""
        if self._wake is None:
            self._wake = asyncio.Event()
        if self.first_after_s > 0:
            await self._pause(self.first_after_s)
        while True:
            self._wake.clear()
            try:
                await self.duty()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.logger.exception(f"{self.name}_failed", extra={"duty": self.name})
            await self._pause(self.interval_s())

    async def start(self) -> None:
        await self._task.start()

    async def stop(self) -> None:
        await self._task.stop()


class Broker(Protocol):
    """What the engine needs of ``crewlet.queue.broker.EmbeddedBroker``."""

    @property
    def client_url(self) -> str:
        """Where it listens, without the credential."""

    async def stop(self) -> None: ...


class Connect(Protocol):
    """The signature of ``crewlet.queue.broker.connect_queue``."""

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
        cluster: Optional[ClusterSettings],
        cluster_secret: str,
    ) -> Awaitable[tuple[EventQueue, Optional[Broker]]]: ...


def periodic(
    name: str,
    every_s: Interval,
    fn: Callable[[], Awaitable[Any]],
    *,
    depends_on: tuple[str, ...] = (),
    after: tuple[str, ...] = (),
    first_after_s: float = 0.0,
    logger: Optional[logging.Logger] = None,
) -> Service:
    """A :class:`Periodic` duty as a service (what :meth:`Engine.add_periodic` registers)."""
    return Service(
        name,
        lambda _engine: Periodic(name, every_s, fn, logger=logger, first_after_s=first_after_s),
        depends_on=depends_on,
        after=after,
    )


def _default_connect() -> Connect:
    # Imported on first use: the engine module stays importable (Django checks,
    # settings tests) without loading nats-py or the broker code.
    from crewlet.queue.broker import connect_queue

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


def ordered(services: list[Service]) -> list[Service]:
    """``services`` in an order where each comes after what it depends on (else registration order).

    A dependency on a name no service has, or a cycle, is a programming error
    caught at start rather than a service waiting forever.
    """
    by_name = {s.name: s for s in services}
    out: list[Service] = []
    state: dict[str, int] = {}  # 1 = being placed, 2 = placed

    def place(service: Service, chain: tuple[str, ...]) -> None:
        if state.get(service.name) == 2:
            return
        if state.get(service.name) == 1:
            raise RuntimeError(f"engine services depend on each other in a cycle: {' -> '.join((*chain, service.name))}")
        state[service.name] = 1
        for dep in service.depends_on:
            if dep not in by_name:
                raise RuntimeError(f"engine service {service.name!r} depends on {dep!r}, which no installed app provides")
            place(by_name[dep], (*chain, service.name))
        for dep in service.after:
            if dep in by_name:
                place(by_name[dep], (*chain, service.name))
        state[service.name] = 2
        out.append(service)

    for service in services:
        place(service, ())
    return out


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
        depends_on: tuple[str, ...] = (),
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
        depends_on: tuple[str, ...] = (),
        first_after_s: float = 0.0,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        """Register a :class:`Periodic` duty: ``fn`` now (or after ``first_after_s``) and every ``every_s``."""
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

    def provide(self, name: str, thing: Any) -> None:
        """Hand out ``thing`` under ``name`` without the engine starting it (a test's own runtime)."""
        self._provided[name] = thing

    def service(self, name: str) -> Any:
        """What the running service ``name`` made; :class:`NoService` when none runs under that name."""
        try:
            return self._provided[name]
        except KeyError:
            raise NoService(f"no {name} service runs in this engine") from None

    def lookup(self, name: str) -> Any:
        """What the running service ``name`` made, or None (a service that is optional to the asker)."""
        return self._provided.get(name)

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
        from crewlet.engine.runtime import call_on_loop

        return call_on_loop(make, self._loop, timeout_s)

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
        from crewlet.engine import runtime  # the process's one handle on the running engine

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
                    cluster=stream.cluster if stream.cluster.enabled else None,
                    cluster_secret=cluster_secret() if stream.cluster.enabled else "",
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
                    "store_dir": stream.store_dir or "(memory)",
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
                thing = service.make(self)
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
        from crewlet.engine import runtime

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


__all__ = [
    "Engine",
    "Interval",
    "Lifecycle",
    "NoService",
    "Periodic",
    "Service",
    "ServiceFactory",
    "StopHook",
    "Task",
    "app_services",
    "cancel_and_wait",
    "ordered",
    "periodic",
]
