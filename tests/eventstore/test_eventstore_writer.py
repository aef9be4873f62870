"""The event store writer: a publish listener writing one row per stored event, on PostgreSQL."""
from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator

import pytest
from asgiref.sync import sync_to_async

import eventstore
from crewlet.company.loading import load_settings
from crewlet.engine.core import Engine
from crewlet.company.org import CompanyHolder
from crewlet.company.parse import load_company
from crewlet.events import NOT_STORED, Event, registered_type
from crewlet.queue import topics
from crewlet.queue.memory import MemoryBroker
from eventstore.models import EventRow
from eventstore.rows import is_failed, row_for
from eventstore import writer as writer_module
from eventstore.writer import EventWriter
from eventstore_support import NODE, make_event, trace
from waiting_support import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True, databases=["default", "events"])]

T0 = datetime(2025, 3, 10, 9, 0, 0, 123456, tzinfo=timezone.utc)


@pytest.fixture(params=[False, True], ids=["loop-sink", "thread-sink"])
def threaded(request: Any) -> bool:
    """Both ways the writer inserts: on the loop (PostgreSQL's) and on its own thread (SQLite's)."""
    return request.param


@pytest.fixture
async def queue() -> AsyncIterator[Any]:
    """A node's queue on the memory twin, with the writer attached as its publish listener."""
    client = MemoryBroker().client(node=NODE)
    writer = eventstore.attach(client)
    assert not writer.threaded  # PostgreSQL: the loop sink
    try:
        yield client
    finally:
        await writer.aclose()
        await client.close()


@pytest.fixture
async def either_queue(threaded: bool) -> AsyncIterator[Any]:
    client = MemoryBroker().client(node=NODE)
    writer = eventstore.attach(client, threaded=threaded)
    try:
        yield client
    finally:
        await writer.aclose()
        await client.close()


@pytest.fixture(autouse=True)
async def _close_reader_connections() -> AsyncIterator[None]:
    """The reads below run on asgiref's thread; leave no connection open there for teardown."""
    yield
    from django.db import connections

    await sync_to_async(connections.close_all)()


@sync_to_async
def rows() -> list[EventRow]:
    return list(EventRow.objects.order_by("ts", "id"))


@sync_to_async
def row(event_id: str) -> EventRow:
    return EventRow.objects.get(id=event_id)


def _publishable(event: Event) -> Event:
    """The event as a publisher hands it over: the queue stamps the node, never the caller."""
    event.node = ""
    return event


async def test_a_published_event_becomes_one_row_carrying_its_envelope_and_promoted_tags(either_queue: Any) -> None:
    queue = either_queue
    span = trace(7)
    event = _publishable(
        make_event(
            "agent_turn_completed", T0, span=span, seat="grace", role="engineer", turn_id="turn-1", conversation_key="jira:POC-7",
            input_tokens=120, output_tokens=30, tool_calls=2,
        )
    )
    await queue.publish(topics.event(event.type), event)

    got = await row(event.id)
    assert got.node == NODE  # stamped by the queue, as on the wire
    assert got.ts == T0  # microseconds kept
    assert (got.type, got.category) == ("agent_turn_completed", "system")
    assert (got.trace_id, got.span_id, got.parent_span_id) == (span.trace_id, span.span_id, "")
    assert (got.seat, got.turn_id, got.conversation_key) == ("grace", "turn-1", "jira:POC-7")
    assert (got.input_tokens, got.output_tokens, got.failed) == (120, 30, False)
    assert (got.actor, got.summary) == ("engineer", "engineer finished a turn (150 tokens, 2 tool calls)")
    stamped = event.copy()
    stamped.node = NODE
    assert got.body == stamped.to_json().decode()  # the wire text itself, key order and all


async def test_publishing_the_same_event_id_twice_leaves_one_row(either_queue: Any) -> None:
    queue = either_queue
    event = _publishable(make_event("sandbox_run_failed", T0, seat="grace", run_id="r1", error="lost"))
    await queue.publish(topics.event(event.type), event)
    await queue.publish(topics.event(event.type), event)
    # The same event republished to another subject (a relay) is still the same row.
    await queue.publish(topics.agent_inbox("grace"), event)

    assert [r.id for r in await rows()] == [event.id]


