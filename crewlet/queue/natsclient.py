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
simply consumed here, as the protocol means it to be.
"""
from __future__ import annotations

import asyncio

from nats.aio.client import Client


class LatePongClient(Client):
    """The nats-py client whose read loop a late PONG cannot end."""

    async def _process_pong(self) -> None:
        """Consume the PONG for the oldest PING; a PING whose waiter gave up gets a fresh future to resolve."""
        if self._pongs and self._pongs[0].done():
            self._pongs[0] = asyncio.get_running_loop().create_future()
        await super()._process_pong()


__all__ = ["LatePongClient"]
