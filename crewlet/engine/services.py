"""The engine's service primitives: what a service is, the two shapes every duty takes, and the order they start in.

A :class:`Service` is a key (or a plain name, for a duty nobody asks for),
the names it depends on, and a factory of a
:class:`~crewlet.engine.interfaces.Lifecycle` (``start()``/``stop()``);
:func:`ordered` puts a set of them in an order where each starts after what it
depends on. Two shapes cover every duty: :class:`Periodic` (run a duty now and
every ``every_s``, a failing pass logged and retried; :func:`periodic` makes
one a service) and :class:`Task` (a coroutine that runs until cancelled,
whose failure the engine hears of). :func:`cancel_and_wait` is how anything
here stops a task. The engine that runs them is :mod:`crewlet.engine.core`.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Optional, TypeVar, Union, overload

from crewlet.base.aio import keeping_cancel
from crewlet.engine.interfaces import Lifecycle, ServiceKey

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

#: The engine's own logger: a service that fails or will not stop is the engine's to report.
log = logging.getLogger("crewlet.engine.core")

_T = TypeVar("_T")

#: A periodic duty's interval: fixed seconds, or asked again after every pass (a schedule's next slot).
Interval = Union[float, Callable[[], float]]
#: What a service is registered under or depends on: its key, or its plain name.
Named = Union[ServiceKey[Any], str]

#: A task still running this long after its cancellation is cancelled again.
RECANCEL_AFTER_S = 5.0


def name_of(named: Named) -> str:
    """The registry's name for ``named`` (a key's name, or the name itself)."""
    return named if isinstance(named, str) else named.name


@dataclass(frozen=True, init=False)
class Service:
    """A named part of the engine.

    ``make(engine)`` builds the :class:`~crewlet.engine.interfaces.Lifecycle`
    once the queue is connected and every service named in ``depends_on`` has
    started (so it may ask the engine for them); what it builds is what the
    engine hands out under the service's name. Registered under a key
    (``Service(SEAT_RUNTIME, make)``), what ``make`` builds must be what the
    key provides, so whoever asks the engine for that key gets the type it
    names; a plain name is for a duty nobody asks for (a sweep, a surface's
    socket). ``depends_on`` and ``after`` take keys or names alike.

    ``stop_first`` services (the web server) stop at the very start of a stop,
    before the drain, so nothing new comes in while the loops finish what they
    hold. ``stop_last`` services (the fleet membership) stop only once the
    queue has closed: its close ends the handlers that outlived the drain, and
    until they have ended another node must not be let in on the seat leases
    they work under. ``after`` orders without requiring: the service starts
    after those names when the engine has them (a seat runtime after the event
    store's writer, so what it publishes is stored), and without them when it
    does not (a test's engine with the seats alone).
    """

    name: str
    make: Callable[["Engine"], Lifecycle]
    depends_on: tuple[str, ...]
    stop_first: bool
    after: tuple[str, ...]
    stop_last: bool

    @overload
    def __init__(
        self,
        key: ServiceKey[_T],
        make: Callable[["Engine"], _T],
        depends_on: Iterable[Named] = (),
        stop_first: bool = False,
        after: Iterable[Named] = (),
        stop_last: bool = False,
    ) -> None: ...

    @overload
    def __init__(
        self,
        key: str,
        make: Callable[["Engine"], Lifecycle],
        depends_on: Iterable[Named] = (),
        stop_first: bool = False,
        after: Iterable[Named] = (),
        stop_last: bool = False,
    ) -> None: ...

    def __init__(
        self,
        key: Named,
        make: Callable[["Engine"], Any],
        depends_on: Iterable[Named] = (),
        stop_first: bool = False,
        after: Iterable[Named] = (),
        stop_last: bool = False,
    ) -> None:
        object.__setattr__(self, "name", name_of(key))
        object.__setattr__(self, "make", make)
        object.__setattr__(self, "depends_on", tuple(name_of(n) for n in depends_on))
        object.__setattr__(self, "stop_first", stop_first)
        object.__setattr__(self, "after", tuple(name_of(n) for n in after))
        object.__setattr__(self, "stop_last", stop_last)


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
        *,
        once: bool = False,
    ) -> None:
        self.name = name
        self._run = run
        self._on_failure = on_failure
        #: A one-shot duty (an announcement at start): ending without an error is its success, not a death.
        self.once = once
        self._failed = False
        self._task: Optional[asyncio.Task[None]] = None

    @property
    def alive(self) -> bool:
        """Running — or, for a one-shot duty, ended without an error (what ``/readyz`` reads)."""
        if self._task is None:
            return False
        if not self._task.done():
            return True
        return self.once and not self._failed and not self._task.cancelled()

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
            self._failed = True
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


def periodic(
    name: str,
    every_s: Interval,
    fn: Callable[[], Awaitable[Any]],
    *,
    depends_on: Iterable[Named] = (),
    after: Iterable[Named] = (),
    first_after_s: float = 0.0,
    logger: Optional[logging.Logger] = None,
) -> Service:
    """A :class:`Periodic` duty as a service (what :meth:`~crewlet.engine.core.Engine.add_periodic` registers)."""
    return Service(
        name,
        lambda _engine: Periodic(name, every_s, fn, logger=logger, first_after_s=first_after_s),
        depends_on=depends_on,
        after=after,
    )


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


__all__ = [
    "Interval",
    "Lifecycle",
    "Named",
    "NoService",
    "Periodic",
    "RECANCEL_AFTER_S",
    "Service",
    "Task",
    "cancel_and_wait",
    "name_of",
    "ordered",
    "periodic",
]