async def test_events_published_concurrently_share_transactions_and_each_publish_returns_with_its_row_committed(
    threaded: bool,
) -> None:
    client = MemoryBroker().client(node=NODE)
    writer = eventstore.attach(client, threaded=threaded)
    sink = writer._sink
    assert sink is not None
    writes: list[int] = []
    insert = sink.insert

    async def counted(batch: Any) -> None:
        writes.append(len(batch))
        await insert(batch)

    sink.insert = counted  # type: ignore[method-assign]  # counts the sink's writes, each still written
    published = [
        _publishable(make_event("agent_turn_started", T0 + timedelta(microseconds=i), seat="grace", turn_id=f"t{i}"))
        for i in range(20)
    ]
    seen_at_return: dict[str, bool] = {}

    async def publish(event: Event) -> None:
        await client.publish(topics.event(event.type), event)
        seen_at_return[event.id] = await sync_to_async(EventRow.objects.filter(id=event.id).exists)()

    try:
        await asyncio.gather(*(publish(e) for e in published))
    finally:
        await writer.aclose()
        await client.close()
    assert seen_at_return == {e.id: True for e in published}
    assert sum(writes) == 20
    assert len(writes) < 20  # rows that queued behind a write in flight were committed together


async def test_the_writer_called_again_with_a_changed_copy_keeps_the_first_row(threaded: bool) -> None:
    writer = EventWriter(threaded=threaded)
    try:
        first = make_event("seat_paused", T0, seat="grace", reason="first")
        await writer(topics.event(first.type), first)
        again = make_event("seat_paused", T0 + timedelta(seconds=1), event_id=first.id, seat="grace", reason="second")
        await writer(topics.event(again.type), again)
    finally:
        await writer.aclose()
    got = await row(first.id)
    assert got.ts == T0 and "first" in got.summary


@pytest.mark.parametrize("etype", sorted(NOT_STORED))
async def test_a_type_that_is_not_stored_leaves_no_row(queue: Any, etype: str) -> None:
    cls = registered_type(etype)
    assert cls is not None
    event = _publishable(make_event(etype, T0))
    await queue.publish(topics.event(etype), event)
    assert await rows() == []


async def test_memory_rows_and_dead_letters_are_not_records(queue: Any) -> None:
    event = _publishable(make_event("seat_paused", T0, seat="grace"))
    assert row_for(topics.memory("grace", "episodes", "k"), event) is None
    assert row_for("dlq.crewlet.agent.grace.inbox.g.abc", event) is None
    assert row_for(topics.event("seat_paused"), event) is not None


async def test_an_inbound_delivery_is_filed_under_its_own_label_with_the_providers_exact_bytes(queue: Any) -> None:
    raw = b'{"action": "opened",  "n": 1}\n'  # spacing and the newline are the provider's
    event = make_event("inbound_delivery", T0, surface="forge", event_name="pull_request", provider="github", seat="grace")
    event.data.set_raw_bytes(raw)
    binary = make_event("inbound_delivery", T0 + timedelta(seconds=1), surface="socket", event_name="")
    binary.data.set_raw_bytes(b"\xff\x00posted")
    await queue.publish(topics.NOTIFICATIONS_INBOUND, _publishable(event))
    await queue.publish(topics.NOTIFICATIONS_INBOUND, _publishable(binary))

    first, second = await row(event.id), await row(binary.id)
    assert (first.type, first.category, first.seat) == ("forge:pull_request", "webhook", "grace")
    assert second.type == "socket:posted"
    restored = Event.from_json(first.body)
    assert restored.data.raw_bytes() == raw
    assert Event.from_json(second.body).data.raw_bytes() == b"\xff\x00posted"


async def test_the_runtime_audit_tags_and_the_batch_partition_are_promoted(queue: Any) -> None:
    acted = make_event("operator_acted", T0, token="ops-laptop", actor_seat="ada", tool="pause_seat", outcome="ok")
    backup = make_event("backup_requested", T0, dir="/backups/2025-03-10", finished=True, streams=3)
    merged = make_event("notifications_coalesced", T0, seat="grace", partition_key="slack:C9:1718.001", count=3)
    for event in (acted, backup, merged):
        await queue.publish(topics.event(event.type), _publishable(event))

    assert ((await row(acted.id)).actor_seat, (await row(acted.id)).tool) == ("ada", "pause_seat")
    assert (await row(acted.id)).actor == "ops-laptop"
    assert (await row(backup.id)).dir == "/backups/2025-03-10"
    got = await row(merged.id)
    assert (got.partition_key, got.conversation_key) == ("slack:C9:1718.001", "")


