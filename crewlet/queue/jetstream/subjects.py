"""The current message of every subject of a pattern, read in one pass; and a pattern's subjects purged.

For the streams that keep one message per subject (``CREWLET_MEMORY``): a
throwaway consumer at ``last_per_subject``, acknowledging nothing, pulled in
batches until it has served what it had pending when it was made.
"""
from __future__ import annotations

from crewlet.base.aio import keeping_cancel
from crewlet.queue import topics
from crewlet.queue.jetstream.reader import throwaway_reader
from crewlet.queue.jetstream.streams import StreamsPart

#: Messages asked for per pull request of a replay.
_REPLAY_BATCH = 1000


class SubjectsPart(StreamsPart):
    """Replay and purge by subject pattern on one stream."""

    async def read_subjects(self, spec: topics.StreamSpec, pattern: str) -> list[tuple[str, bytes]]:
        await self._ensure_stream(spec)
        out: list[tuple[str, bytes]] = []
        config = {"deliver_policy": "last_per_subject", "filter_subject": pattern}
        async with throwaway_reader(self, spec, config, f"a replay of {pattern}") as reader:
            while len(out) < reader.pending:
                want = min(_REPLAY_BATCH, reader.pending - len(out))
                await reader.pull(want)
                got = 0
                while got < want:
                    msg = await keeping_cancel(reader.sub.next_msg(timeout=self._api_timeout_s))
                    if not msg.reply:
                        break  # a status: nothing more in this request
                    out.append((msg.subject, bytes(msg.data)))
                    got += 1
                if got == 0:
                    break
        return out

    async def purge_subjects(self, spec: topics.StreamSpec, pattern: str) -> int:
        await self._ensure_stream(spec)
        resp = await self._api(f"STREAM.PURGE.{spec.name}", {"filter": pattern}, what=f"purge {pattern}")
        return int(resp.get("purged", 0) or 0)
