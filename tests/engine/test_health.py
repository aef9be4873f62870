"""``/readyz`` in process: a dead duty and an unreachable store are each named, and make it 503; ``/livez`` stays 200.

The stores are the test's real databases; the unreachable one is the event
store's alias pointed at a database that does not exist (every connection
``/readyz`` opens is a fresh one, closed after its query).
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest
from django.db import connections
from django.test import Client

from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.engine.services import Task
from crewlet.engine.interfaces import NOTIFY, SEAT_RUNTIME, ServiceKey
from engine_support import engine_here
from tests.up.test_up import FakeQueue, FakeSeatRuntime, no_process_queue  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "events"])


def _get(path: str) -> tuple[int, dict[str, Any]]:
    response = Client().get(path)
    return response.status_code, response.json()


async def _never() -> None:
    return None


@pytest.fixture
def unreachable_event_store(tmp_path: Any) -> Iterator[None]:
    """The event store's alias naming a database that cannot be opened, for every connection made from now on."""
    settings = connections.settings[EVENTS_ALIAS]
    saved = settings["NAME"]
    settings["NAME"] = str(tmp_path / "no-such-dir" / "events.sqlite3") if "sqlite" in settings["ENGINE"] else "crewlet_no_such_db"
    try:
        yield
    finally:
        settings["NAME"] = saved


def test_readyz_is_200_naming_every_component_when_all_answer(no_process_queue: None) -> None:
    with engine_here(FakeQueue(connected=True), services={SEAT_RUNTIME: FakeSeatRuntime(True)}):  # type: ignore[arg-type]
        status, body = _get("/readyz")
    assert status == 200, body
    assert body["down"] == [] and body["status"] == "ready"
    assert set(body["components"]) == {"broker", "duties", "coordination_store", "event_store"}


def test_readyz_is_503_naming_a_duty_that_is_not_alive(no_process_queue: None) -> None:
    dead = Task(NOTIFY.name, _never)  # never started: not alive
    with engine_here(FakeQueue(connected=True), services={SEAT_RUNTIME: FakeSeatRuntime(True), NOTIFY: dead}):  # type: ignore[arg-type]
        status, body = _get("/readyz")
        assert _get("/livez")[0] == 200
    assert status == 503
    assert body["down"] == ["duties"]
    assert body["components"]["duties"] == {
        "ok": False, "state": "not alive", "services": {SEAT_RUNTIME.name: True, NOTIFY.name: False}
    }


def test_readyz_is_503_naming_the_event_store_when_it_cannot_be_reached(
    no_process_queue: None, unreachable_event_store: None
) -> None:
    with engine_here(FakeQueue(connected=True), services={SEAT_RUNTIME: FakeSeatRuntime(True)}):  # type: ignore[arg-type]
        status, body = _get("/readyz")
    assert status == 503
    assert body["down"] == ["event_store"]
    assert body["components"]["event_store"] == {"ok": False, "state": "unreachable"}
    assert body["components"]["coordination_store"] == {"ok": True, "state": "reachable"}


def test_readyz_and_livez_without_an_engine_say_so(no_process_queue: None) -> None:
    status, body = _get("/readyz")
    assert status == 503
    assert body["components"]["broker"]["state"] == "engine not running"
    assert body["components"]["duties"]["state"] == "engine not running"
    assert _get("/livez") == (200, {"status": "alive", "node": None, "components": {"process": "alive", "engine": "engine not running"}})


class _DisconnectedSocket:
    """A service that reports its own state, as a surface's socket client does, while its vendor cannot be reached."""

    alive = True

    def status_report(self) -> dict[str, Any]:
        return {"ok": False, "state": "connecting", "last_error": "ConnectionRefusedError"}


def test_a_reported_surface_that_is_not_connected_is_listed_as_degraded_and_leaves_the_node_ready(no_process_queue: None) -> None:
    services = {SEAT_RUNTIME: FakeSeatRuntime(True), ServiceKey("surface_socket:slack", _DisconnectedSocket): _DisconnectedSocket()}
    with engine_here(FakeQueue(connected=True), services=services):  # type: ignore[arg-type]
        status, body = _get("/readyz")
    assert status == 200, body
    assert body["status"] == "ready" and body["down"] == [] and body["degraded"] == ["surface_socket:slack"]
    assert body["components"]["surface_socket:slack"]["state"] == "connecting"