async def test_a_type_this_build_does_not_know_is_still_stored_verbatim(queue: Any) -> None:
    event = Event.from_dict(
        {"id": "future-1", "type": "quantum_leap", "timestamp": "2025-03-10T09:00:00.123456789Z", "seat": "grace", "warp": 9}
    )
    await queue.publish(topics.event("quantum_leap"), event)
    got = await row("future-1")
    assert (got.type, got.category, got.seat) == ("quantum_leap", "", "grace")
    assert json.loads(got.body)["warp"] == 9
    assert json.loads(got.body)["timestamp"] == "2025-03-10T09:00:00.123456789Z"


@pytest.mark.parametrize(
    "etype, fields, failed",
    [
        ("sandbox_run_failed", {"error": "lost"}, True),
        ("turn.guard_breach", {"guard": "stall"}, True),
        ("llm_unavailable", {}, True),
        ("budget_exhausted", {}, True),
        ("agent_turn_completed", {"failed": True, "error": "boom"}, True),
        ("agent_turn_completed", {"stopped": True}, False),
        ("agent_phase_completed", {"failed": True, "error_kind": "max_tokens"}, True),
        ("config_revision_applied", {"outcome": "failed", "error": "bad yaml"}, True),
        ("config_revision_applied", {"outcome": "applied"}, False),
        ("provider_fallback", {"error": "429", "to_provider_key": "b"}, False),
    ],
)
def test_one_rule_says_which_rows_are_failures(etype: str, fields: dict[str, Any], failed: bool) -> None:
    assert is_failed(make_event(etype, T0, **fields)) is failed


#: Retries spaced in milliseconds: every code path of the backlog runs, quickly.
FAST_RETRY = {"retry_first_s": 0.01, "retry_max_s": 0.05, "close_flush_s": 5.0}


async def until_rows(expected: list[str], what: str) -> None:
    """Wait for exactly these row ids (in ts order)."""

    async def written() -> bool:
        return [r.id for r in await rows()] == expected

    await eventually(written, 20.0, f"{what}: rows {expected}")


async def test_a_failing_write_never_fails_the_publish_and_the_row_is_written_once_the_store_answers(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    real = writer_module._PostgresSink.insert
    failures = {"left": 3}

    async def flaky(self: Any, row: Any) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("the store is busy")
        await real(self, row)

    monkeypatch.setattr(writer_module._PostgresSink, "insert", flaky)
    client = MemoryBroker().client(node=NODE)
    writer = eventstore.attach(client, **FAST_RETRY)
    try:
        first = _publishable(make_event("seat_paused", T0, seat="grace"))
        second = _publishable(make_event("seat_resumed", T0 + timedelta(seconds=1), seat="grace"))
        with caplog.at_level(logging.WARNING):
            await client.publish(topics.event(first.type), first)  # returns: telemetry cannot fail a publish
            await client.publish(topics.event(second.type), second)  # joins the backlog behind the first
        assert "eventstore_row_deferred" in caplog.text and "queue_publish_listener_failed" not in caplog.text
        await until_rows([first.id, second.id], "the backlog written once the store answered")
        assert writer.backlog == 0 and failures["left"] == 0
    finally:
        await writer.aclose()
        await client.close()


@sync_to_async
def _terminate_writer_backends() -> int:
    from django.db import connections

    with connections["events"].cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [writer_module.APPLICATION_NAME],
        )
        return cursor.fetchone()[0]


async def test_the_writer_reconnects_after_the_server_drops_its_connection_and_loses_no_row() -> None:
    writer = EventWriter(**FAST_RETRY)
    try:
        first = make_event("seat_paused", T0, seat="grace")
        await writer(topics.event(first.type), first)
        assert await _terminate_writer_backends() == 1
        second = make_event("seat_resumed", T0 + timedelta(seconds=1), seat="grace")
        await writer(topics.event(second.type), second)  # fails on the dead connection: kept, not raised
        third = make_event("seat_paused", T0 + timedelta(seconds=2), seat="grace")
        await writer(topics.event(third.type), third)
        await until_rows([first.id, second.id, third.id], "every row, the one that met the dead connection too")
    finally:
        await writer.aclose()


async def test_an_unreachable_store_keeps_the_rows_and_writes_them_when_it_is_back() -> None:
    writer = EventWriter(**FAST_RETRY)
    sink = writer._sink
    assert isinstance(sink, writer_module._PostgresSink)
    good = dict(sink._params)
    sink._params.update(host="127.0.0.1", port=1)  # nothing listens there: refused at once
    try:
        events = [make_event("seat_paused", T0 + timedelta(seconds=i), seat="grace") for i in range(3)]
        for event in events:
            await writer(topics.event(event.type), event)  # never raises, never waits out the dead server
        assert writer.backlog == 3 and await rows() == []
        sink._params = good
        sink._retry_at = 0.0  # the store is back and the connect window has passed
        await until_rows([e.id for e in events], "the backlog written when the store came back")
    finally:
        await writer.aclose()


