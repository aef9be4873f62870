"""Custody on a real broker and real stores: a stateless node's rows kept by data nodes, claimed, moved, settled.

Nodes ``a`` and ``b`` are data nodes (a :class:`CustodyKeeper` each, on its own
PostgreSQL database); ``c`` is stateless (a :class:`CustodyWriter` as its
queue's publish listener). The claims live in the test's coordination store.
A keeper made slow is one whose store is locked by the test, as a store
under a long transaction would be.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from datetime import timedelta
from typing import Any, Iterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from crewlet.models import CustodyClaim
from crewlet.queue import topics
from eventstore.custody import CustodyKeeper, CustodyWriter
from eventstore_support import AT, make_event
from fleet_support import STORE_MARKS, alias_of, empty_stores, stores  # noqa: F401  (fixtures)
from seats_support import jetstream_queues
from waiting_support import eventually

pytestmark = STORE_MARKS

S = timedelta(seconds=1)


def _rows_on(node: str) -> dict[str, str]:
    """{event id: its custody batch ("" once settled)} of ``node``'s store."""
    with connections[alias_of(node)].cursor() as cursor:
        cursor.execute("SELECT id, custody_batch FROM eventstore_event")
        return {str(i): str(b) for i, b in cursor.fetchall()}


async def rows_on(node: str) -> dict[str, str]:
    return await sync_to_async(_rows_on)(node)


async def _count_on(node: str, count: int) -> bool:
    return len(await rows_on(node)) >= count


async def publish(queue: Any, count: int, prefix: str) -> list[str]:
    ids = []
    for i in range(count):
        event = make_event("org_started", AT - 60 * S + i * S, event_id=f"{prefix}-{i:03d}", node=queue.node)
        await queue.publish(topics.event(event.type), event)
        ids.append(event.id)
    return ids


@contextlib.contextmanager
def store_locked(node: str) -> Iterator[threading.Event]:
    """Hold an exclusive lock on ``node``'s event table until the yielded event is set (its writes wait)."""
    release, locked = threading.Event(), threading.Event()

    def hold() -> None:
        connection = connections[alias_of(node)]
        try:
            with connection.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("LOCK TABLE eventstore_event IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(60)
                cursor.execute("COMMIT")
        finally:
            connection.close()

    holder = threading.Thread(target=hold, name=f"lock-{node}")
    holder.start()
    assert locked.wait(30), "the lock was taken"
    try:
        yield release
    finally:
        release.set()
        holder.join(30)


async def test_a_stateless_nodes_rows_are_kept_by_a_data_node_once_each_and_settled_for_good_with_the_claim_forgotten(
    stores: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    async with jetstream_queues("a", "b", "c") as (qa, qb, qc):
        keepers = {n: CustodyKeeper(q, n, every_s=3600, using=alias_of(n)) for n, q in (("a", qa), ("b", qb))}
        for keeper in keepers.values():
            await keeper.start()
        writer = CustodyWriter(qc, "c", timeout_s=5, keepers=lambda _: ["a", "b"])
        qc.add_publish_listener(writer)
        try:
            ids = await publish(qc, 30, "kept")
            assert writer.backlog == 0 and writer.handed == 30  # every publish returned with its row kept
            on_a, on_b = await rows_on("a"), await rows_on("b")
            held = {**on_a, **on_b}
            assert sorted(held) == ids and set(on_a).isdisjoint(on_b) and on_a and on_b  # once each, on one store
            assert all(batch for batch in held.values())  # unsettled until a pass
            claims = await sync_to_async(lambda: list(CustodyClaim.objects.values_list("keeper", "closed")))()
            assert len(claims) >= 2 and {keeper for keeper, _ in claims} == {"a", "b"}  # in turn
            assert not any(closed for _, closed in claims)  # open until their keeper settles them

            with caplog.at_level(logging.INFO, logger="crewlet.eventstore.custody"):
                for keeper in keepers.values():
                    await keeper.settle()
            assert {**await rows_on("a"), **await rows_on("b")} == {i: "" for i in ids}
            settled = [r for r in caplog.records if r.getMessage() == "custody_batch_settled"]
            assert len(settled) == len(claims) and sum(getattr(r, "rows") for r in settled) == 30  # each its batch's rows
            assert await sync_to_async(CustodyClaim.objects.count)() == 0
        finally:
            await writer.aclose()
            for keeper in keepers.values():
                await keeper.stop()


async def test_a_keeper_that_does_not_answer_loses_the_claim_and_its_late_copy_is_dropped_by_its_settle_pass(
    stores: dict[str, str],
) -> None:
    async with jetstream_queues("a", "b", "c") as (qa, qb, qc):
        a = CustodyKeeper(qa, "a", every_s=3600, using=alias_of("a"))
        b = CustodyKeeper(qb, "b", every_s=3600, using=alias_of("b"))
        await a.start()
        await b.start()
        # Batches are claimed for a and b in turn, a first: a's store is locked, so it cannot answer in time.
        writer = CustodyWriter(qc, "c", timeout_s=0.5, keepers=lambda _: ["a", "b"])
        qc.add_publish_listener(writer)
        try:
            with store_locked("a") as release:
                ids = await publish(qc, 3, "moved")
                assert sorted(await rows_on("b")) == ids  # the second keeper has every row
                claims = await sync_to_async(lambda: list(CustodyClaim.objects.values_list("keeper", flat=True)))()
                assert set(claims) == {"b"}
                release.set()
            # The locked keeper's writes go through once the lock is gone: the same rows, unsettled, on both stores
            # (the first and the third publish were claimed for a first; the second went to b in turn).
            await eventually(lambda: _count_on("a", 2), 30, "a's late copies written")
            late = await rows_on("a")
            assert sorted(late) == [ids[0], ids[2]] and all(late.values())

            assert await a.settle() == (0, 2)  # not its own: dropped
            assert await rows_on("a") == {}
            assert await b.settle() == (3, 0)
            assert await rows_on("b") == {i: "" for i in ids}
        finally:
            await writer.aclose()
            await a.stop()
            await b.stop()


async def test_with_no_keeper_answering_the_rows_wait_in_the_backlog_and_go_once_one_does(stores: dict[str, str]) -> None:
    async with jetstream_queues("a", "c") as (qa, qc):
        writer = CustodyWriter(qc, "c", timeout_s=0.2, keepers=lambda _: ["a"], retry_first_s=0.05, retry_max_s=0.2)
        qc.add_publish_listener(writer)
        a = CustodyKeeper(qa, "a", every_s=3600, using=alias_of("a"))
        try:
            ids = await publish(qc, 4, "late")  # nobody serves a's subject yet: each publish returns, nothing is lost
            assert writer.backlog == 4 and await rows_on("a") == {}
            await a.start()
            await eventually(lambda: writer.backlog == 0, 30, "the backlog handed over")
            assert sorted(await rows_on("a")) == ids
            assert await a.settle() == (4, 0)
        finally:
            await writer.aclose()
            await a.stop()
