"""nats-py's client, made to survive a PONG that arrives after its PING was given up on.

nats-py answers each PONG by taking the oldest waiting PING's future off its
queue and setting its result. A ``flush()`` that times out (a health round
trip on a frozen or slow broker, an ordered flush behind a Nak) cancels its
future but leaves it on that queue; when the broker answers late, the
PONG's ``set_result`` on the cancelled future raises ``InvalidStateError``
inside the client's read loop, which ends the loop. The socket stays open and
the client still says it is connected, but nothing it receives is read any
more: every request and publish times out, and ``flush()`` (which skips the
round trip once its loops are gone) reports success, until the
stale-connection check (``ping_interval`` × ``max_outstanding_pings``) forces a
reconnect tens of seconds later. A PONG for a PING nobody waits for is
simply consumed here, as the protocol means it to be; and a read loop that
ends on any other error while the client still counts itself connected
forces a reconnect at once instead of leaving the connection deaf.
"""
from __future__ import annotations

import asyncio
import logging

import nats.errors
from nats.aio.client import Client

log = logging.getLogger("crewlet.queue.natsclient")

#: Log event: the read loop ended on an error of its own while connected; a reconnect follows.
LOG_READ_LOOP_ENDED = "nats_read_loop_ended"


class LatePongClient(Client):
    """The nats-py client whose read loop a late PONG cannot end, and whose ended read loop means a reconnect."""

    async def _process_pong(self) -> None:
        """Consume the PONG for the oldest PING; a PING whose waiter gave up gets a fresh future to resolve."""
        if self._pongs and self._pongs[0].done():
            self._pongs[0] = asyncio.get_running_loop().create_future()
        await super()._process_pong()

    async def _read_loop(self) -> None:
        """nats-py's read loop; if it ends while the client is still connected, reconnect.

        nats-py stops reading on an unexpected exception (after logging it)
        and tells nobody. A close or a reconnect changes the status before it
        stops the loop, so a loop that ends with the status still connected
        ended on such an error: treat it as a stale connection.
        """
        await super()._read_loop()
        if self.is_connected:
            log.warning(LOG_READ_LOOP_ENDED, extra={"action": "reconnect"})
            await self._process_op_err(nats.errors.StaleConnectionError())


__all__ = ["LOG_READ_LOOP_ENDED", "LatePongClient"]
