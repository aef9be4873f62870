"""The JetStream transport assembled from its parts, its connection's life, and ``JetStreamQueue``."""
from __future__ import annotations

import asyncio
import logging
from typing import TypedDict, Unpack

import nats.errors

from crewlet.base.aio import close_each, keeping_cancel
from crewlet.queue import topics
from crewlet.queue.contract import MAX_PAYLOAD_BYTES, EventQueue, Timings
from crewlet.queue.errors import InvalidArgument, Unavailable
from crewlet.queue.jetstream.ask_serve import AskServePart
from crewlet.queue.jetstream.broadcast import BroadcastPart, _Broadcast
from crewlet.queue.jetstream.configs import MAX_MESSAGE_BYTES
from crewlet.queue.jetstream.consumers import ConsumersPart
from crewlet.queue.jetstream.dead_letters import DeadLettersPart
from crewlet.queue.jetstream.snapshots import SnapshotsPart
from crewlet.queue.jetstream.subjects import SubjectsPart
from crewlet.queue.jetstream.wire import redact_url
from crewlet.queue.natsclient import LatePongClient

logger = logging.getLogger(__name__)


class ConnectOptions(TypedDict, total=False):
    """What :meth:`JetStreamTransport.connect` takes beside the url (its defaults apply to what is left out).

    :meth:`JetStreamQueue.connect` takes the same, so the two never drift apart.
    """

    node: str
    timings: Timings
    event_retention_hours: float
    memory_storage: bool
    replicas: int
    max_consumers: int
    connect_timeout_s: float
    reconnect_wait_s: float
    api_timeout_s: float
    provision_wait_s: float


