"""The current message of every subject of a pattern, read in one pass; and a pattern's subjects purged.

For the streams that keep one message per subject (``CREWLET_MEMORY``): a
throwaway consumer at ``last_per_subject``, acknowledging nothing, pulled in
batches until it has served what it had pending when it was made.
"""
from __future__ import annotations

import secrets
from typing import Any

from crewlet.base.aio import keeping_cancel
from crewlet.queue import topics
from crewlet.queue.errors import QueueError, Unavailable
from crewlet.queue.jetstream.streams import StreamsPart
from crewlet.queue.jetstream.wire import _NATS_ERRORS, _NS, next_subject, pull_request

#: Messages asked for per pull request of a replay.
_REPLAY_BATCH = 1000


class SubjectsPart(StreamsPart):
    """Replay and purge by subject pattern on one stream."""

    async def read_subjects(self, spec: topics.StreamSpec, pattern: str) -> list[tuple[str, bytes]]:
        await self._ensure_stream(spec)
        name = "crewlet_replay_" + secrets.token_hex(8)
        cfg = {
            "name": name,
            "deliver_policy": "last_per_subject",
            "filter_subject": pattern,
            "ack_policy": "none",
            "inactive_threshold": int(30 * _NS),
            "replay_policy": "instant",
            "mem_storage": True,
        }
        made = await self._api(
            f"CONSUMER.CREATE.{spec.name}.{name}",
            {"stream_name": spec.name, "config": cfg, "action": "create"},
            what=f"create a replay of {pattern}",
        )
        pending = int(made.get("num_pending", 0) or 0)
        out: list[tuple[str, bytes]] = []
        sub: Any = None
        try:
            inbox = self._nc.new_inbox()
            sub = await self._nc.subscribe(inbox, pending_msgs_limit=0, pending_bytes_limit=0)
            while len(out) < pending:
                want = min(_REPLAY_BATCH, pending - len(out))
                await self._nc.publish(next_subject(spec.name, name), pull_request(want, no_wait=True), reply=inbox)
                got = 0
                while got < want:
                    msg = await keeping_cancel(sub.next_msg(timeout=self._api_timeout_s))
                    if not msg.reply:
                        break  # a status: nothing more in this request
                    out.append((msg.subject, bytes(msg.data)))
                    got += 1
                if got == 0:
                    break
        except _NATS_ERRORS as e:
            raise Unavailable(f"replaying {pattern} failed: {e!r}") from e
        finally:
            if sub is not None and not self._nc.is_closed:
                try:
                    await sub.unsubscribe()
                except Exception:
                    pass
            try:
                await self._api(f"CONSUMER.DELETE.{spec.name}.{name}", None, what="delete a replay", timeout=2.0)
            except QueueError:
                pass
        return out

    async def purge_subjects(self, spec: topics.StreamSpec, pattern: str) -> int:
        await self._ensure_stream(spec)
        resp = await self._api(f"STREAM.PURGE.{spec.name}", {"filter": pattern}, what=f"purge {pattern}")
        return int(resp.get("purged", 0) or 0)
