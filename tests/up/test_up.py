"""``manage.py up`` (one process: migrations, broker, loops, Daphne) and ``/healthz``."""
from __future__ import annotations

import asyncio
import http.cookiejar
import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlencode

import pytest
from django.core.management import CommandError, load_command_class
from django.test import Client

from crewlet.engine import runtime
from crewlet.http import web
from crewlet.engine.core import Engine
from crewlet.engine.interfaces import SEAT_RUNTIME
from crewlet.queue import Timings
from engine_support import FakeBroker, engine_here, fast_settings, twin_connect
from tests.process_support import REPO_ROOT, descendants, is_running
from tests.up_support import READY_LINE, UpProcess, up_env
from waiting_support import wait_until

sys.path.insert(0, str(REPO_ROOT))
import manage  # noqa: E402  (the repository's manage.py)

TOKEN = "up-test-operator-token-0123456789abcdef"


def _get(url: str, token: Optional[str] = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# -- manage.py up, for real -------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_up_serves_healthz_and_the_api_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with UpProcess(tmp_path, "--data-dir", str(data_dir), node="u1", env=up_env(CREWLET_OPERATOR_TOKEN=TOKEN), ready_s=90) as up:
        assert up.proc is not None
        url = up.ready.split(READY_LINE, 1)[1].split(" ", 1)[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/") and up.ready.endswith("(node u1)")

        status, body = _get(url + "healthz")
        assert status == 200, body
        assert json.loads(body) == {"status": "ok", "broker": "connected", "loops": "running", "node": "u1"}

        # CREWLET_OPERATOR_TOKEN was seeded after the migrations, before serving.
        assert _get(url + "api/events")[0] == 401
        status, body = _get(url + "api/events", token=TOKEN)
        assert status == 200, body

        # Everything lives under --data-dir: both SQLite files and the broker's store.
        assert (data_dir / "crewlet.sqlite3").exists() and (data_dir / "events.sqlite3").exists()
        assert (data_dir / "jetstream").is_dir() and (data_dir / "secret_key").exists()

        children = descendants(up.proc.pid)
        assert "nats-server" in children.values(), children

        assert up.terminate() == 0, up.output()
        text = up.output()
        lines = text.splitlines()

        def first(needle: str) -> int:
            return next(i for i, line in enumerate(lines) if needle in line)

        # The web server stops taking requests before the loops let go of their seats.
        assert first("event=web_stopped") < first("event=seat_runtime_stopped") < first("event=engine_stopped")
        assert "clean=true" in lines[first("event=engine_stopped")]
        assert "event=webhook_surface_unverified surface=slack" in text  # the example company's warning
        assert f"No staff user yet: to sign in to the dashboard, run `CREWLET_VAR_DIR={data_dir}" in text
        assert TOKEN not in text

        wait_until(lambda: not [pid for pid in children if is_running(pid)], 5, f"no child outliving manage.py up: {children}")


OTHER_COMPANY = """\
org: zeta
providers: {llm: [{kind: echo}]}
seats:
  - {handle: zed, kind: agent, role: engineer}
  - {handle: yve, kind: human, role: lead}
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_up_shows_the_company_it_was_given_on_the_overview_and_never_the_example_one(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    company = tmp_path / "zeta.yaml"
    company.write_text(OTHER_COMPANY)
    env = up_env(CREWLET_VAR_DIR=str(data_dir))
    with UpProcess(tmp_path, "--data-dir", str(data_dir), "--company", str(company), node="u2", env=env, ready_s=90) as up:
        url = up.url
        up.manage("createsuperuser", "--noinput", "--username", "op", "--email", "op@example.com",
                  extra_env={"DJANGO_SUPERUSER_PASSWORD": "pw-0123456789"})
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        with browser.open(url + "/login/", timeout=30) as response:
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.read().decode())
        assert token is not None
        form = urlencode({"csrfmiddlewaretoken": token.group(1), "username": "op", "password": "pw-0123456789", "next": "/"})
        with browser.open(urllib.request.Request(url + "/login/", data=form.encode()), timeout=30) as response:
            html = response.read().decode()  # signed in, and sent on to the overview
        assert "<h1>zeta</h1>" in html and '<tr data-seat="zed">' in html and '<tr data-seat="yve">' in html
        assert '<tr data-seat="ada">' not in html and 'id="no-engine"' not in html


def broker_secrets(pid: int) -> list[str]:
    """The credential a running nats-server was given, on its command line or in its config file."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
    found = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in {"--auth", "--pass"} and argv[i + 1]]
    for i, arg in enumerate(argv[:-1]):
        if arg in {"-c", "--config"}:
            try:
                conf = Path(argv[i + 1]).read_text()
            except OSError:
                continue
            found += re.findall(r'^\s*(?:password|token)\s*[:=]\s*"?([^"\s]+)"?', conf, re.MULTILINE)
    return found


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_manage_py_up_starts_the_engine_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    env = up_env(CREWLET_VAR_DIR=str(tmp_path / "var"))
    with UpProcess(tmp_path, "--store-dir", str(tmp_path / "js"), node="t1", env=env, ready_s=60) as up:
        assert up.proc is not None
        started = up.wait_for("event=engine_started", timeout_s=60)
        assert "node=t1" in started and "stream_type=embedded" in started
        brokers = [pid for pid, comm in descendants(up.proc.pid).items() if comm == "nats-server"]
        assert brokers, f"no nats-server child of manage.py up: {descendants(up.proc.pid)}"
        secrets_ = [s for pid in brokers for s in broker_secrets(pid)]
        assert secrets_, "the embedded broker runs without a credential"
        assert "broker_url=nats://127.0.0.1:" in started

        assert up.terminate(timeout_s=45) == 0, up.output()
        text = up.output()
        assert "event=engine_stopped" in text
        assert "Crewlet node t1 starting" in text
        assert not [s for s in secrets_ if s in text], "the broker credential was logged"
        assert (tmp_path / "var" / "secret_key").exists()  # settings used the temporary var dir

        wait_until(lambda: not [pid for pid in brokers if is_running(pid)], 3, "no nats-server outliving manage.py up")


# -- /healthz, in process ----------------------------------------------------------------


class FakeQueue:
    def __init__(self, connected: bool) -> None:
        self.connected = connected
        self.node = "h1"

    async def round_trip(self, timeout_s: float) -> None:
        return None


class FakeSeatRuntime:
    def __init__(self, healthy: bool) -> None:
        self._healthy = healthy

    def healthy(self) -> bool:
        return self._healthy


@pytest.fixture
def no_process_queue() -> Any:
    saved = runtime.current_engine()
    runtime.detach()
    yield
    runtime.detach()
    if saved is not None:
        runtime.attach(saved)


def _health(client: Client) -> tuple[int, dict[str, Any]]:
    response = client.get("/healthz")
    return response.status_code, response.json()


def test_healthz_is_503_engine_not_running_in_a_process_without_the_engine(no_process_queue: None) -> None:
    status, body = _health(Client())
    assert status == 503
    assert body == {"status": "down", "broker": "engine not running", "loops": "not running", "node": None}


def test_healthz_is_503_naming_the_broker_when_it_is_disconnected(no_process_queue: None) -> None:
    with engine_here(FakeQueue(connected=False), services={SEAT_RUNTIME: FakeSeatRuntime(True)}):  # type: ignore[arg-type]
        assert _health(Client()) == (503, {"status": "down", "broker": "disconnected", "loops": "running", "node": "h1"})


def test_healthz_is_503_naming_the_loops_when_they_do_not_run(no_process_queue: None) -> None:
    with engine_here(FakeQueue(connected=True), services={SEAT_RUNTIME: FakeSeatRuntime(False)}):  # type: ignore[arg-type]
        assert _health(Client()) == (503, {"status": "down", "broker": "connected", "loops": "not running", "node": "h1"})
    with engine_here(FakeQueue(connected=True)):  # type: ignore[arg-type]
        assert _health(Client())[1]["loops"] == "not running"


def test_healthz_is_200_when_the_broker_is_connected_and_the_loops_run(no_process_queue: None) -> None:
    with engine_here(FakeQueue(connected=True), services={SEAT_RUNTIME: FakeSeatRuntime(True)}):  # type: ignore[arg-type]
        assert _health(Client()) == (200, {"status": "ok", "broker": "connected", "loops": "running", "node": "h1"})


def test_get_queue_says_what_to_do_when_no_engine_runs_here(no_process_queue: None) -> None:
    with pytest.raises(runtime.EngineAway, match="engine is not running here"):
        runtime.get_queue()


async def test_a_web_only_process_with_an_embedded_broker_cannot_dial_one_lazily(
    no_process_queue: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREWLET_STREAM_TYPE", "embedded")
    with pytest.raises(runtime.EngineAway, match="stream.type is 'embedded'"):
        await runtime.aget_queue()


# -- the engine's side: the queue is registered, front services stop first -----------------------


async def test_the_engine_registers_its_queue_pauses_delivery_then_stops_front_services_before_the_drain(no_process_queue: None) -> None:
    engine = Engine(fast_settings(), timings=Timings(backoff_base_s=0.01), connect=twin_connect(FakeBroker()))
    order: list[str] = []
    up = asyncio.Event()

    async def front(e: Engine) -> None:
        up.set()
        try:
            await asyncio.Event().wait()
        finally:
            order.append(f"front stopped, queue connected={e.queue.connected}")  # type: ignore[union-attr]

    async def loop(e: Engine) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append("loop stopped")

    engine.add_service(loop, name="loop")
    engine.add_service(front, name="front", stop_first=True)
    run = asyncio.create_task(engine.serve())
    await asyncio.wait_for(up.wait(), 5)
    assert runtime.get_queue() is engine.queue
    real_pause = engine.queue.pause_delivery  # type: ignore[union-attr]

    async def pause() -> None:
        order.append("drain")
        await real_pause()

    engine.queue.pause_delivery = pause  # type: ignore[union-attr, method-assign]
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    # Delivery pauses first (what no handler works on goes back at once), then the web server stops.
    assert order == ["drain", "front stopped, queue connected=True", "loop stopped"]
    assert runtime.current_queue() is None


# -- the command line -------------------------------------------------------------------


def test_addr_is_host_and_port() -> None:
    assert web.parse_addr("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert web.parse_addr("[::1]:0") == ("::1", 0)
    for bad in ("8000", "localhost", "host:http", ":80", "h:70000"):
        with pytest.raises(web.AddressError, match="must be host:port"):
            web.parse_addr(bad)


def test_manage_py_turns_up_data_dir_into_the_var_dir_before_django_loads(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    manage.apply_data_dir(["manage.py", "up", "--addr", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")], env)
    assert env == {"CREWLET_VAR_DIR": str(tmp_path / "d")}
    env = {}
    manage.apply_data_dir(["manage.py", "up", f"--data-dir={tmp_path}"], env)
    assert env == {"CREWLET_VAR_DIR": str(tmp_path)}
    env = {}
    manage.apply_data_dir(["manage.py", "runconsumers", "--data-dir", "x"], env)
    assert env == {}


def _options(command: str, *argv: str) -> tuple[Any, dict[str, Any]]:
    cmd = load_command_class("crewlet", command)
    return cmd, vars(cmd.create_parser("manage.py", command).parse_args(list(argv)))


def test_up_refuses_a_data_dir_django_did_not_start_with(tmp_path: Path) -> None:
    cmd, options = _options("up", "--data-dir", str(tmp_path / "elsewhere"))
    with pytest.raises(CommandError, match="--data-dir=.*pass --data-dir to manage.py up on the command line"):
        cmd.data_dir(options)


def test_up_refuses_a_bad_addr_in_one_line() -> None:
    cmd, options = _options("up", "--addr", "nowhere", "--stream-type", "nats", "--stream-url", "nats://b:4222")
    with pytest.raises(CommandError, match=r"^--addr='nowhere': must be host:port"):
        cmd.engine(options)


def test_up_refuses_a_stateless_node_whose_coordination_store_is_its_own_sqlite_file_in_one_line(tmp_path: Path) -> None:
    up = UpProcess(tmp_path, node="sx", env=up_env(CREWLET_NODE_DATA="false", CREWLET_VAR_DIR=str(tmp_path / "data")))
    with pytest.raises(AssertionError):
        up.start()  # never ready: the process ends first
    assert up.proc is not None and up.proc.wait(timeout=120) != 0
    assert "node.data=false: a stateless node needs a coordination store the fleet shares (CREWLET_DATABASE=postgres)" in up.output()


@pytest.fixture
def clean_engine_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("CREWLET_STREAM", "CREWLET_NODE", "CREWLET_EVENT")) or name == "CREWLET_SETTINGS_FILE":
            monkeypatch.delenv(name)


@pytest.mark.parametrize("command", ["up", "runconsumers"])
def test_flags_override_the_settings(command: str, clean_engine_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management import load_command_class

    monkeypatch.setenv("CREWLET_NODE_ID", "from-env")
    cmd = load_command_class("crewlet", command)
    parser = cmd.create_parser("manage.py", command)
    options = vars(parser.parse_args(["--node", "n5", "--store-dir", "/data/js", "--stream-type", "nats", "--stream-url", "nats://b:4222"]))
    settings = cmd.engine(options).settings
    assert (settings.node.id, settings.stream.store_dir, settings.stream.type, settings.stream.url) == (
        "n5", "/data/js", "nats", "nats://b:4222",
    )
    assert cmd.engine(vars(parser.parse_args([]))).settings.node.id == "from-env"


def test_a_bad_flag_is_a_one_line_command_error(clean_engine_env: None) -> None:
    from django.core.management import CommandError, load_command_class

    cmd = load_command_class("crewlet", "up")
    options = vars(cmd.create_parser("manage.py", "up").parse_args(["--stream-type", "nats"]))
    with pytest.raises(CommandError, match=r"^stream\.url='': required when stream\.type is nats"):
        cmd.engine(options)


@pytest.mark.parametrize("command", ["up", "runconsumers"])
def test_a_bad_company_file_is_a_one_line_command_error(command: str, tmp_path: Path) -> None:
    bad = tmp_path / "company.yaml"
    bad.write_text("org: acme\nnode: {max_concurrent: 500}\n")
    cmd, options = _options(command, "--company", str(bad), "--stream-type", "nats", "--stream-url", "nats://b:4222")
    with pytest.raises(CommandError, match="max_concurrent"):
        cmd.engine(options)
    cmd, options = _options(command, "--company", str(tmp_path / "missing.yaml"))
    with pytest.raises(CommandError, match="cannot be read"):
        cmd.engine(options)


def test_up_registers_every_loop_and_duty_and_the_web_server_runconsumers_no_web_server() -> None:
    cmd, options = _options("up", "--stream-type", "nats", "--stream-url", "nats://b:4222")
    names = {service.name: service.stop_first for service in cmd.engine(options).registered}
    assert names == {
        "eventstore_writer": False, "eventstore_retention": False, "eventstore_fleet_reads": False, "eventstore_projection": False,
        "eventstore_custody": False, "seat_runtime": False, "seat_steering": False, "seat_tools": False, "working_indicator": False, "notify": False,
        "a2a_sweep": False, "config_poller": False, "fleet": False, "web": True,
    }
    cmd, options = _options("runconsumers", "--stream-type", "nats", "--stream-url", "nats://b:4222")
    assert "web" not in {service.name for service in cmd.engine(options).registered}


def test_up_keeps_the_embedded_brokers_store_under_the_data_dir_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings

    monkeypatch.delenv("CREWLET_STREAM_STORE_DIR", raising=False)
    monkeypatch.delenv("CREWLET_STREAM_TYPE", raising=False)
    monkeypatch.delenv("CREWLET_SETTINGS_FILE", raising=False)
    cmd, options = _options("up")
    assert cmd.engine(options).settings.stream.store_dir == str(Path(settings.VAR_DIR).resolve() / "jetstream")
    cmd, options = _options("up", "--store-dir", "")
    assert cmd.engine(options).settings.stream.store_dir == ""


async def test_a_service_that_swallows_its_cancellation_is_cancelled_again_and_the_engine_still_stops(
    no_process_queue: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import crewlet.engine.services

    monkeypatch.setattr(crewlet.engine.services, "RECANCEL_AFTER_S", 0.05)
    engine = Engine(fast_settings(), connect=twin_connect(FakeBroker()))
    started = asyncio.Event()

    async def stubborn(e: Engine) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # a cancellation lost mid-start, as Python 3.11's wait_for can lose one
        await asyncio.Event().wait()

    engine.add_service(stubborn, name="stubborn")
    run = asyncio.create_task(engine.serve())
    await asyncio.wait_for(started.wait(), 5)
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    again = [r for r in caplog.records if r.getMessage() == "engine_service_cancelled_again"]
    assert [r.service for r in again] == ["service:stubborn"]
