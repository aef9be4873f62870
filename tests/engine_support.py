"""What the engine tests and the ``up`` tests share: an engine on the in-memory twin instead of a broker."""
from __future__ import annotations

from typing import Any, Callable, Optional

from crewlet.conf import load_settings
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
