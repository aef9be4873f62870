"""eventstore: event rows, publish-listener writer, retention, REST API, /ws/stream, live projection, fleet reads (routed to the events database).

Importable before Django's apps are ready: the functions below import the
models they need when called.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from crewlet.queue.contract import EventQueue
    from eventstore.writer import EventWriter


def attach(queue: "EventQueue", **kwargs: Any) -> "EventWriter":
    """Register the event store writer as ``queue``'s publish listener (see :mod:`eventstore.writer`)."""
    from eventstore.writer import attach as _attach

    return _attach(queue, **kwargs)


def install(engine: "Engine") -> None:
    """Register the store's services on an engine: the writer on its queue, the retention sweep, and the live projection.

    The projection (:mod:`eventstore.projection`) of ``engine.company`` (the
    one the engine serves) opens one broadcast stream of ``crewlet.events.>``
    and seeds itself from this node's store, so the dashboard and
    ``/ws/stream`` read the company's state in this process.
    """
    from eventstore.services import install as _install

    _install(engine)


__all__ = ["attach", "install"]