async def test_closing_the_writer_writes_its_backlog_first() -> None:
    writer = EventWriter(retry_first_s=60.0, retry_max_s=60.0, close_flush_s=5.0)  # no retry before the close
    sink = writer._sink
    assert isinstance(sink, writer_module._PostgresSink)
    good = dict(sink._params)
    sink._params.update(host="127.0.0.1", port=1)
    event = make_event("seat_paused", T0, seat="grace")
    await writer(topics.event(event.type), event)
    assert writer.backlog == 1
    sink._params = good
    sink._retry_at = 0.0
    await writer.aclose()
    assert [r.id for r in await rows()] == [event.id]


async def test_the_threaded_writer_replaces_a_broken_connection_and_loses_no_row() -> None:
    writer = EventWriter(threaded=True, **FAST_RETRY)
    sink = writer._sink
    assert isinstance(sink, writer_module.StoreThread)
    try:
        first = make_event("seat_paused", T0, seat="grace")
        await writer(topics.event(first.type), first)

        def sever() -> None:
            from django.db import connections

            connections["events"].connection.close()  # the connection dies under the writer

        await sink.run(sever)  # on the writer's own thread, whose connection it is
        second = make_event("seat_resumed", T0 + timedelta(seconds=1), seat="grace")
        await writer(topics.event(second.type), second)
        third = make_event("seat_paused", T0 + timedelta(seconds=2), seat="grace")
        await writer(topics.event(third.type), third)
        await until_rows([first.id, second.id, third.id], "every row, the one that met the severed connection too")
    finally:
        await writer.aclose()


async def test_a_closed_writer_skips_events_without_raising(caplog: Any) -> None:
    writer = EventWriter()
    await writer.aclose()
    with caplog.at_level(logging.ERROR):
        await writer(topics.event("seat_paused"), make_event("seat_paused", T0))
    assert "eventstore_writer_closed" in caplog.text
    assert await rows() == []


async def test_the_engine_writes_what_its_queue_publishes_once_the_store_is_installed() -> None:
    broker = MemoryBroker()

    async def connect(**kwargs: Any) -> Any:
        return broker.client(node=kwargs["node"]), None

    engine = Engine(load_settings({}, env={}, overrides={"node.id": "n9"}), connect=connect, company=CompanyHolder(load_company()))
    eventstore.install(engine)
    serving = asyncio.create_task(engine.serve())
    try:
        while engine.queue is None or not engine.queue._listeners:  # the writer service has attached
            await asyncio.sleep(0)
        # Stamped now: the engine's retention duty sweeps at start, and T0 may be past its bound.
        event = _publishable(make_event("org_started", datetime.now(timezone.utc)))
        await engine.queue.publish(topics.event("org_started"), event)
    finally:
        engine.stop()
        assert await serving == 0
    got = await row(event.id)
    assert (got.node, got.category) == ("n9", "lifecycle")


