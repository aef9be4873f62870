"""The engine as the one registry: named services in dependency order, periodic duties, its emitter, the process handle."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from crewlet.engine import runtime
from crewlet.engine.core import Engine, app_services
from crewlet.engine.services import NoService, Periodic, Service, Task, ordered
from crewlet.engine.interfaces import (
    CONFIG_POLLER,
    EVENT_STORE,
    FLEET,
    FLEET_READS,
    LIVE_PROJECTION,
    NOTIFY,
    SEAT_RUNTIME,
    ServiceKey,
)
from crewlet.company.org import CompanyHolder
from crewlet.company.parse import load_company
from eventstore.services import CUSTODY
from seats.runtime_service import STEER_SERVER
from engine_support import FakeBroker, fast_settings, twin_connect
from waiting_support import eventually


class Recorded:
    """A service that notes its start and stop, and what the engine handed it at its start."""

    def __init__(self, name: str, log: list[str], engine: Engine, needs: tuple[str, ...] = ()) -> None:
        self.name, self.log, self.engine, self.needs = name, log, engine, needs

    async def start(self) -> None:
        for dep in self.needs:
            assert isinstance(self.engine.get(ServiceKey(dep, Recorded)), Recorded)  # already running
        self.log.append(f"start {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")


def recorded(name: str, log: list[str], depends_on: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> Service:
    return Service(name, lambda e: Recorded(name, log, e, depends_on), depends_on=depends_on, after=after)


def an_engine() -> Engine:
    return Engine(fast_settings(), connect=twin_connect(FakeBroker()), company=CompanyHolder(load_company()))


async def test_services_start_after_what_they_depend_on_and_stop_in_the_reverse_order() -> None:
    log: list[str] = []
    engine = an_engine()
    engine.add(recorded("poller", log, depends_on=("runtime",)))
    engine.add(recorded("projection", log, after=("writer",)))
    engine.add(recorded("runtime", log, after=("writer", "absent")))  # "after" a name nobody has: no constraint
    engine.add(recorded("writer", log))
    serving = asyncio.create_task(engine.serve())
    await eventually(lambda: len(log) == 4, what="every service started")
    assert log == ["start writer", "start runtime", "start poller", "start projection"]
    poller = ServiceKey("poller", Recorded)
    assert isinstance(engine.get(poller), Recorded) and engine.find(poller) is engine.get(poller)
    engine.stop()
    assert await serving == 0
    assert log[4:] == ["stop projection", "stop poller", "stop runtime", "stop writer"]
    with pytest.raises(NoService):
        engine.get(poller)  # a stopped service is handed out no more
    assert engine.find(poller) is None


def test_a_dependency_nobody_provides_or_a_cycle_is_refused_before_anything_starts() -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError, match="'poller' depends on 'runtime', which no installed app provides"):
        ordered([recorded("poller", log, depends_on=("runtime",))])
    with pytest.raises(RuntimeError, match="cycle"):
        ordered([recorded("a", log, depends_on=("b",)), recorded("b", log, depends_on=("a",))])
    assert log == []


async def test_an_engine_whose_services_cannot_be_ordered_exits_with_an_error_and_starts_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    engine = an_engine()
    engine.add(recorded("poller", log, depends_on=("runtime",)))
    assert await engine.serve() == 1
    assert log == [] and "engine_start_failed" in caplog.text


async def test_a_service_that_fails_to_start_stops_the_engine_with_an_error_and_what_started_is_stopped() -> None:
    log: list[str] = []

    class Broken:
        async def start(self) -> None:
            raise RuntimeError("cannot start")

        async def stop(self) -> None:
            log.append("stop broken")

    engine = an_engine()
    engine.add(recorded("writer", log))
    engine.add(Service("broken", lambda e: Broken(), depends_on=("writer",)))
    assert await asyncio.wait_for(engine.serve(), 10) == 1
    assert log == ["start writer", "stop broken", "stop writer"]


async def test_a_periodic_duty_runs_now_and_every_interval_and_a_failing_pass_is_logged_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes: list[int] = []

    async def duty() -> None:
        passes.append(len(passes))
        if len(passes) == 2:
            raise RuntimeError("store away for a moment")

    engine = an_engine()
    engine.add_periodic("tidy", 0.01, duty, logger=logging.getLogger("crewlet.test"))
    serving = asyncio.create_task(engine.serve())
    await eventually(lambda: len(passes) >= 4, what="passes go on after a failing one")
    engine.stop()
    assert await serving == 0
    assert [r.getMessage() for r in caplog.records if r.name == "crewlet.test"] == ["tidy_failed"]


async def test_a_periodic_duty_woken_runs_its_next_pass_at_once() -> None:
    passes: list[str] = []

    async def duty() -> None:
        passes.append("pass")

    periodic = Periodic("poll", 3600.0, duty)
    await periodic.start()
    try:
        await eventually(lambda: passes == ["pass"], what="the first pass, at start")
        periodic.wake()
        await eventually(lambda: passes == ["pass", "pass"], what="the woken pass, long before the hour")
        assert periodic.alive
    finally:
        await periodic.stop()
    assert not periodic.alive


async def test_the_engine_owns_one_emitter_and_closes_it_at_stop_and_the_process_reaches_the_engine_while_it_runs() -> None:
    engine = an_engine()
    seen: dict[str, Any] = {}

    async def service(e: Engine) -> None:
        seen["emitter"] = e.emitter
        seen["here"] = runtime.engine()
        seen["company"] = runtime.company().org
        await asyncio.Event().wait()

    engine.add_service(service, name="look")
    serving = asyncio.create_task(engine.serve())
    await eventually(lambda: "here" in seen, what="the service ran")
    assert seen["here"] is engine and seen["emitter"] is engine.emitter and seen["company"] == "acme"
    assert runtime.emitter_for(engine.queue) is engine.emitter  # type: ignore[arg-type]
    engine.stop()
    assert await serving == 0
    assert seen["emitter"]._closed
    with pytest.raises(runtime.EngineAway, match=runtime.NO_ENGINE):
        runtime.engine()
    with pytest.raises(runtime.EngineAway) as away:
        runtime.company()
    assert away.value.missing == runtime.MISSING_ENGINE


def test_every_installed_app_contributes_its_services_and_the_store_starts_before_the_seats_that_publish() -> None:
    engine = an_engine()
    names = {service.name for service in app_services(engine)}
    keyed = {key.name for key in (FLEET, EVENT_STORE, FLEET_READS, LIVE_PROJECTION, SEAT_RUNTIME, NOTIFY, CONFIG_POLLER)}
    assert keyed | {"eventstore_retention", CUSTODY, "a2a_sweep", "seat_tools", "working_indicator", STEER_SERVER} == names
    order = [s.name for s in ordered(app_services(engine))]

    def at(key: ServiceKey[Any]) -> int:
        return order.index(key.name)

    assert at(EVENT_STORE) < at(FLEET_READS) < at(LIVE_PROJECTION)  # the seed asks the fleet
    assert at(EVENT_STORE) < at(SEAT_RUNTIME) < at(CONFIG_POLLER)
    assert at(FLEET) < at(EVENT_STORE)  # a node refused its store writes nothing into it
    assert at(SEAT_RUNTIME) < at(LIVE_PROJECTION)  # the seed reads which seats this node holds
    assert at(SEAT_RUNTIME) < order.index(STEER_SERVER)  # a note is offered to the runtime's running turns


def test_a_service_is_handed_out_by_its_key_and_a_request_thread_is_told_which_part_is_missing() -> None:
    engine = an_engine()
    writer = ServiceKey("writer", Recorded)
    reader = Service(ServiceKey("reader", Recorded), lambda e: Recorded("reader", [], e), depends_on=(writer,), after=(FLEET, "absent"))
    assert (reader.name, reader.depends_on, reader.after) == ("reader", ("writer",), (FLEET.name, "absent"))
    with pytest.raises(runtime.EngineAway) as away:
        runtime.service(writer)
    assert (away.value.missing, away.value.reason) == (runtime.MISSING_ENGINE, runtime.NO_ENGINE)
    assert runtime.find_service(writer) is None
    runtime.attach(engine.bind_queue(None))
    try:
        with pytest.raises(runtime.EngineAway, match="no writer service runs in this engine") as away:
            runtime.service(writer)
        assert away.value.missing == runtime.MISSING_SERVICE
        with pytest.raises(runtime.EngineAway, match="cannot ask the fleet") as away:
            runtime.service(FLEET_READS, missing=runtime.MISSING_FLEET)  # either absence is one to this asker
        assert away.value.missing == runtime.MISSING_FLEET and str(away.value) == runtime.NO_FLEET
        thing = Recorded("writer", [], engine)
        engine.provide(writer, thing)
        assert runtime.service(writer) is thing and runtime.find_service(writer) is thing
        assert engine.get(ServiceKey("writer", object)) is thing  # one name, one service
        with pytest.raises(runtime.EngineAway) as away:
            runtime.get_queue()
        assert away.value.missing == runtime.MISSING_QUEUE and isinstance(away.value, RuntimeError)
    finally:
        runtime.detach(engine)


def test_the_node_scope_is_the_running_engines_and_read_afresh_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from eventstore import here

    monkeypatch.setenv("CREWLET_NODE_ID", "web-only")
    assert here.node_scope().node_id == "web-only"
    monkeypatch.setenv("CREWLET_NODE_ID", "web-only-2")
    assert here.node_scope().node_id == "web-only-2"  # nothing kept between asks
    engine = Engine(fast_settings(**{"stream.event_retention_hours": 12.0}))
    runtime.attach(engine)
    try:
        assert (here.node_scope().node_id, here.node_scope().retention_hours) == ("n1", 12.0)
    finally:
        runtime.detach(engine)


async def test_a_one_shot_duty_that_ended_well_stays_alive_while_a_duty_that_ended_or_failed_does_not() -> None:
    async def done() -> None:
        return None

    async def broken() -> None:
        raise RuntimeError("the announcement could not be sent")

    once, once_broken, duty = Task("announce", done, once=True), Task("announce", broken, once=True), Task("loop", done)
    for task in (once, once_broken, duty):
        await task.start()
        assert task.task is not None
        await asyncio.wait([task.task])
    assert (once.alive, once_broken.alive, duty.alive) == (True, False, False)
    await once.stop()
    assert not once.alive
