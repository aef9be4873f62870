"""The engine's lifecycle on the in-memory twin: connect with the settings, run services, drain, stop, fail."""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Awaitable, Callable

import pytest

from crewlet.engine.core import Engine
from crewlet.events import Event
from crewlet.queue import Outcome, Timings, topics
from crewlet.queue.errors import NotLive
from crewlet.queue.memory import MemoryBroker
from engine_support import FakeBroker, fast_settings, twin_connect
from waiting_support import eventually


def events_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "crewlet.engine.core"]


async def serving_one_in_flight(
    engine: Engine, topic: str, group: str, handler: Callable[[Any], Awaitable[Any]]
) -> asyncio.Task[int]:
    """``engine`` serving, with one message published to ``handler`` and in its hands; the serve task."""

    async def service(e: Engine) -> None:
        assert e.queue is not None
        await e.queue.subscribe(topic, group, handler)
        await e.queue.publish(topic, Event(type="task_assigned"))

    engine.add_service(service)
    run = asyncio.create_task(engine.serve())
    await eventually(lambda: engine.queue is not None and engine.queue.in_flight() == 1)
    return run


async def test_engine_connects_with_the_settings_runs_services_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine.core")
    broker, seen = FakeBroker(), {}
    engine = Engine(
        fast_settings(**{"stream.store_dir": "/tmp/js", "stream.event_retention_hours": 48}),
        timings=Timings(backoff_base_s=0.01),
        connect=twin_connect(broker, seen),
    )
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def service(e: Engine) -> None:
        assert e.queue is not None and e.queue.node == "n1"
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    engine.add_service(service)
    run = asyncio.create_task(engine.serve())
    await asyncio.wait_for(started.wait(), 5)
    assert seen == {
        "stream_type": "embedded", "url": "", "store_dir": "/tmp/js", "node": "n1",
        "timings": Timings(backoff_base_s=0.01), "event_retention_hours": 48.0,
        "replicas": 1, "cluster": None, "cluster_secret": "", "monitor_port": 0, "max_consumers": 50000, "leaf": None,
    }
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    assert cancelled.is_set() and broker.stopped
    with pytest.raises(NotLive):
        await engine.queue.publish(topics.event("test_event"), Event(type="test_event"))
    assert events_logged(caplog) == ["engine_started", "engine_stopped"]
    started_record = next(r for r in caplog.records if r.getMessage() == "engine_started")
    assert (started_record.node, started_record.broker_url) == ("n1", "nats://127.0.0.1:4222")
    with pytest.raises(RuntimeError):
        engine.add_service(service)


async def test_engine_drains_handlers_in_flight_before_closing() -> None:
    broker = FakeBroker()
    engine = Engine(fast_settings(), connect=twin_connect(broker))
    release, handled, subscribed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    closed_after_handler: list[bool] = []
    topic, group = topics.agent_inbox("ada"), topics.agent_inbox_group("ada")

    async def handler(delivery: Any) -> Outcome:
        await release.wait()
        handled.set()
        return Outcome.ACK

    async def service(e: Engine) -> None:
        queue = e.queue
        assert queue is not None
        real_wait_idle, real_close = queue.wait_idle, queue.close

        async def wait_idle(timeout_s: float) -> bool:
            release.set()  # the drain has begun: only now may the handler finish
            return await real_wait_idle(timeout_s)

        async def close() -> None:
            closed_after_handler.append(handled.is_set())
            await real_close()

        queue.wait_idle, queue.close = wait_idle, close  # type: ignore[method-assign]
        await queue.subscribe(topic, group, handler)
        await queue.publish(topic, Event(type="task_assigned"))
        subscribed.set()

    engine.add_service(service)
    run = asyncio.create_task(engine.serve())
    await asyncio.wait_for(subscribed.wait(), 5)
    await eventually(lambda: engine.queue is not None and engine.queue.in_flight() == 1)
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    assert closed_after_handler == [True]


async def test_engine_drain_gives_up_at_its_timeout_and_hands_the_running_handlers_mail_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine.core")
    twins: list[MemoryBroker] = []

    async def connect(**kwargs: Any) -> tuple[Any, FakeBroker]:
        twins.append(MemoryBroker(kwargs["timings"], event_retention_hours=kwargs["event_retention_hours"]))
        return twins[0].client(kwargs["node"]), FakeBroker()

    engine = Engine(fast_settings(), drain_timeout_s=0.2, connect=connect)
    topic, group = topics.agent_inbox("bob"), topics.agent_inbox_group("bob")
    cancelled = asyncio.Event()

    async def stuck(delivery: Any) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    run = await serving_one_in_flight(engine, topic, group, stuck)
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    events = events_logged(caplog)
    assert "engine_drain_incomplete" in events and events[-1] == "engine_stopped"
    # Past the drain the handler was cancelled and its message went back, not left to the ack clock.
    assert cancelled.is_set()
    consumer = twins[0].consumer(topic, group)
    assert (len(consumer.available), len(consumer.inflight)) == (1, 0)


async def test_a_second_signal_skips_the_drain(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine.core")
    engine = Engine(fast_settings(), drain_timeout_s=60, connect=twin_connect(FakeBroker()))
    topic, group = topics.agent_inbox("cy"), topics.agent_inbox_group("cy")
    release = asyncio.Event()

    async def slow(delivery: Any) -> None:
        await release.wait()

    run = await serving_one_in_flight(engine, topic, group, slow)
    engine._on_signal(signal.SIGTERM)
    await eventually(lambda: engine._drain_task is not None)
    engine._on_signal(signal.SIGINT)
    await eventually(lambda: "engine_drain_incomplete" in events_logged(caplog))  # long before 60 s
    release.set()
    assert await asyncio.wait_for(run, 5) == 0
    assert events_logged(caplog) == [
        "engine_started", "engine_stopping", "engine_drain_skipped", "engine_drain_incomplete", "engine_stopped",
    ]


async def test_a_failing_service_stops_the_engine_with_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine.core")
    broker = FakeBroker()
    engine = Engine(fast_settings(), connect=twin_connect(broker))

    async def broken(e: Engine) -> None:
        raise RuntimeError("duty crashed")

    engine.add_service(broken, name="broken_duty")
    assert await asyncio.wait_for(engine.serve(), 5) == 1
    failed = next(r for r in caplog.records if r.getMessage() == "engine_service_failed")
    assert failed.service == "broken_duty" and failed.exc_info is not None
    assert events_logged(caplog)[-1] == "engine_stopped" and broker.stopped


async def test_a_connect_failure_is_an_error_exit(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine.core")

    async def refuse(**kwargs: Any) -> Any:
        raise ConnectionRefusedError("no broker")

    engine = Engine(fast_settings(), connect=refuse)
    assert await asyncio.wait_for(engine.serve(), 5) == 1
    assert events_logged(caplog) == ["engine_start_failed"]


async def test_the_logged_broker_url_carries_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine.core")
    engine = Engine(fast_settings(), connect=twin_connect(FakeBroker("nats://crewlet:s3cret@127.0.0.1:4999")))
    run = asyncio.create_task(engine.serve())
    await eventually(lambda: "engine_started" in events_logged(caplog))
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    record = next(r for r in caplog.records if r.getMessage() == "engine_started")
    assert record.broker_url == "nats://crewlet:***@127.0.0.1:4999"
    assert "s3cret" not in caplog.text
