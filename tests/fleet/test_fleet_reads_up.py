"""Fleet reads through real ``manage.py up`` processes: two nodes on one nats-server, each with its OWN event store.

The nodes share the coordination store (the test's ``default`` database, where
each writes its presence, the node lease the roster reads) and each migrates
and writes its own events database. What one node is asked over HTTP is answered by both.
"""
from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import urllib.request
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from crewlet.queue.natsserver import find_nats_server
from eventstore import fanout
from eventstore.models import EventRow
from eventstore import questions as qs
from eventstore_support import make_event, store, trace
from fleet_support import alias_of, node_databases
from tests.up_support import UpProcess, http_json, up_env

TOKEN = "fleet-reads-operator-token-0123456789abcdef"
NODES = ("ua", "ub")
S = timedelta(seconds=1)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "events", *(alias_of(n) for n in NODES)]),
]


@pytest.fixture(scope="module")
def stores(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, str]]:
    from tests.conftest import on_postgres

    if not on_postgres():
        pytest.skip("each node's store is its own PostgreSQL database")
    with django_db_blocker.unblock(), node_databases(NODES, tables=False) as names:
        yield names


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    """A nats-server with JetStream on a free loopback port: the fleet's broker."""
    binary = find_nats_server()
    assert binary is not None, "nats-server is installed with the requirements"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "Server is ready" in line:
                break
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _up(tmp: Path, node: str, url: str, events_db: str) -> UpProcess:
    env = up_env(
        CREWLET_DATABASE="postgres",
        CREWLET_PG_DBNAME=connections["default"].settings_dict["NAME"],
        CREWLET_PG_EVENTS_DBNAME=events_db,
        CREWLET_OPERATOR_TOKEN=TOKEN,
        CREWLET_FLEET_READ_BUDGET_S="0.5",
    )
    (tmp / node).mkdir()
    return UpProcess(tmp / node, "--data-dir", str(tmp / node / "data"), "--stream-type", "nats", "--stream-url", url, node=node, env=env)


def _get(up: UpProcess, path: str, **params: Any) -> Any:
    status, body = http_json("GET", f"{up.url}{path}?{urlencode(params)}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body
    return body


def _overview(up: UpProcess) -> str:
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with browser.open(up.url + "/login/", timeout=30) as response:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.read().decode())
    assert token is not None
    form = urlencode({"csrfmiddlewaretoken": token.group(1), "username": "op", "password": "pw-0123456789", "next": "/"})
    with browser.open(urllib.request.Request(up.url + "/login/", data=form.encode()), timeout=30) as response:
        return str(response.read().decode())


def test_two_up_nodes_answer_every_read_together_and_a_stopped_one_is_named_within_the_budget(
    tmp_path: Path, stores: dict[str, str], broker: str
) -> None:
    get_user_model().objects.create_user("op", password="pw-0123456789", is_staff=True)
    now = qs.instant()
    edge = trace(11)
    hop = edge.__class__(edge.trace_id, "b" * 16, edge.span_id)
    with _up(tmp_path, "ub", broker, stores["ub"]) as ub:
        b_rows = [make_event("org_started", now - 3600 * S + i * 7 * S, event_id=f"ub-{i:02d}", node="ub") for i in range(9)]
        b_rows.append(make_event("agent_turn_started", now - 3000 * S, event_id="ub-turn", span=hop, node="ub", seat="ada", turn_id="t-1"))
        store(*b_rows, using=alias_of("ub"))
        with _up(tmp_path, "ua", broker, stores["ua"]) as ua:
            a_rows = [make_event("org_started", now - 3600 * S + i * 5 * S, event_id=f"ua-{i:02d}", node="ua") for i in range(8)]
            a_rows.append(make_event("inbound_delivery", now - 3001 * S, event_id="ua-edge", span=edge, node="ua",
                                     surface="webhook", event_name="push"))
            a_rows.append(make_event("org_started", b_rows[0].timestamp, event_id="ua-same-microsecond", node="ua"))
            store(*a_rows, using=alias_of("ua"))
            window = {"since": (now - 7200 * S).isoformat(), "until": (now - 60 * S).isoformat()}

            seen, cursor = [], ""
            while True:
                page = _get(ua, "/api/events", limit=7, **window, **({"cursor": cursor} if cursor else {}))
                assert page["coverage"] == {"nodes": [{"id": n, "answered": True, "error": ""} for n in NODES], "complete": True}
                seen += [row["id"] for row in page["events"]]
                cursor = page["next_cursor"] or ""
                if not cursor:
                    break
            everything = sorted(a_rows + b_rows, key=lambda e: (e.timestamp, e.id), reverse=True)
            assert seen == [e.id for e in everything]

            tree = _get(ub, f"/api/traces/{edge.trace_id}")
            [root] = tree["spans"]
            assert [e["id"] for e in root["events"]] == ["ua-edge"] and [e["id"] for e in root["children"][0]["events"]] == ["ub-turn"]

            bars = _get(ua, "/api/events/series", window="3h", bucket="1h", **{"until": window["until"]})["bars"]
            assert sum(bar["total"] for bar in bars) == len(everything)  # the two stores summed (nothing else before "until")

            html = _overview(ua)  # seeded at ua's start from both stores: ub's rows are on ua's screen
            assert 'data-id="ub-08"' in html

            os.kill(ub.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            try:
                partial = _get(ua, "/api/events", limit=50, **window)
            finally:
                os.kill(ub.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            assert partial["coverage"]["complete"] is False
            assert partial["coverage"]["nodes"][1] == {"id": "ub", "answered": False, "error": f"{fanout.TIMED_OUT}: no answer within 0.5s"}
            assert {row["node"] for row in partial["events"]} == {"ua"}
            assert "history_partial" in ua.wait_for("history_partial")


def _sessions(alias: str) -> int:
    """How many sessions the database behind ``alias`` has had opened (PostgreSQL's own count; a backend counts once it has started)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return int(count)


@contextmanager
def leaving_no_row(alias: str, event_id: str) -> Iterator[None]:
    """Delete ``event_id``'s row from ``alias``'s store afterwards: the node stores outlive one test, and in any
    order a row left behind would be read by the next test's window."""
    try:
        yield
    finally:
        EventRow.objects.using(alias).filter(id=event_id).delete()


def test_a_history_read_through_up_reuses_the_nodes_store_connections_instead_of_opening_new_ones_per_request(
    tmp_path: Path, stores: dict[str, str], broker: str
) -> None:
    alias = alias_of("ua")
    with _up(tmp_path, "ua", broker, stores["ua"]) as ua, leaving_no_row(alias, "ua-read-me"):  # it migrates its store as it starts
        store(make_event("org_started", qs.instant() - 60 * S, event_id="ua-read-me", node="ua"), using=alias)
        for _ in range(5):  # the read threads connect on first use
            assert "ua-read-me" in [row["id"] for row in _get(ua, "/api/events", node="ua", limit=100)["events"]]
        before = _sessions(alias)
        for _ in range(20):
            page = _get(ua, "/api/events", node="ua", limit=100)
            assert page["coverage"]["complete"] is True and "ua-read-me" in [row["id"] for row in page["events"]]
        opened = _sessions(alias) - before
    # A request thread under ASGI starts every request with no connection: reading the store there
    # opened one per request (20 here). A read thread's connection lasts; the few a late-counted
    # warm-up connection may add stay far below one per request.
    assert opened < 10, f"{opened} sessions opened on the node's store for 20 reads"