async def test_across_a_broker_kill_and_restart_every_event_reported_published_or_stored_has_its_row(
    tmp_path: Any,
) -> None:
    """A stream of publishes on a real nats-server that is killed (-9) and restarted by its supervisor on the
    same file store, the events database dropping the writer's connection at each kill: every publish the
    client reported as done has its row, and so does every event the stream holds afterwards."""
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.contract import Outcome
    from crewlet.queue.errors import QueueError
    from crewlet.queue.jetstream import JetStreamQueue
    from seats_support import FAST

    etype = "seat_paused"
    topic = topics.event(etype)
    async with EmbeddedBroker(store_dir=tmp_path / "jetstream") as broker:
        client = await JetStreamQueue.connect(broker.url, node=NODE, timings=FAST)
        writer = eventstore.attach(client, **FAST_RETRY)
        reported: list[str] = []
        refused: list[str] = []
        stop = asyncio.Event()

        async def publisher() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                event = _publishable(make_event(etype, datetime.now(timezone.utc), seat=f"s{i}"))
                try:
                    await client.publish(topic, event)
                except QueueError:
                    refused.append(event.id)
                    while not client.connected and not stop.is_set():
                        await asyncio.sleep(0.01)  # the condition: the client is connected again
                else:
                    reported.append(event.id)

        task = asyncio.create_task(publisher())
        try:
            for round_ in range(2):
                before = len(reported)
                await eventually(lambda: len(reported) >= before + 50, 60.0, f"publishes before kill {round_}")
                restarts = broker.restarts
                # The events database drops the writer's connection as the broker dies: a restart
                # of both, as a machine coming back brings them, and the row path must ride out both.
                assert await _terminate_writer_backends() == 1
                await broker.kill()
                await eventually(lambda: broker.restarts > restarts and client.connected, 60.0, f"the broker back after kill {round_}")
            before = len(reported)
            await eventually(lambda: len(reported) >= before + 50, 60.0, "publishes after the last restart")
        finally:
            stop.set()
            await task

        stored: list[str] = []

        async def collect(delivery: Any) -> Outcome:
            stored.append(delivery.event.id)
            return Outcome.ACK

        await client.ensure_subscription(topic, "audit")
        held = await client.backlog(topic, "audit")
        sub = await client.subscribe(topic, "audit", collect)
        await eventually(lambda: len(stored) >= held, 60.0, "the stream read back")
        await sub.detach()
        await eventually(lambda: writer.backlog == 0, 60.0, "the writer's backlog written")
        await writer.aclose()
        await client.close()

    written = {r.id for r in await rows()}
    assert len(reported) >= 150
    missing_reported = [i for i in reported if i not in written]
    missing_stored = [i for i in stored if i not in written]
    assert not missing_reported, f"{len(missing_reported)} publishes reported done have no row"
    assert not missing_stored, (
        f"{len(missing_stored)} events on the stream have no row ({len(refused)} publishes were refused)"
    )


async def test_a_row_holding_a_nul_or_a_lone_surrogate_is_written_with_both_escaped(either_queue: Any) -> None:
    odd = _publishable(make_event("seat_paused", T0, seat="gr\x00ace", reason="out \ud800 today"))
    after = _publishable(make_event("seat_resumed", T0 + timedelta(seconds=1), seat="grace"))
    await either_queue.publish(topics.event(odd.type), odd)
    await either_queue.publish(topics.event(after.type), after)
    await until_rows([odd.id, after.id], "the odd row and the one behind it")
    stored = await row(odd.id)
    assert stored.seat == "gr\\u0000ace"
    assert json.loads(stored.body)["reason"] == "out \ud800 today"  # the body's escape decodes back to what was published


@sync_to_async
def _refuse_seat(seat: str, refuse: bool) -> None:
    """A CHECK constraint on the real table: the store itself refuses a row naming ``seat``."""
    from django.db import connections

    with connections["events"].cursor() as cursor:
        if refuse:
            assert seat.isalnum()  # spelled into the statement: DDL takes no parameters
            cursor.execute(f"ALTER TABLE {writer_module.TABLE} ADD CONSTRAINT test_refuses_seat CHECK (seat <> '{seat}')")
        else:
            cursor.execute(f"ALTER TABLE {writer_module.TABLE} DROP CONSTRAINT IF EXISTS test_refuses_seat")


async def test_a_row_the_store_refuses_is_set_aside_counted_and_logged_and_the_rows_around_it_are_written(
    threaded: bool, caplog: Any
) -> None:
    await _refuse_seat("poison", True)
    client = MemoryBroker().client(node=NODE)
    writer = eventstore.attach(client, threaded=threaded, **FAST_RETRY)
    try:
        events = [
            _publishable(make_event("seat_paused", T0 + timedelta(seconds=i), seat=seat))
            for i, seat in enumerate(["grace", "poison", "linus", "ada"])
        ]
        with caplog.at_level(logging.WARNING):
            await asyncio.gather(*(client.publish(topics.event(e.type), e) for e in events))
            await until_rows([events[0].id, events[2].id, events[3].id], "every row but the refused one")
        assert writer.refused == 1 and writer.backlog == 0
        refusals = [r for r in caplog.records if r.getMessage() == "eventstore_row_refused"]
        assert [getattr(r, "event_id", "") for r in refusals] == [events[1].id]
    finally:
        await writer.aclose()
        await client.close()
        await _refuse_seat("poison", False)


def test_a_token_count_past_what_the_column_holds_is_clamped_not_refused() -> None:
    event = make_event("agent_turn_completed", T0, seat="ada", turn_id="t1", input_tokens=2**80, output_tokens=-5)
    stored = row_for(topics.event(event.type), event)
    assert stored is not None
    assert stored[writer_module.COLUMNS.index("input_tokens")] == 2**63 - 1
    assert stored[writer_module.COLUMNS.index("output_tokens")] == 0
