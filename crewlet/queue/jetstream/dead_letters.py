"""Dead letters on CREWLET_DLQ: read them all, read one by its sequence, delete one exactly once."""
from __future__ import annotations

import nats.js.errors

from crewlet.base.aio import keeping_cancel
from crewlet.queue import topics
from crewlet.queue.contract import DeadLetter, dead_letter_seq
from crewlet.queue.errors import Gone, QueueError, Unavailable
from crewlet.queue.jetstream.reader import throwaway_reader
from crewlet.queue.jetstream.streams import StreamsPart
from crewlet.queue.jetstream.wire import _NATS_ERRORS, _message_not_found, _stream_seq
from crewlet.queue.transport import dead_letter_from


class DeadLettersPart(StreamsPart):
    """The dead-letter store: CREWLET_DLQ read through a throwaway consumer, entries addressed by sequence."""

    # -- dead letters ---------------------------------------------------------------

    async def dead_letters(self, limit: int) -> list[DeadLetter]:
        limit = int(limit)
        if limit <= 0:
            return []
        spec = topics.DLQ_STREAM
        await self._ensure_stream(spec)
        out: list[DeadLetter] = []
        async with throwaway_reader(self, spec, {"deliver_policy": "all"}, "reading dead letters") as reader:
            await reader.pull(limit)
            while len(out) < limit:
                msg = await keeping_cancel(reader.sub.next_msg(timeout=self._api_timeout_s))
                if not msg.reply:
                    break  # 404: nothing more
                out.append(dead_letter_from(msg.headers or {}, msg.data, str(_stream_seq(msg.reply))))
        return out

    @staticmethod
    def _dead_letter_seq(ref: str) -> int:
        """``ref`` as a CREWLET_DLQ sequence; 0 when it cannot name one (never sent to the broker)."""
        return dead_letter_seq(ref)

    async def dead_letter(self, ref: str) -> DeadLetter:
        seq = self._dead_letter_seq(ref)
        spec = topics.DLQ_STREAM
        if seq == 0:
            raise Gone(f"dead letter {ref!r} is not on {spec.name}")
        await self._ensure_stream(spec)
        self._require_connected()
        try:
            raw = await keeping_cancel(self._nc.jsm(timeout=self._api_timeout_s).get_msg(spec.name, seq=seq))
        except nats.js.errors.APIError as e:
            if _message_not_found(e):
                raise Gone(f"dead letter {ref!r} is not on {spec.name}") from e
            raise Unavailable(f"reading dead letter {ref!r} failed: {e}") from e
        except _NATS_ERRORS as e:
            raise Unavailable(f"reading dead letter {ref!r} failed: {e!r}") from e
        return dead_letter_from(raw.headers or {}, raw.data or b"", str(seq))

    async def delete_dead_letter(self, ref: str) -> bool:
        """``STREAM.MSG.DELETE`` by sequence: the broker applies it once; a second finds no message (404)."""
        seq = self._dead_letter_seq(ref)
        spec = topics.DLQ_STREAM
        if seq == 0:
            return False
        self._require_connected()
        try:
            return bool(await keeping_cancel(self._nc.jsm(timeout=self._api_timeout_s).delete_msg(spec.name, seq)))
        except nats.js.errors.APIError as e:
            if _message_not_found(e):
                return False
            # A refusal in words this build does not know: whether the entry is
            # still there is the whole question, so ask that rather than guess.
            try:
                await self.dead_letter(ref)
            except Gone:
                return False
            except QueueError:
                pass
            raise Unavailable(f"deleting dead letter {ref!r} failed: {e}") from e
        except _NATS_ERRORS as e:
            raise Unavailable(f"deleting dead letter {ref!r} failed: {e!r}") from e
