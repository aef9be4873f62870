"""The state every part of the JetStream transport shares, and the one JetStream API call.

``JetStreamTransport`` is assembled from parts, one module each (streams,
consumers, dead letters, broadcast, ask/serve); each part is a subclass of
this base, so every part sees the connection, the transport's settings and
``_api``, the call that turns an error answer of the JetStream API into
``_ApiError`` and a nats-py failure into ``Unavailable``.
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Optional

import nats.errors
from nats.aio.client import Client as NatsClient

from crewlet.base.aio import keeping_cancel
from crewlet.queue import topics
from crewlet.queue.contract import Timings
from crewlet.queue.errors import InvalidArgument, Unavailable
from crewlet.queue.jetstream.wire import API_PREFIX, api_request, redact_url
from crewlet.queue.transport import Transport

if TYPE_CHECKING:
    from crewlet.queue.jetstream.pull import JetStreamPuller


class TransportBase(Transport):
    """The connection, the settings and the API call under every part of ``JetStreamTransport``."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        timings: Timings = Timings(),
        event_retention_hours: float = topics.DEFAULT_EVENT_RETENTION_HOURS,
        memory_storage: bool = False,
        replicas: int = 1,
        max_consumers: int = topics.DEFAULT_MAX_CONSUMERS,
        api_timeout_s: float = 5.0,
        url: str = "",
        provision_wait_s: float = 0.0,
    ) -> None:
        if not (event_retention_hours > 0):
            raise InvalidArgument(f"event_retention_hours={event_retention_hours!r}: must be > 0")
        self._nc = nc
        self.timings = timings
        self.event_retention_hours = float(event_retention_hours)
        self.memory_storage = bool(memory_storage)
        self.replicas = max(int(replicas), 1)
        if isinstance(max_consumers, bool) or not isinstance(max_consumers, int) or max_consumers < 1:
            raise InvalidArgument(f"max_consumers={max_consumers!r}: must be an integer >= 1")
        #: The most durable consumers each stream provisioned here lets exist.
        self.max_consumers = max_consumers
        self._api_timeout_s = float(api_timeout_s)
        #: How long provisioning asks again a starting cluster that cannot yet place or answer about a stream.
        self.provision_wait_s = max(float(provision_wait_s), 0.0)
        #: Until when (the loop's clock) a consumer the cluster cannot answer about yet is asked
        #: again: ``provision_wait_s`` after provisioning began (0: never).
        self._settle_until = 0.0
        self._url = redact_url(url)
        self._ready_streams: set[str] = set()
        self._subject_streams: dict[str, topics.StreamSpec] = {}
        self._provision_lock = asyncio.Lock()
        self._pullers: set[JetStreamPuller] = set()
        self._closables: set[Any] = set()
        self._connected = asyncio.Event()
        #: Connections lost so far: an answer awaited across a change of it was lost with its connection.
        self._disconnects = 0
        #: Reply subscriptions of abandoned pull requests whose UNSUB is not yet confirmed.
        self._unsub_pending = 0
        self._closed = False

    async def _wait_connected(self, timeout_s: float) -> bool:
        try:
            await keeping_cancel(asyncio.wait_for(self._connected.wait(), timeout=timeout_s))
        except asyncio.TimeoutError:
            return False
        return True

    @property
    def is_connected(self) -> bool:
        return self._nc.is_connected

    async def round_trip(self, timeout_s: float) -> None:
        """A PING answered by a PONG within ``timeout_s``; anything else is ``Unavailable``."""
        if not self._nc.is_connected:
            raise Unavailable("the broker is disconnected")
        try:
            await asyncio.wait_for(self._nc.flush(timeout=max(timeout_s, 0.001)), timeout_s)  # type: ignore[arg-type]  # nats-py annotates its seconds as int and uses them as float (asyncio.wait_for, sleep)
        except (asyncio.TimeoutError, nats.errors.Error) as exc:
            raise Unavailable(f"the broker did not answer a round trip within {timeout_s:g} s") from exc

    def _require_connected(self) -> None:
        if self._closed:
            raise Unavailable("the JetStream transport is closed")
        if not self._nc.is_connected:
            raise Unavailable(f"not connected to the broker at {self._url} (reconnecting)")

    # -- the JetStream API ----------------------------------------------------------

    async def _api(
        self, suffix: str, body: Optional[dict[str, Any]], *, what: str = "", timeout: Optional[float] = None
    ) -> dict[str, Any]:
        self._require_connected()
        payload = json.dumps(body).encode() if body is not None else b""
        return await api_request(self._nc, f"{API_PREFIX}.{suffix}", payload, timeout or self._api_timeout_s, what or suffix)

    async def _consumer_info(self, stream: str, consumer: str) -> dict[str, Any]:
        """The broker's view of one consumer; :class:`_ApiError` (``no_consumer``) when there is none."""
        return await self._api(f"CONSUMER.INFO.{stream}.{consumer}", None, what="consumer info")
