"""A company surface's webhook is answered on the loop: no thread hop, through the ASGI application and a real ``up``."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from asgiref.testing import ApplicationCommunicator

from crewlet.asgi import application
from notifications_support import company, fixture_bytes, set_secrets, slack_headers
from test_notifications_edge import ACCEPTED, edge_on, published
from tests.up_support import UpProcess, http_call, serve, up_env

pytestmark = pytest.mark.usefixtures("close_store_connections")

def _scope(path: str, headers: dict[str, str], host: str = "localhost") -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", host.encode()), *((k.lower().encode(), v.encode()) for k, v in headers.items())],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 80),
    }


async def _call(scope: dict[str, Any], body: bytes) -> tuple[int, dict[bytes, bytes]]:
    comm = ApplicationCommunicator(application, scope)
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await comm.receive_output(10)
    await comm.receive_output(10)
    await comm.wait(10)
    return start["status"], {k.lower(): v for k, v in start["headers"]}


async def test_a_signed_slack_delivery_is_accepted_without_starting_a_thread_and_keeps_the_security_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_secrets(monkeypatch)
    body = fixture_bytes("slack", "event_callback-app_mention.json")
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    async with edge_on(company(verify=True)) as (_, _, rec):
        monkeypatch.setattr(threading.Thread, "start", counted)
        status, headers = await _call(_scope("/webhooks/slack", {**slack_headers(body), "Content-Type": "application/json"}), body)
        monkeypatch.setattr(threading.Thread, "start", start)
        assert status == 202
        assert published(rec) == ACCEPTED
    assert started == []  # no hop into a per-request executor
    assert headers[b"x-frame-options"] == b"DENY"
    assert headers[b"x-content-type-options"] == b"nosniff"


async def test_a_webhook_to_a_host_not_allowed_is_refused_with_400_and_nothing_is_published(monkeypatch: pytest.MonkeyPatch) -> None:
    set_secrets(monkeypatch)
    body = fixture_bytes("slack", "event_callback-app_mention.json")
    async with edge_on(company(verify=True)) as (_, _, rec):
        status, _ = await _call(_scope("/webhooks/slack", {**slack_headers(body), "Content-Type": "application/json"}, host="evil.example"), body)
        assert status == 400
        assert published(rec) == []


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("fastpath")
    yield from serve(UpProcess(tmp, "--data-dir", str(tmp / "data"), node="fp1", env=up_env()))


@pytest.mark.integration
def test_through_up_a_slack_delivery_is_202_with_the_security_headers(up: UpProcess) -> None:
    body = fixture_bytes("slack", "event_callback-app_mention.json")
    status, headers, raw = http_call("POST", up.url + "/webhooks/slack", body, {"Content-Type": "application/json"})
    assert status == 202, raw
    assert json.loads(raw)["accepted"] is True
    assert {k.lower(): v for k, v in headers.items()}["x-frame-options"] == "DENY"
