"""The memory of the seats this node holds: replayed on acquire, followed live, dropped on release, purged on retirement.

One broadcast consumer per node follows ``crewlet.memory.>`` and applies the
writes of the seats it holds (a forget through the API on another node, a
write of a turn that ran here). Acquiring a seat replays the seat's subjects
in one pass into the store; writes that arrive while the replay runs wait and
are applied after it, the newer of two writes of a row winning, so the replay
cannot undo them. A node taking many seats at once (its share of a company at
boot) replays them all in one read of every seat's memory instead.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence

from crewlet.base.db import in_store
from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.company.org import REFLECTION_OFF
from crewlet.events import Event
from crewlet.queue import topics
from crewlet.queue.contract import Closable, EventQueue
from crewlet.queue.errors import QueueError
from seats.memory import store
from seats.memory.rows import RowWrite, from_event

if TYPE_CHECKING:  # pragma: no cover
    from seats.memory.reflection import Reflector

log = logging.getLogger("crewlet.seats.memory")

MEMORY_ALL = "crewlet.memory.>"


class _Replayed(NamedTuple):
    """A seat's part of a replay made together with other seats' (what its ``seat_memory_replayed`` line says)."""

    rows: int
    messages: int
    tombstones: int
    duration_ms: float


class MemoryKeeper:
    """This node's copy of its seats' memory, kept current from CREWLET_MEMORY."""

    def __init__(self, queue: EventQueue, reflector: Optional["Reflector"] = None) -> None:
        self.queue = queue
        #: The seats' post-turn reflection, attached with each seat's memory (none: this node reflects on nothing).
        self.reflector = reflector
        self.held: set[str] = set()
        self._replaying: dict[str, list[RowWrite]] = {}
        #: Seats replayed by :meth:`acquire_many` whose :meth:`acquire` has not come yet.
        self._ahead: dict[str, _Replayed] = {}
        self._live: Optional[Closable] = None

    async def start(self) -> None:
        """Follow every seat's memory writes from now on (applied for the seats held here)."""
        if self._live is None:
            try:
                self._live = await self.queue.subscribe_stream(MEMORY_ALL, self._on_write)
            except QueueError:
                # Replays still carry every write on acquire; what is missed meanwhile is a forget from elsewhere.
                log.warning("seat_memory_follow_unavailable", exc_info=True)

    async def stop(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            try:
                await live.close()
            except Exception:
                log.debug("seat_memory_follow_close_failed", exc_info=True)

    async def _on_write(self, _topic: str, event: Event) -> None:
        write = from_event(event)
        if write is None:
            return
        waiting = self._replaying.get(write.seat)
        if waiting is not None:
            waiting.append(write)
        elif write.seat in self.held:
            await in_store(store.apply, alias=EVENTS_ALIAS)([write])

    async def acquire_many(self, handles: Sequence[str]) -> None:
        """Replay several seats' memory with ONE read of every seat's (``crewlet.memory.>``) and one transaction.

        What a node taking its share of a company does instead of a read per
        seat (each a throwaway consumer made and deleted on the broker, then a
        transaction of its own): each seat's :meth:`acquire` then only
        attaches its reflection and logs its part. The seats are held from
        the replay on, so a live write of one is applied, not lost, before its
        :meth:`acquire` comes. A read the broker refuses is logged and leaves
        each seat to be replayed on its own by :meth:`acquire`.
        """
        wanted = [h for h in dict.fromkeys(handles) if h not in self.held]
        if not wanted:
            return
        started = time.monotonic()
        for handle in wanted:
            self._replaying[handle] = []
        try:
            try:
                replayed = await self.queue.read_last(MEMORY_ALL)
            except QueueError as exc:
                log.warning("seat_memory_replay_together_failed", extra={"seats": len(wanted), "error": str(exc)[:300]})
                return
            by_seat: dict[str, list[RowWrite]] = {h: [] for h in wanted}
            for _, event in replayed:
                write = from_event(event)
                if write is not None and write.seat in by_seat:
                    by_seat[write.seat].append(write)
            counts = await in_store(store.replace_many, alias=EVENTS_ALIAS)(by_seat)
            late = [w for h in wanted for w in self._replaying.get(h) or []]
            if late:
                await in_store(store.apply, alias=EVENTS_ALIAS)(late)
                for handle in {w.seat for w in late}:
                    counts[handle] = await in_store(store.count, alias=EVENTS_ALIAS)(handle)
        finally:
            for handle in wanted:
                self._replaying.pop(handle, None)
        self.held.update(wanted)
        took_ms = round((time.monotonic() - started) * 1000, 1)
        for handle in wanted:
            writes = by_seat[handle]
            self._ahead[handle] = _Replayed(counts.get(handle, 0), len(writes), sum(1 for w in writes if w.deleted), took_ms)
        log.info(
            "seat_memory_replayed_together",
            extra={"seats": len(wanted), "rows": sum(counts.values()), "messages": len(replayed), "duration_ms": took_ms},
        )

    async def acquire(self, handle: str) -> int:
        """Replay ``handle``'s memory into this node's store in one pass; the rows it holds. Raises QueueError."""
        ahead = self._ahead.pop(handle, None)
        if ahead is not None and handle in self.held:
            if self.reflector is not None:
                await self.reflector.attach(handle)
            log.info("seat_memory_replayed", extra={"seat": handle, **ahead._asdict(), "together": True})
            return ahead.rows
        started = time.monotonic()
        self._replaying[handle] = []
        try:
            replayed = await self.queue.read_last(topics.memory_pattern(handle))
            writes = [w for w in (from_event(e) for _, e in replayed) if w is not None and w.seat == handle]
            rows = await in_store(store.replace, alias=EVENTS_ALIAS)(handle, writes)
            late = self._replaying.get(handle) or []
            if late:
                await in_store(store.apply, alias=EVENTS_ALIAS)(late)
                rows = await in_store(store.count, alias=EVENTS_ALIAS)(handle)
        finally:
            self._replaying.pop(handle, None)
        self.held.add(handle)
        if self.reflector is not None:
            await self.reflector.attach(handle)
        log.info(
            "seat_memory_replayed",
            extra={
                "seat": handle, "rows": rows, "messages": len(replayed), "tombstones": sum(1 for w in writes if w.deleted),
                "duration_ms": round((time.monotonic() - started) * 1000, 1),
            },
        )
        return rows

    async def acquired(self, handle: str) -> bool:
        """:meth:`acquire`, False (logged) when the broker could not replay it: the seat is then not attached here."""
        try:
            await self.acquire(handle)
        except QueueError as exc:
            log.warning("seat_memory_replay_failed", extra={"seat": handle, "error": str(exc)[:300]})
            return False
        return True

    async def applied(self) -> None:
        """A company change: each held seat's reflection follows its ``reflection`` now (on: attached; off: detached)."""
        if self.reflector is None:
            return
        for handle in sorted(self.held):
            seat = self.reflector.holder.current().seat_by_handle(handle)
            try:
                if seat is None or seat.reflection == REFLECTION_OFF:
                    await self.reflector.detach(handle)
                else:
                    await self.reflector.attach(handle)
            except QueueError:
                log.warning("seat_reflection_attach_failed", extra={"seat": handle}, exc_info=True)

    async def purge_retired(self, handles: list[str]) -> None:
        """Purge each retired seat's memory; one that fails is logged (its subjects stay on the stream)."""
        for handle in handles:
            try:
                await purge(self.queue, handle)
            except Exception:
                log.warning("seat_memory_purge_failed", extra={"seat": handle}, exc_info=True)

    async def release(self, handle: str) -> None:
        """The seat is no longer this node's: its copy here goes (the stream keeps the memory)."""
        await self.release_many([handle])

    async def release_many(self, handles: list[str]) -> None:
        """:meth:`release` of each of ``handles``, their copies dropped in one transaction."""
        for handle in handles:
            self.held.discard(handle)
            self._ahead.pop(handle, None)
            if self.reflector is not None:
                await self.reflector.detach(handle)
        if not handles:
            return
        try:
            await in_store(store.clear, alias=EVENTS_ALIAS)(handles)
        except Exception:
            log.warning("seat_memory_clear_failed", extra={"seats": len(handles), "seat": handles[0]}, exc_info=True)


async def purge(queue: EventQueue, handle: str) -> int:
    """A retired seat's memory goes with it: its subjects on CREWLET_MEMORY and this node's copy."""
    purged = await queue.purge(topics.memory_pattern(handle))
    await in_store(store.clear, alias=EVENTS_ALIAS)([handle])
    log.info("seat_memory_purged", extra={"seat": handle, "messages": purged})
    return purged


__all__ = ["MEMORY_ALL", "MemoryKeeper", "purge"]
