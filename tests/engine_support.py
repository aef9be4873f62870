"""What the engine tests and the ``up`` tests share: an engine on the in-memory twin instead of a broker, and
an engine registry for tests that run services by hand, attached to the process as a serving engine is.

Views, ``/healthz`` and the pause and config-revision announcements find the
engine through :func:`crewlet.engine.runtime.engine`; a test that starts a seat
runtime, a projection or a notify service itself attaches one
(:func:`engine_here`) so they find its queue, its loop and its services.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

from crewlet.engine import runtime
from crewlet.company.loading import load_settings
from crewlet.engine.core import Engine
from crewlet.engine.interfaces import ServiceKey
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import load_company
from crewlet.queue.contract import EventQueue
from crewlet.queue.memory import MemoryBroker


class FakeBroker:
    """Stands in for the embedded broker: records that it was stopped."""

    def __init__(self, client_url: str = "nats://127.0.0.1:4222") -> None:
        self.client_url = client_url
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


def twin_connect(broker: FakeBroker, seen: Optional[dict[str, Any]] = None) -> Callable[..., Any]:
    """An ``Engine(connect=...)`` that hands out a client of a fresh in-memory twin, recording its arguments in ``seen``."""
    async def connect(**kwargs: Any) -> tuple[Any, FakeBroker]:
        if seen is not None:
            seen.update(kwargs)
        twin = MemoryBroker(kwargs["timings"], event_retention_hours=kwargs["event_retention_hours"])
        return twin.client(kwargs["node"]), broker

    return connect


def fast_settings(**overrides: Any) -> Any:
    """The engine settings with no environment or file: node n1, plus ``overrides``."""
    return load_settings({}, {}, overrides={"node.id": "n1", **overrides})


@contextlib.contextmanager
def engine_here(
    queue: Optional[EventQueue] = None,
    *,
    company: Any = None,
    node: str = "n1",
    services: Optional[dict[ServiceKey[Any], Any]] = None,
) -> Iterator[Engine]:
    """An engine around ``queue`` (on the running loop, if any) serving ``company`` with ``services``.

    ``company`` is a holder or an organization; the example company when not given.
    """
    if company is None:
        company = CompanyHolder(load_company())
    elif isinstance(company, Organization):
        company = CompanyHolder(company)
    engine = Engine(load_settings({}, env={}, overrides={"node.id": node}), company=company).bind_queue(queue)
    for key, thing in (services or {}).items():
        engine.provide(key, thing)
    runtime.attach(engine)
    try:
        yield engine
    finally:
        runtime.detach(engine)
