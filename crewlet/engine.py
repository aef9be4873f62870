"""The engine worker: one asyncio loop that owns the queue connection and the services on it.

``manage.py up`` and ``manage.py runconsumers`` are thin shells around
:meth:`Engine.run`. The engine connects the queue (starting the embedded broker
when ``stream.type`` is ``embedded``), starts every registered service as a
task, and on SIGTERM/SIGINT drains: it stops fetching (the queue hands back at
once what no handler is working on), runs the stop hooks (the seat runtime's
concurrency gate turns away what waits at it), stops the front services, waits
for handlers in flight, cancels the services, closes the queue (handing back
the mail of any handler that outlived the drain) and stops the broker. Later
issues plug the inbox loops, sweeps and the scheduler in with
:meth:`Engine.add_service`; nothing here knows what they are.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Awaitable, Callable, Optional, Protocol

from crewlet.conf import EngineSettings, redact_url
from crewlet.queue.contract import EventQueue, Timings

log = logging.getLogger("crewlet.engine")

#: A service: given the running engine, a coroutine that runs until cancelled
#: (or returns early when it only had set-up to do).
ServiceFactory = Callable[["Engine"], Awaitable[None]]
#: Run at the start of a stop, once delivery is paused: turn away work that has not started.
StopHook = Callable[[], Awaitable[None]]

#: A service still running this long after its cancellation is cancelled again.
RECANCEL_AFTER_S = 5.0


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
    ) -> Awaitable[tuple[EventQueue, Optional[Broker]]]: ...


def _default_connect() -> Connect:
    # Imported on first use: the engine module stays importable (Django checks,
    # settings tests) without loading nats-py or the broker code.
    from crewlet.queue.broker import connect_queue

    return connect_queue


class Engine:
    """Runs the engine for one node until told to stop, then drains.

    ``connect`` and ``timings`` are injectable so tests run the real lifecycle
    against a twin in seconds; production uses the defaults.
    """

    def __init__(
        self,
        settings: EngineSettings,
        *,
        timings: Optional[Timings] = None,
        drain_timeout_s: float = 30.0,
        connect: Optional[Connect] = None,
    ) -> None:
        self.settings = settings
        self.timings = timings or Timings()
        self.drain_timeout_s = drain_timeout_s
        self._connect = connect
        self._factories: list[tuple[str, ServiceFactory, bool]] = []
        self._stop_hooks: list[StopHook] = []
        self._services: list[asyncio.Task[None]] = []
        self._front: list[asyncio.Task[None]] = []
        self._stop: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._signals = 0
        self._drain_task: Optional[asyncio.Task[bool]] = None
        self._skip_drain = False
        self._failed = False
        self.queue: Optional[EventQueue] = None
        self.broker: Optional[Broker] = None

    # -- registry ---------------------------------------------------------

    def add_service(self, factory: ServiceFactory, *, name: Optional[str] = None, stop_first: bool = False) -> None:
        """Register a long-running duty, started once the queue is connected.

        A service that raises stops the engine with a failure: a duty that died
        silently would leave a node that looks healthy and does nothing.
        ``stop_first`` services (the web server) are cancelled and awaited at the
        very start of a stop, before the drain, so nothing new comes in while the
        loops finish what they hold; the queue is still open while they wind down.
        """
        if self._stop is not None:
            raise RuntimeError("add_service() must be called before the engine starts")
        self._factories.append((name or str(getattr(factory, "__name__", repr(factory))), factory, stop_first))

    def add_stop_hook(self, hook: StopHook) -> None:
        """Run ``hook`` at the start of a stop, right after delivery pauses.

        For work a service holds that has not started yet (a turn waiting at
        the concurrency gate): it is handed back at once rather than started
        during the drain or held until the drain's deadline. A service adds it
        once it is running; a hook that raises is logged and the stop goes on.
        """
        self._stop_hooks.append(hook)

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
        """Connect, run the services, wait for a stop, drain. Returns the exit status."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        installed = self._install_signal_handlers()
        node = self.settings.node.id
        stream = self.settings.stream
        try:
            try:
                connect = self._connect or _default_connect()
                self.queue, self.broker = await connect(
                    stream_type=stream.type,
                    url=stream.url,
                    store_dir=stream.store_dir,
                    node=node,
                    timings=self.timings,
                    event_retention_hours=stream.event_retention_hours,
                )
            except Exception:
                # connect_queue stops a broker it started before failing; nothing to tear down here.
                log.exception("engine_start_failed", extra={"node": node, "stream_type": stream.type})
                return 1

            log.info(
                "engine_started",
                extra={
                    "node": node,
                    "stream_type": stream.type,
                    "broker_url": self._broker_url(),
                    "store_dir": stream.store_dir or "(memory)",
                    "backend": self.queue.name,
                    "services": len(self._factories),
                },
            )
            from crewlet import runtime  # the process-wide handle on this queue (views, /healthz)

            runtime.set_queue(self.queue)
            for name, factory, stop_first in self._factories:
                task = asyncio.create_task(self._run_service(name, factory), name=f"service:{name}")
                (self._front if stop_first else self._services).append(task)
            await self._stop.wait()
            await self._shutdown()
            log.info("engine_stopped", extra={"node": node, "clean": not self._failed})
            return 1 if self._failed else 0
        finally:
            for signum in installed:
                self._loop.remove_signal_handler(signum)

    async def _run_service(self, name: str, factory: ServiceFactory) -> None:
        try:
            await factory(self)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("engine_service_failed", extra={"service": name})
            self._failed = True
            self.stop()

    async def _shutdown(self) -> None:
        """Drain in the order that loses nothing and delays nothing.

        Fetching stops first, and with it everything fetched that no handler
        is working on goes back to the broker at once, so another node (or
        the next start) has it in milliseconds; then the stop hooks turn away
        what waits to start; then the web server stops taking requests (a
        publish still works: the queue stays open); then the handlers in
        flight get ``drain_timeout_s``. Whatever they still hold after that
        is handed back when the queue closes, not left to the ack clock.
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
        await self._cancel_services(self._front)
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

        await self._cancel_services(self._services)
        from crewlet import runtime

        runtime.clear_queue(queue)
        try:
            if idle:
                await queue.close()
            else:  # the handlers had their grace: cancel them now, their mail goes back
                await queue.close(grace_s=0.0)
        except Exception:
            log.exception("engine_queue_close_failed")
        await self._stop_broker()

    async def _cancel_services(self, tasks: list[asyncio.Task[None]]) -> None:
        """Cancel ``tasks`` and wait for them; cancel again any that swallowed the cancellation.

        A cancellation can be lost inside a library (Python 3.11's ``asyncio.wait_for``
        returns a result that raced with ``cancel()``): a service caught mid-start
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
