"""The project skeleton: Django wiring, the two databases, logging, the engine worker, ``manage.py up``."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections, router
from django.db.utils import ConnectionHandler

from crewlet import settings as crewlet_settings
from crewlet.conf import load_settings
from crewlet.engine import Engine
from crewlet.logfmt import JsonFormatter, KeyValueFormatter
from crewlet.queue import Outcome, Timings, topics
from crewlet.queue.errors import NotLive
from crewlet.queue.memory import MemoryBroker
from crewlet.events import Event
from waiting_support import eventually

REPO_ROOT = Path(__file__).resolve().parent.parent

# -- Django wiring ------------------------------------------------------------


def test_django_system_checks_pass() -> None:
    call_command("check", fail_level="WARNING")


@pytest.mark.django_db(databases=["default", "events"])
def test_django_database_checks_pass() -> None:
    call_command("check", databases=["default", "events"], fail_level="WARNING")


def test_every_app_is_installed() -> None:
    from django.apps import apps

    labels = {app.label for app in apps.get_app_configs()}
    assert {"admin", "auth", "contenttypes", "sessions", "messages", "staticfiles"} <= labels
    assert {"crewlet", "seats", "notifications", "eventstore", "a2a"} <= labels


def _model(app_label: str) -> Any:
    return SimpleNamespace(_meta=SimpleNamespace(app_label=app_label))


def test_router_sends_eventstore_to_events() -> None:
    assert router.db_for_read(_model("eventstore")) == "events"
    assert router.db_for_write(_model("eventstore")) == "events"
    for label in ("seats", "notifications", "a2a", "auth"):
        assert router.db_for_write(_model(label)) == "default"
        assert router.db_for_read(_model(label)) == "default"


def test_router_keeps_each_app_in_one_database() -> None:
    assert router.allow_migrate("events", "eventstore") is True
    assert router.allow_migrate("default", "eventstore") is False
    for label in ("seats", "notifications", "a2a", "auth", "contenttypes"):
        assert router.allow_migrate("default", label) is True
        assert router.allow_migrate("events", label) is False
    assert router.allow_relation(_model("eventstore"), _model("seats")) is False
    assert router.allow_relation(_model("seats"), _model("a2a")) is True


@pytest.mark.django_db(databases=["default", "events"])
def test_migrations_follow_the_router() -> None:
    default_tables = set(connections["default"].introspection.table_names())
    events_tables = set(connections["events"].introspection.table_names())
    assert {"auth_user", "django_session", "django_migrations"} <= default_tables
    assert "eventstore_event" in events_tables and "eventstore_event" not in default_tables
    assert all(t == "django_migrations" or t.startswith("eventstore_") for t in events_tables), events_tables


@pytest.mark.postgres
@pytest.mark.django_db(databases=["default", "events"])
def test_the_test_databases_are_two_postgresql_databases() -> None:
    assert os.environ.get("CREWLET_DATABASE") == "postgres"
    names = {}
    for alias in ("default", "events"):
        conn = connections[alias]
        assert conn.vendor == "postgresql"
        with conn.cursor() as cursor:
            cursor.execute("select current_database()")
            names[alias] = cursor.fetchone()[0]
    assert names == {"default": "test_crewlet", "events": "test_crewlet_events"}


def test_solo_default_is_two_sqlite_files_in_wal_mode(tmp_path: Path, django_db_blocker: Any) -> None:
    # Real connections built from the solo settings, outside the test databases.
    handler = ConnectionHandler(crewlet_settings.database_settings({}, tmp_path))
    with django_db_blocker.unblock():
        files = set()
        for alias in ("default", "events"):
            conn = handler[alias]
            assert conn.vendor == "sqlite"
            with conn.cursor() as cursor:
                cursor.execute("PRAGMA journal_mode")
                assert cursor.fetchone()[0] == "wal"
                cursor.execute("PRAGMA busy_timeout")
                assert cursor.fetchone()[0] == 20000
            files.add(Path(conn.settings_dict["NAME"]))
        assert files == {tmp_path / "crewlet.sqlite3", tmp_path / "events.sqlite3"}
        assert all(f.exists() for f in files)
        handler.close_all()


def test_postgres_settings_from_env(tmp_path: Path) -> None:
    dbs = crewlet_settings.database_settings(
        {"CREWLET_DATABASE": "postgres", "CREWLET_PG_PORT": "5433", "CREWLET_PG_DBNAME": "co"}, tmp_path
    )
    assert dbs["default"]["ENGINE"] == dbs["events"]["ENGINE"] == "django.db.backends.postgresql"
    assert (dbs["default"]["HOST"], dbs["default"]["PORT"]) == ("/var/run/postgresql", "5433")
    assert (dbs["default"]["NAME"], dbs["events"]["NAME"]) == ("co", "crewlet_events")
    assert dbs["default"]["TEST"]["NAME"] != dbs["events"]["TEST"]["NAME"]
    with pytest.raises(ImproperlyConfigured, match="CREWLET_DATABASE='mysql'"):
        crewlet_settings.database_settings({"CREWLET_DATABASE": "mysql"}, tmp_path)


# -- structured logging -------------------------------------------------------


def _record(**extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("crewlet.engine", logging.INFO, __file__, 1, "engine_started", (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_key_value_formatter_renders_extra_fields() -> None:
    line = KeyValueFormatter().format(_record(node="n1", broker_url="nats://127.0.0.1:4222", note="two words", n=3))
    assert " level=info logger=crewlet.engine event=engine_started node=n1 " in line
    assert 'broker_url=nats://127.0.0.1:4222 note="two words" n=3' in line
    assert "\n" not in line


def test_json_formatter_renders_extra_fields() -> None:
    data = json.loads(JsonFormatter().format(_record(node="n1", services=2)))
    assert data["event"] == "engine_started" and data["node"] == "n1" and data["services"] == 2


# -- the engine worker, on the in-memory twin ---------------------------------


class FakeBroker:
    """Stands in for the embedded broker: records that it was stopped."""

    def __init__(self, client_url: str = "nats://127.0.0.1:4222") -> None:
        self.client_url = client_url
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


def twin_connect(broker: FakeBroker, seen: Optional[dict[str, Any]] = None) -> Callable[..., Any]:
    async def connect(**kwargs: Any) -> tuple[Any, FakeBroker]:
        if seen is not None:
            seen.update(kwargs)
        twin = MemoryBroker(kwargs["timings"], event_retention_hours=kwargs["event_retention_hours"])
        return twin.client(kwargs["node"]), broker

    return connect


def events_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "crewlet.engine"]


def fast_settings(**overrides: Any) -> Any:
    return load_settings({}, {}, overrides={"node.id": "n1", **overrides})


async def test_engine_connects_with_the_settings_runs_services_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine")
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
    caplog.set_level(logging.INFO, logger="crewlet.engine")
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

    async def service(e: Engine) -> None:
        assert e.queue is not None
        await e.queue.subscribe(topic, group, stuck)
        await e.queue.publish(topic, Event(type="task_assigned"))

    engine.add_service(service)
    run = asyncio.create_task(engine.serve())
    await eventually(lambda: engine.queue is not None and engine.queue.in_flight() == 1)
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    events = events_logged(caplog)
    assert "engine_drain_incomplete" in events and events[-1] == "engine_stopped"
    # Past the drain the handler was cancelled and its message went back, not left to the ack clock.
    assert cancelled.is_set()
    consumer = twins[0].consumer(topic, group)
    assert (len(consumer.available), len(consumer.inflight)) == (1, 0)


async def test_a_second_signal_skips_the_drain(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine")
    engine = Engine(fast_settings(), drain_timeout_s=60, connect=twin_connect(FakeBroker()))
    topic, group = topics.agent_inbox("cy"), topics.agent_inbox_group("cy")
    release = asyncio.Event()

    async def slow(delivery: Any) -> None:
        await release.wait()

    async def service(e: Engine) -> None:
        assert e.queue is not None
        await e.queue.subscribe(topic, group, slow)
        await e.queue.publish(topic, Event(type="task_assigned"))

    engine.add_service(service)
    run = asyncio.create_task(engine.serve())
    await eventually(lambda: engine.queue is not None and engine.queue.in_flight() == 1)
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
    caplog.set_level(logging.INFO, logger="crewlet.engine")
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
    caplog.set_level(logging.INFO, logger="crewlet.engine")

    async def refuse(**kwargs: Any) -> Any:
        raise ConnectionRefusedError("no broker")

    engine = Engine(fast_settings(), connect=refuse)
    assert await asyncio.wait_for(engine.serve(), 5) == 1
    assert events_logged(caplog) == ["engine_start_failed"]


async def test_the_logged_broker_url_carries_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="crewlet.engine")
    engine = Engine(fast_settings(), connect=twin_connect(FakeBroker("nats://crewlet:s3cret@127.0.0.1:4999")))
    run = asyncio.create_task(engine.serve())
    await eventually(lambda: "engine_started" in events_logged(caplog))
    engine.stop()
    assert await asyncio.wait_for(run, 5) == 0
    record = next(r for r in caplog.records if r.getMessage() == "engine_started")
    assert record.broker_url == "nats://crewlet:***@127.0.0.1:4999"
    assert "s3cret" not in caplog.text


# -- the management commands' flags ----------------------------------------------


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


# -- manage.py up, for real -----------------------------------------------------


class ProcessOutput:
    """Collects a child's merged stdout/stderr on a thread so the test can wait on lines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, needle: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    raise AssertionError(f"{needle!r} not seen in time; output:\n" + "\n".join(self.lines))
                self._cond.wait(min(remaining, 0.5))

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "\n".join(self.lines)


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, comm, state) for every process we can see."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        table[int(entry.name)] = (int(ppid), comm, state)
    return table


