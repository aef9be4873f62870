"""A request thread waiting on the engine's loop, through a real ``manage.py up`` and in process.

Under ``up`` a sync view runs on its request's own thread (asgiref's
per-request executor) while the engine's coroutines run on the loop; a
coroutine the view waits for must never need that thread for its store calls.
"""
from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from asgiref.testing import ApplicationCommunicator

from a2a import services
from a2a.models import Channel
from crewlet.engine import runtime
from crewlet.base.tokens import OperatorToken
from seats_support import eventually
from tests.up_support import REQUEST_TIMEOUT_S, UpProcess, http_json, serve, up_env

TOKEN = "bridge-test-operator-token-0123456789abcdef"


class Up(UpProcess):
    """``manage.py up`` (SQLite, embedded broker, the example company) with an operator token seeded."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, "--data-dir", str(tmp / "data"), node="b1", env=up_env(CREWLET_OPERATOR_TOKEN=TOKEN))

    def request(self, method: str, path: str, body: Optional[bytes] = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return http_json(method, self.url + path, body, headers)

    def post(self, path: str, payload: Any) -> tuple[int, Any]:
        return self.request("POST", path, json.dumps(payload).encode())


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from serve(Up(tmp_path_factory.mktemp("bridge")))


def _channels(up: Up) -> list[dict[str, Any]]:
    status, body = up.request("GET", "/api/a2a/channels")
    assert status == 200, body
    return body["channels"]


# -- through manage.py up ------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_an_operators_ask_inside_up_is_201_and_opens_exactly_one_channel(up: Up) -> None:
    before = {c["id"] for c in _channels(up)}
    status, body = up.post("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "status of POC-7?"})
    assert status == 201, body
    assert (body["asker"], body["target"], body["brief"]) == ("ada", "linus", "status of POC-7?")
    opened = [c for c in _channels(up) if c["id"] not in before]
    assert [c["id"] for c in opened] == [body["id"]]
    assert "event=engine_loop_timeout" not in up.output_so_far()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_retried_ask_inside_up_with_the_same_request_id_answers_the_first_channel_and_opens_no_second(up: Up) -> None:
    ask = {"from": "ada", "to": "linus", "brief": "is the build green?", "request_id": "retry-7f3a"}
    before = {c["id"] for c in _channels(up)}
    first_status, first = up.post("/api/a2a/ask", ask)
    again_status, again = up.post("/api/a2a/ask", ask)
    assert (first_status, again_status) == (201, 200), (first, again)
    assert again["id"] == first["id"] == services.ask_channel_id("ada", "retry-7f3a")
    assert [c["id"] for c in _channels(up) if c["id"] not in before] == [first["id"]]

    other = up.post("/api/a2a/ask", {**ask, "brief": "something else"})
    assert other[0] == 409 and "retry-7f3a" in other[1]["reason"] and other[1]["error"] == "conflict", other
    assert [c["id"] for c in _channels(up) if c["id"] not in before] == [first["id"]]


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_pausing_and_resuming_a_seat_inside_up_announces_each_change_once_on_the_engines_loop(up: Up) -> None:
    paused = up.post("/api/seats/ada/pause", {"reason": "bridge test"})
    assert paused[0] == 200 and paused[1]["changed"] is True, paused
    up.wait_for("event=seat_paused ", timeout_s=REQUEST_TIMEOUT_S)
    resumed = up.post("/api/seats/ada/resume", {})
    assert resumed[0] == 200 and resumed[1]["changed"] is True, resumed
    up.wait_for("event=seat_resumed ", timeout_s=REQUEST_TIMEOUT_S)
    text = up.output_so_far()
    assert "event=seat_pause_announce_failed" not in text and "event=engine_loop_timeout" not in text


# -- in process: the application Daphne serves, the engine's loop being the test's -----------------------


async def asgi_post(path: str, payload: Any, token: str) -> tuple[int, Any]:
    """POST through Django's ASGI handler as Daphne calls it (each request in its own thread-sensitive context).

    Django's test ``AsyncClient`` runs a sync view on asgiref's single store
    thread instead, which is not how the server runs it.
    """
    from crewlet.asgi import django_application

    body = json.dumps(payload).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), (b"host", b"testserver")],
        "client": ("127.0.0.1", 1), "server": ("testserver", 80),
    }
    talk = ApplicationCommunicator(django_application, scope)
    await talk.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await talk.receive_output(timeout=REQUEST_TIMEOUT_S)
    chunks = []
    while True:
        message = await talk.receive_output(timeout=REQUEST_TIMEOUT_S)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    await talk.wait(timeout=REQUEST_TIMEOUT_S)
    return start["status"], json.loads(b"".join(chunks) or b"null")


@pytest.fixture
async def recorder_and_token(runtime_on_memory: Any) -> tuple[Any, str]:
    """The engine running on the memory queue (what it published) and an operator's bearer token for the calls."""
    _, _, rec = runtime_on_memory
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    return rec, token


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_an_ask_through_the_asgi_handler_is_201_and_its_store_write_runs_off_the_request_thread(
    recorder_and_token: tuple[Any, str],
) -> None:
    rec, token = recorder_and_token

    status, asked = await asgi_post("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "status?"}, token)
    assert status == 201, asked
    cid = asked["id"]
    assert await sync_to_async(lambda: list(Channel.objects.values_list("id", flat=True)))() == [uuid.UUID(cid)]
    await eventually(lambda: len(rec.of("a2a_channel_opened")) == 1, what="the ask published its opening")


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_retry_after_an_ask_that_stopped_between_its_row_and_its_publishes_completes_that_channel_once(
    recorder_and_token: tuple[Any, str],
) -> None:
    rec, token = recorder_and_token
    ask = {"from": "ada", "to": "linus", "brief": "status of POC-9?", "request_id": "op-42"}
    # What an attempt cut off by its deadline leaves behind: the channel's row, and nothing published.
    await services._open("ada", "linus", ask["brief"], "", 0, [], None, services.ask_channel_id("ada", "op-42"))

    status, retried = await asgi_post("/api/a2a/ask", ask, token)
    assert status == 200, retried
    cid = retried["id"]
    assert cid == services.ask_channel_id("ada", "op-42")

    async def answered() -> bool:
        return await sync_to_async(Channel.objects.filter(pk=cid, state=Channel.CLOSED).exists)()

    await eventually(answered, what="linus answered the retried ask")
    status, again = await asgi_post("/api/a2a/ask", ask, token)
    assert status == 200 and again["state"] == "closed", again
    assert await sync_to_async(Channel.objects.count)() == 1
    assert [e.data.channel_id for e in rec.of("a2a_channel_opened")] == [cid]
    assert len(rec.of("a2a_channel_closed")) == 1


def test_waiting_on_the_loop_from_a_thread_that_runs_a_loop_is_refused_rather_than_deadlocking() -> None:
    async def inside() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(runtime.EngineAway, match="must await"):
            runtime.call_on_loop(lambda: asyncio.sleep(0), loop, 1.0)

    asyncio.run(inside())


def test_waiting_on_the_loop_from_the_store_thread_is_refused_rather_than_deadlocking() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        token = SyncToAsync.deadlock_context.set(True)  # what asgiref marks its single store thread with
        try:
            with pytest.raises(runtime.EngineAway, match="deadlock"):
                runtime.call_on_loop(lambda: asyncio.sleep(0), loop, 1.0)
        finally:
            SyncToAsync.deadlock_context.reset(token)
        assert runtime.call_on_loop(lambda: asyncio.sleep(0, result="answered"), loop, 10.0) == "answered"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_a_coroutine_run_for_a_thread_does_not_see_that_threads_asgiref_request_context() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    marker = object()
    try:
        token = SyncToAsync.thread_sensitive_context.set(marker)  # type: ignore[arg-type]
        try:

            async def seen() -> Any:
                return SyncToAsync.thread_sensitive_context.get(None)

            assert runtime.call_on_loop(seen, loop, 10.0) is None
        finally:
            SyncToAsync.thread_sensitive_context.reset(token)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