class JetStreamTransport(ConsumersPart, DeadLettersPart, BroadcastPart, AskServePart, SubjectsPart, SnapshotsPart):
    """The JetStream broker primitives under :class:`~crewlet.queue.client.QueueClient`."""

    name = "jetstream"
    #: A fetch is one pull request on the wire that the broker answers the moment
    #: mail arrives, and the client interrupts it when its gate closes; a lost
    #: connection ends it at the disconnect, and a consumer deleted or moved to
    #: another leader ends it with a 409. So its expiry is only what an idle
    #: attachment costs: one request per attachment per ``poll_s``, which a
    #: company of thousands of idle seats pays in requests per second.
    poll_s = 60.0

    # -- connecting ---------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        node: str = "",
        timings: Timings = Timings(),
        event_retention_hours: float = topics.DEFAULT_EVENT_RETENTION_HOURS,
        memory_storage: bool = False,
        replicas: int = 1,
        max_consumers: int = topics.DEFAULT_MAX_CONSUMERS,
        connect_timeout_s: float = 5.0,
        reconnect_wait_s: float = 0.25,
        api_timeout_s: float = 5.0,
        provision_wait_s: float = 0.0,
    ) -> "JetStreamTransport":
        """Dial ``url`` (credentials may ride in it), provision the engine's streams.

        The first dial fails fast (``Unavailable``); once connected the client
        reconnects forever, ``reconnect_wait_s`` apart. ``provision_wait_s``:
        how long provisioning asks again a starting cluster that cannot yet
        place or answer about a stream (0: fail at once).
        """
        if not isinstance(url, str) or not url.strip():
            raise InvalidArgument("url: a nats:// URL is required")
        servers = [u.strip() for u in url.split(",") if u.strip()]
        nc = LatePongClient()
        self = cls(
            nc,
            timings=timings,
            event_retention_hours=event_retention_hours,
            memory_storage=memory_storage,
            replicas=replicas,
            max_consumers=max_consumers,
            api_timeout_s=api_timeout_s,
            url=url,
            provision_wait_s=provision_wait_s,
        )
        try:
            await keeping_cancel(asyncio.wait_for(
                nc.connect(
                    servers=servers,
                    name=f"crewlet:{node}" if node else "crewlet",
                    allow_reconnect=False,  # the first dial fails fast; reconnection is enabled below
                    connect_timeout=max(int(connect_timeout_s), 1),
                    reconnect_time_wait=reconnect_wait_s,  # type: ignore[arg-type]  # nats-py annotates its seconds as int and uses them as float (asyncio.wait_for, sleep)
                    # nats-py's first dial retries forever unless this is > 0 (its server
                    # pool only drops a server past it); unlimited is set once connected.
                    max_reconnect_attempts=2,
                    ping_interval=10,
                    max_outstanding_pings=3,
                    pending_size=2 * MAX_MESSAGE_BYTES,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    closed_cb=self._on_closed,
                ),
                timeout=connect_timeout_s * 2,
            ))
        except (Exception, asyncio.CancelledError) as e:
            try:
                await nc.close()
            except Exception:
                pass
            if isinstance(e, asyncio.CancelledError):
                raise
            raise Unavailable(f"cannot reach the broker at {redact_url(url)}: {e!r}") from e
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = -1
        self._connected.set()
        if nc.max_payload < MAX_PAYLOAD_BYTES:
            logger.warning(
                "jetstream_max_payload_small",
                extra={"server_max_payload": nc.max_payload, "contract_max_payload": MAX_PAYLOAD_BYTES},
            )
        try:
            await self.provision()
        except BaseException:
            await self.close()
            raise
        logger.info(
            "jetstream_connected",
            extra={"url": self._url, "node": node, "memory_storage": self.memory_storage},
        )
        return self

    async def _on_error(self, e: Exception) -> None:
        if isinstance(e, nats.errors.SlowConsumerError):
            logger.warning("jetstream_slow_consumer", extra={"subject": getattr(e, "subject", "")})
        else:
            logger.debug("jetstream_connection_error", extra={"error": repr(e)})

    async def _on_disconnected(self) -> None:
        self._connected.clear()
        self._disconnects += 1
        if not self._closed:
            logger.warning("jetstream_disconnected", extra={"url": self._url})
        self._kick_all()

    async def _on_reconnected(self) -> None:
        # The broker may be a new one (memory storage): provision again on demand.
        self._ready_streams.clear()
        self._connected.set()
        logger.info("jetstream_reconnected", extra={"url": self._url})
        # No kick here: every wait on a request of the old connection was ended at
        # the disconnect, and a fetch made since is a good request on the new one.

    def _kick_all(self) -> None:
        """A pull request on the wire did not survive the connection: end every wait on one."""
        for puller in list(self._pullers):
            puller.interrupt()
        for closable in list(self._closables):
            if isinstance(closable, _Broadcast):
                closable.kick()

    async def _on_closed(self) -> None:
        self._connected.clear()

    # -- closing ------------------------------------------------------------------------

    def sever(self) -> None:
        """What a killed process leaves behind: the connection drops without another byte.

        Nothing buffered (an ack, a hand-back, an in-progress signal) reaches
        the broker and the client does not reconnect, so the broker gets this
        client's mail back only when each message's ack clock runs out.
        """
        self._nc.options["allow_reconnect"] = False
        self._nc._pending = []  # nats-py's write buffer: dropped, as a killed process's would be
        self._nc._pending_data_size = 0
        writer = getattr(self._nc._transport, "_io_writer", None)
        if writer is not None:
            writer.transport.abort()

    async def close(self) -> None:
        if self._closed:
            return
        await close_each(self._pullers, logger, "jetstream_puller_close_failed")
        await close_each(self._closables, logger, "jetstream_close_failed")
        self._closables.clear()
        self._closed = True
        if not self._nc.is_closed:
            try:
                if self._nc.is_connected:
                    await self._nc.flush(timeout=2)
            except Exception:
                pass
            try:
                await self._nc.close()
            except Exception:
                logger.debug("jetstream_nats_close_failed", exc_info=True)
        logger.info("jetstream_closed", extra={"url": self._url})


#: The node a :class:`JetStreamQueue` names when its caller names none.
DEFAULT_NODE = "n1"


class JetStreamQueue:
    """The JetStream-backed :class:`~crewlet.queue.contract.EventQueue`."""

    name = "jetstream"

    @staticmethod
    async def connect(url: str, **options: Unpack[ConnectOptions]) -> EventQueue:
        """Dial ``url``, provision the streams, and return the shared client over JetStream.

        ``options`` are the transport's (:class:`ConnectOptions`); the node is
        ``n1`` when none is named, and the client keeps the transport's timings.
        """
        from crewlet.queue.client import QueueClient

        options.setdefault("node", DEFAULT_NODE)
        transport = await JetStreamTransport.connect(url, **options)
        return QueueClient(transport, node=options["node"], timings=transport.timings)
