"""A throwaway reader of one stream: an ack-none consumer and an inbox subscription, both gone when the read is."""
from __future__ import annotations

import contextlib
import secrets
from typing import Any, AsyncIterator

from crewlet.queue import topics
from crewlet.queue.errors import QueueError, Unavailable
from crewlet.queue.jetstream.base import TransportBase
from crewlet.queue.jetstream.wire import _NATS_ERRORS, _NS, next_subject, pull_request


class Reader:
    """What a read asks with: the consumer's pending count when made, and its pull requests."""

    def __init__(self, part: TransportBase, spec: topics.StreamSpec, name: str, made: dict[str, Any], sub: Any, inbox: str) -> None:
        self._part, self._spec, self._name, self._inbox = part, spec, name, inbox
        self.pending = int(made.get("num_pending", 0) or 0)
        self.sub = sub

    async def pull(self, batch: int) -> None:
        """Ask for up to ``batch`` messages; the broker answers what it has, then a status."""
        await self._part._nc.publish(next_subject(self._spec.name, self._name), pull_request(batch, no_wait=True), reply=self._inbox)


@contextlib.asynccontextmanager
async def throwaway_reader(part: TransportBase, spec: topics.StreamSpec, config: dict[str, Any], what: str) -> AsyncIterator[Reader]:
    """A consumer of ``spec`` with ``config`` (deliver and filter), acknowledging nothing; deleted after the read.

    A broker error while reading is ``Unavailable`` naming ``what``.
    """
    name = "crewlet_read_" + secrets.token_hex(8)
    cfg = {"name": name, "ack_policy": "none", "inactive_threshold": int(30 * _NS), "replay_policy": "instant",
           "mem_storage": True, **config}
    made = await part._api(
        f"CONSUMER.CREATE.{spec.name}.{name}", {"stream_name": spec.name, "config": cfg, "action": "create"}, what=f"create {what}"
    )
    sub: Any = None
    try:
        inbox = part._nc.new_inbox()
        sub = await part._nc.subscribe(inbox, pending_msgs_limit=0, pending_bytes_limit=0)
        yield Reader(part, spec, name, made, sub, inbox)
    except _NATS_ERRORS as e:
        raise Unavailable(f"{what} failed: {e!r}") from e
    finally:
        if sub is not None and not part._nc.is_closed:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        try:
            await part._api(f"CONSUMER.DELETE.{spec.name}.{name}", None, what=f"delete {what}", timeout=2.0)
        except QueueError:
            pass
