"""Stream snapshots and restores through JetStream's own API (``$JS.API.STREAM.SNAPSHOT`` / ``.RESTORE``).

nats-py has no helper for either, so the two exchanges are spoken here:

- A snapshot asks ``STREAM.SNAPSHOT.<stream>`` to deliver to an inbox; the
  server answers with the stream's configuration and state, then sends the
  stream (its messages and its consumers with their delivery state) as chunks
  of the server's own archive format. Each chunk carries a reply subject the
  client answers to let the next window through; an empty message ends it,
  its status saying whether the server finished (a 5xx names why not).
- A restore asks ``STREAM.RESTORE.<stream>`` with that configuration and
  state; the server names a subject to send the chunks to, acknowledges each
  one, and answers the final empty message with the restored stream's info.

The chunks are written to and read from a file as they come, untouched: the
archive is the server's, and only the server reads it. Every nats failure is
translated to the queue's error tree (``Unavailable``, ``InvalidArgument``).
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from crewlet.base.aio import keeping_cancel
from crewlet.queue.errors import InvalidArgument, Unavailable
from crewlet.queue.jetstream.base import TransportBase
from crewlet.queue.jetstream.wire import _NATS_ERRORS, API_PREFIX, ERR_STREAM_NAME_IN_USE, _ApiError, _status_of, api_request

#: Bytes per chunk the server sends in a snapshot and a restore sends back.
CHUNK_BYTES = 128 * 1024
#: The status of a snapshot's last, empty message when the server finished.
_EOF_OK = ("", "204")
#: A restore of a stream the broker already holds ("stream name already in use, cannot restore").
ERR_STREAM_RESTORE_EXISTS = 10130


async def _request(nc: NatsClient, subject: str, payload: bytes, timeout_s: float, what: str) -> dict[str, Any]:
    """One API request of a snapshot or restore; a stream the broker already has is ``InvalidArgument``."""
    try:
        return await api_request(nc, subject, payload, timeout_s, what, empty_ok=True)
    except _ApiError as exc:
        if exc.err_code in (ERR_STREAM_NAME_IN_USE, ERR_STREAM_RESTORE_EXISTS):
            raise InvalidArgument(f"{what}: the broker already has this stream; restore into a broker without it") from exc
        raise


async def stream_names(nc: NatsClient, timeout_s: float) -> list[str]:
    """Every stream the broker holds for this account, by name, sorted."""
    names: list[str] = []
    while True:
        page = await _request(
            nc, f"{API_PREFIX}.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), timeout_s, "listing streams"
        )
        got = [str(name) for name in page.get("streams") or []]
        names.extend(got)
        if not got or len(names) >= int(page.get("total", 0) or 0):
            return sorted(names)


async def snapshot_stream(nc: NatsClient, stream: str, out: Path, timeout_s: float) -> dict[str, Any]:
    """Write ``stream``'s snapshot (messages and consumers) to ``out``; its ``{"config", "state"}`` for a restore.

    ``timeout_s`` bounds the wait for each chunk, not the whole copy: a large
    stream takes as long as its bytes take.
    """
    inbox = nc.new_inbox()
    try:
        sub = await nc.subscribe(inbox)
    except _NATS_ERRORS as exc:
        raise Unavailable(f"snapshot of {stream}: {exc!r}") from exc
    try:
        request = {"deliver_subject": inbox, "chunk_size": CHUNK_BYTES}
        answer = await _request(
            nc, f"{API_PREFIX}.STREAM.SNAPSHOT.{stream}", json.dumps(request).encode(), timeout_s, f"snapshot of {stream}"
        )
        with out.open("wb") as sink:
            while True:
                try:
                    msg = await keeping_cancel(sub.next_msg(timeout=timeout_s))
                except _NATS_ERRORS as exc:
                    raise Unavailable(f"snapshot of {stream}: no chunk within {timeout_s:g} s ({exc!r})") from exc
                if not msg.data:
                    status, description = _status_of(msg)
                    if status not in _EOF_OK:
                        raise Unavailable(f"snapshot of {stream}: the server stopped ({status} {description})")
                    break
                sink.write(msg.data)
                if msg.reply:
                    await nc.publish(msg.reply, b"")
    finally:
        try:
            await sub.unsubscribe()
        except _NATS_ERRORS:
            pass
    return {"config": answer.get("config") or {}, "state": answer.get("state") or {}}


async def restore_stream(nc: NatsClient, stream: str, meta: dict[str, Any], source: Path, timeout_s: float) -> dict[str, Any]:
    """Recreate ``stream`` from the snapshot in ``source`` and its ``meta`` (``config``, ``state``); the stream's info.

    The broker must not hold the stream already (``InvalidArgument``): a
    restore never overwrites what is there.
    """
    what = f"restore of {stream}"
    answer = await _request(nc, f"{API_PREFIX}.STREAM.RESTORE.{stream}", json.dumps(meta).encode(), timeout_s, what)
    deliver = str(answer.get("deliver_subject") or "")
    if not deliver:
        raise Unavailable(f"{what}: the server named no subject to send the snapshot to")
    with source.open("rb") as chunks:
        while True:
            chunk = chunks.read(CHUNK_BYTES)
            if not chunk:
                break
            await _request(nc, deliver, chunk, timeout_s, what)
    # The last, empty message: the server builds the stream from what it was sent, then answers.
    done = await _request(nc, deliver, b"", max(timeout_s, 60.0), what)
    return done


class SnapshotsPart(TransportBase):
    """The transport's side of a backup: list the broker's streams, and snapshot one to a file."""

    async def stream_names(self) -> list[str]:
        self._require_connected()
        return await stream_names(self._nc, self._api_timeout_s)

    async def snapshot_stream(self, stream: str, out: Path) -> dict[str, Any]:
        self._require_connected()
        return await snapshot_stream(self._nc, stream, out, max(self._api_timeout_s, 30.0))


async def restore_streams(url: str, snapshots: list[tuple[str, dict[str, Any], Path]], timeout_s: float = 30.0) -> int:
    """Dial ``url`` (credentials may ride in it) and restore each ``(stream, meta, file)``; how many were restored.

    A connection of its own, not the engine's queue: the queue provisions its
    streams on connect, and a restore needs them absent.
    """
    try:
        nc = await asyncio.wait_for(nats.connect(servers=[url], allow_reconnect=False, connect_timeout=5), timeout_s)
    except _NATS_ERRORS as exc:  # asyncio.TimeoutError among them
        raise Unavailable(f"restore: the broker could not be reached ({type(exc).__name__})") from exc
    try:
        for stream, meta, source in snapshots:
            await restore_stream(nc, stream, meta, source, timeout_s)
    finally:
        await nc.close()
    return len(snapshots)


__all__ = ["CHUNK_BYTES", "SnapshotsPart", "restore_stream", "restore_streams", "snapshot_stream", "stream_names"]