def _descendants(root: int) -> dict[int, str]:
    table = _proc_table()
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, comm, _) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = comm
                frontier.append(pid)
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reaped-later zombie holds no port or memory)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _broker_secrets(pid: int) -> list[str]:
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}
    env.update(CREWLET_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="crewlet.settings")
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "manage.py"), "up", "--node", "t1", "--store-dir", str(tmp_path / "js"), "--addr", "127.0.0.1:0"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = ProcessOutput(proc)
    brokers: list[int] = []
    try:
        started = out.wait_for("event=engine_started", timeout_s=60)
        assert "node=t1" in started and "stream_type=embedded" in started
        brokers = [pid for pid, comm in _descendants(proc.pid).items() if comm == "nats-server"]
        assert brokers, f"no nats-server child of manage.py up: {_descendants(proc.pid)}"
        secrets_ = [s for pid in brokers for s in _broker_secrets(pid)]
        assert secrets_, "the embedded broker runs without a credential"
        assert "broker_url=nats://127.0.0.1:" in started

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0, out.text()
        text = out.text()
        assert "event=engine_stopped" in text
        assert "Crewlet node t1 starting" in text
        assert not [s for s in secrets_ if s in text], "the broker credential was logged"
        assert (tmp_path / "var" / "secret_key").exists()  # settings used the temporary var dir

        deadline = time.monotonic() + 3
        while any(_running(pid) for pid in brokers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in brokers if _running(pid)], "nats-server outlived manage.py up"
    finally:
        # Only what this test started: the child's process group, and the brokers it spawned.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in brokers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)
