"""What many slow clients, and many dashboard tabs, can make ``manage.py up`` hold — each through a real ``up``.

A body has a deadline from the end of its head, however slowly it trickles;
open connections are capped per client address and in total (by default from
``RLIMIT_NOFILE``), a connection past a cap is shed with a 503 and the shed is
logged, rate-limited; ``/ws/stream`` serves a bounded number of live sockets
and tells the next one to try again later with a code the server can send.
"""
from __future__ import annotations

import contextlib
import functools
import http.client
import json
import resource
import select
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

from crewlet.http import bounded, limits, shedding
from eventstore import stream
from tests.browser_support import slack_message
from tests.process_support import REPO_ROOT
from waiting_support import wait_until
from web_support import WAIT_S, Socket, Up, bearer

pytestmark = pytest.mark.integration

#: The file-descriptor limit ``up`` is started under when a test needs its derived caps small.
SMALL_NOFILE = 256
#: Long enough that no connection a test holds is closed by a timer it did not mean to test.
HOLD_S = "600"


@contextlib.contextmanager
def children_with_nofile(monkeypatch: pytest.MonkeyPatch, limit: int) -> Iterator[None]:
    """A process started meanwhile gets a soft RLIMIT_NOFILE of ``limit``, set in the child: this one keeps its own."""

    def lower() -> None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))

    popen = subprocess.Popen
    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", functools.partial(popen, preexec_fn=lower))
        yield


@pytest.fixture
def start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Up]]:
    """Start ``up`` with ``env`` (and at most ``nofile_limit`` descriptors, if given); each is stopped after the test,
    which fails if it printed a traceback."""
    started: list[Up] = []

    def start(nofile_limit: Optional[int] = None, **env: str) -> Up:
        up = Up(tmp_path / f"up{len(started)}", **env)
        up.tmp.mkdir()
        started.append(up)
        if nofile_limit is None:
            return up.start()
        with children_with_nofile(monkeypatch, nofile_limit):
            return up.start()

    yield start
    for up in started:
        output = up.stop()
        assert "Traceback" not in output, output[-6000:]


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    """The connections a test holds open; each is closed when the test ends, a failed one included (before its up stops)."""
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def slow_body(up: Up, source_ip: str, path: str = "/webhooks/slack") -> socket.socket:
    """A connection from ``source_ip`` that sent a whole head declaring a 100000-byte body, and one byte of it."""
    sock = socket.create_connection((up.host, up.port), timeout=WAIT_S, source_address=(source_ip, 0))
    sock.sendall(
        b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        % (path.encode(), up.host.encode(), up.port)
    )
    return sock


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends on ``sock`` until it closes it (blocking reads, each bounded by the socket's timeout)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def still_open(sock: socket.socket) -> bool:
    """Nothing to read on ``sock`` and no end of it: the server holds it, unanswered."""
    return not select.select([sock], [], [], 0)[0]


def call_from(
    up: Up, source_ip: str, method: str, path: str, body: Optional[bytes] = None, headers: Optional[dict[str, str]] = None
) -> tuple[int, bytes]:
    """One request from ``source_ip`` on a fresh connection; (status, body), or (0, b"") when it was closed unanswered."""
    conn = http.client.HTTPConnection(up.host, up.port, timeout=WAIT_S, source_address=(source_ip, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    except (ConnectionError, http.client.RemoteDisconnected):
        return 0, b""
    finally:
        conn.close()


def webhook(up: Up, source_ip: str, event_id: str) -> tuple[int, bytes]:
    body = json.dumps(slack_message(event_id, "hello")).encode()
    return call_from(up, source_ip, "POST", "/webhooks/slack", body, {"Content-Type": "application/json"})


def shed_reason(response: bytes) -> str:
    """The reason of a shed connection's 503 (fails on anything else)."""
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), response
    assert b"Retry-After: 1" in head, head
    parsed = json.loads(body)
    assert parsed["error"] == "unavailable", parsed
    return str(parsed["reason"])


def lines_with(up: Up, needle: str) -> list[str]:
    return [line for line in up.output_so_far().splitlines() if needle in line]


# -- the caps' arithmetic and the shed records' rate --------------------------------------------------


@pytest.mark.parametrize("nofile_limit", [64, 256, 1024, 20000, 1 << 20])
def test_the_derived_caps_leave_the_engine_a_quarter_of_the_descriptors_and_one_address_an_eighth_of_the_connections(
    nofile_limit: int
) -> None:
    total, per_client = limits.derived_connection_caps(nofile_limit)
    reserve = max(limits.RESERVED_FDS_MIN, nofile_limit // 4)
    assert total >= limits.CONNECTIONS_MIN
    if nofile_limit > 2 * limits.RESERVED_FDS_MIN:  # a limit that leaves room at all
        assert total * limits.FDS_PER_CONNECTION + limits.SHED_LINGER_MAX + reserve <= nofile_limit
    assert limits.PER_CLIENT_MIN <= per_client <= min(total, limits.PER_CLIENT_MAX)
    assert per_client == min(total, limits.PER_CLIENT_MAX, max(limits.PER_CLIENT_MIN, total // limits.PER_CLIENT_SHARE))
    behind_proxy = limits.Limits(behind_proxy=True).connection_caps(nofile_limit)
    assert behind_proxy == (total, 0)  # every connection is the proxy's: no per-address cap unless one is set
    assert limits.Limits(behind_proxy=True, max_connections_per_client=3).connection_caps(nofile_limit) == (total, 3)


def test_a_burst_of_sheds_is_logged_at_its_first_then_as_one_count_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    now = [100.0]
    logger = logging.getLogger("crewlet.test.shed")
    shed_log = shedding.ShedLog(logger, "thing_shed", interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="crewlet.test.shed"):
        for i in range(50):  # all within one interval: the first is logged, the other 49 counted
            shed_log.shed(client=f"c{i}")
            now[0] += 0.1
        assert [(getattr(r, "client"), getattr(r, "count")) for r in caplog.records] == [("c0", 1)]
        now[0] += 10.0
        shed_log.shed(client="late")  # the interval is over: the count so far, with this one
        shed_log.shed(client="again")
        shed_log.close()  # the count still pending is not lost
    assert [(getattr(r, "client"), getattr(r, "count")) for r in caplog.records] == [("c0", 1), ("late", 50), ("again", 1)]


# -- connections: per client address, in total --------------------------------------------------------


@pytest.mark.timeout(300)
def test_many_slow_bodies_from_one_address_are_shed_past_its_share_and_webhooks_and_healthz_from_another_are_answered(
    start_up: Callable[..., Up], held: list[socket.socket]
) -> None:
    total, per_client = limits.derived_connection_caps(SMALL_NOFILE)
    up = start_up(SMALL_NOFILE, CREWLET_HTTP_IDLE_TIMEOUT_S=HOLD_S, CREWLET_HTTP_BODY_TIMEOUT_S=HOLD_S)
    caps = up.wait_for("event=web_connection_caps", timeout_s=WAIT_S)
    assert f"max_connections={total} " in caps and f"max_connections_per_client={per_client} " in caps, caps
    assert f"nofile={SMALL_NOFILE}" in caps, caps

    held.extend(slow_body(up, "127.0.0.2") for _ in range(per_client))
    # Past its share each is answered 503 at once; held like the first ones, they would take more descriptors
    # than the process has (a socket each, and a file each for a declared 100000-byte body without the spool).
    shed = SMALL_NOFILE // 2
    for _ in range(shed):
        sock = slow_body(up, "127.0.0.2")
        reason = shed_reason(answer(sock))
        sock.close()
        assert reason == shedding.SHED_REASONS[shedding.SHED_PER_CLIENT].format(limit=per_client)
    assert all(still_open(sock) for sock in held)  # the address's share is still held, unanswered

    status, body = call_from(up, "127.0.0.1", "GET", "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok", body
    assert webhook(up, "127.0.0.1", "Ev-caps-other-address")[0] == 202

    first = up.wait_for(f"event={shedding.SHED_EVENT}", timeout_s=WAIT_S)
    assert f"reason={shedding.SHED_PER_CLIENT}" in first and "client=127.0.0.2:" in first and "count=1" in first, first
    records = lines_with(up, f"event={shedding.SHED_EVENT}")
    assert 1 <= len(records) < shed, records  # a burst, not a record per shed connection

    # A held connection that goes frees its place: the address is served again.
    held.pop().close()
    wait_until(lambda: webhook(up, "127.0.0.2", "Ev-caps-freed")[0] == 202, WAIT_S, "a webhook from 127.0.0.2 once a place is free")


@pytest.mark.timeout(300)
def test_past_the_total_cap_any_address_is_shed_and_a_closed_websocket_gives_its_place_back(
    start_up: Callable[..., Up], held: list[socket.socket]
) -> None:
    up = start_up(
        CREWLET_HTTP_MAX_CONNECTIONS="4",
        CREWLET_HTTP_MAX_CONNECTIONS_PER_CLIENT="2",
        CREWLET_HTTP_IDLE_TIMEOUT_S=HOLD_S,
        CREWLET_HTTP_BODY_TIMEOUT_S=HOLD_S,
    )
    auth = bearer(up.operator_token("caps-tab"))
    held.extend(slow_body(up, ip) for ip in ("127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"))
    for ip in ("127.0.0.4", "127.0.0.5"):  # addresses holding nothing, refused all the same
        sock = socket.create_connection((up.host, up.port), timeout=WAIT_S, source_address=(ip, 0))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (up.host.encode(), up.port))
        assert shed_reason(answer(sock)) == shedding.SHED_REASONS[shedding.SHED_TOTAL].format(limit=4)
        sock.close()
    line = up.wait_for(f"event={shedding.SHED_EVENT}", timeout_s=WAIT_S)
    assert f"reason={shedding.SHED_TOTAL}" in line and "client=127.0.0.4:" in line and "limit=4" in line, line
    assert all(still_open(sock) for sock in held)

    held.pop().close()
    wait_until(lambda: call_from(up, "127.0.0.4", "GET", "/healthz")[0] == 200, WAIT_S, "/healthz once a place is free")
    # The one free place, taken and given back by one WebSocket after another: each closed socket is counted out.
    for _ in range(3):
        ws = wait_until(lambda: served_tab(up, auth), WAIT_S, "a /ws/stream socket served in the free place")
        ws.close()


# -- a body's whole duration ----------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_body_trickled_a_byte_at_a_time_is_answered_408_and_closed_at_its_deadline_while_a_prompt_body_is_served(
    start_up: Callable[..., Up]
) -> None:
    up = start_up(CREWLET_HTTP_BODY_TIMEOUT_S="1", CREWLET_HTTP_IDLE_TIMEOUT_S=HOLD_S)
    trickler = slow_body(up, "127.0.0.2")
    response = b""
    closed = False
    for _ in range(int(WAIT_S / 0.2)):  # a byte every 0.2 s: the idle timer never runs out; the body never completes
        if select.select([trickler], [], [], 0.2)[0]:
            response = answer(trickler)
            closed = True
            break
        try:
            trickler.sendall(b" ")
        except (BrokenPipeError, ConnectionResetError):
            response = answer(trickler)
            closed = True
            break
    trickler.close()
    assert closed, "the trickled body was never cut off"
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), response
    assert json.loads(body) == {"error": bounded.REASON_BODY_TOO_SLOW.format(timeout_s=1.0)}
    line = up.wait_for("event=web_body_timeout", timeout_s=WAIT_S)
    assert "path=/webhooks/slack" in line and "client=127.0.0.2:" in line, line
    assert webhook(up, "127.0.0.1", "Ev-body-prompt")[0] == 202


# -- /ws/stream: a bounded number of live sockets, and a close code the server can send ---------------


def close_frame(ws: Socket) -> tuple[int, str]:
    """The server's first frame after the handshake (pings answered), which must be its close frame: code and reason."""
    ws.sock.settimeout(WAIT_S)
    opcode, payload = ws.frame()
    assert opcode == 0x8, f"a frame other than the close came first: {opcode} {payload[:200]!r}"
    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
    return code, payload[2:].decode("utf-8")


def next_event(ws: Socket) -> dict[str, object]:
    """The socket's next event frame (each read bounded by the socket's timeout)."""
    ws.sock.settimeout(WAIT_S)
    frame = ws.text()
    assert frame["kind"] == stream.KIND_EVENT, frame
    return frame


@pytest.mark.timeout(300)
def test_past_the_nodes_live_stream_cap_a_socket_is_told_4013_try_again_later_while_the_open_ones_keep_receiving(
    start_up: Callable[..., Up]
) -> None:
    up = start_up(CREWLET_WS_MAX_STREAMS="2")
    auth = bearer(up.operator_token("cap-tab"))
    tabs = [Socket(up, auth) for _ in range(2)]
    for tab in tabs:
        assert tab.status == 101 and tab.text()["kind"] == stream.KIND_SNAPSHOT

    sheds = 5
    for _ in range(sheds):
        extra = Socket(up, auth)
        assert extra.status == 101  # accepted, so the client hears why
        assert close_frame(extra) == (stream.CLOSE_TRY_AGAIN_LATER, stream.UNAVAILABLE_FULL)
        extra.close()
    assert stream.CLOSE_TRY_AGAIN_LATER == 4013

    assert webhook(up, "127.0.0.1", "Ev-ws-cap")[0] == 202
    for tab in tabs:
        next_event(tab)  # the open sockets still get the live feed

    line = up.wait_for(f"event={stream.SHED_EVENT}", timeout_s=WAIT_S)
    assert "limit=2" in line and "live=2" in line and "count=1" in line, line
    assert 1 <= len(lines_with(up, f"event={stream.SHED_EVENT}")) < sheds  # once per burst, not per socket

    tabs.pop().close()  # its place is given back once the server has seen it go
    fresh = wait_until(lambda: served_tab(up, auth), WAIT_S, "a socket served in the place a closed one gave back")
    fresh.close()
    tabs[0].close()
    text = up.output_so_far()
    assert "Traceback" not in text and "code=1011" not in text, text[-6000:]


def served_tab(up: Up, auth: dict[str, str]) -> Optional[Socket]:
    """A socket served its snapshot; None (the socket closed) when it was told to try again later instead."""
    ws = Socket(up, auth)
    ws.sock.settimeout(WAIT_S)
    opcode, payload = ws.frame() if ws.status == 101 else (0x8, b"")
    if opcode == 0x1 and json.loads(payload)["kind"] == stream.KIND_SNAPSHOT:
        return ws
    ws.close()
    return None


@pytest.mark.timeout(300)
def test_events_follow_against_a_node_with_no_stream_to_spare_exits_non_zero_saying_why_and_to_try_again_later(
    start_up: Callable[..., Up]
) -> None:
    up = start_up(CREWLET_WS_MAX_STREAMS="1")
    token = up.operator_token("cap-cli")
    tab = Socket(up, bearer(token))
    assert tab.status == 101 and tab.text()["kind"] == stream.KIND_SNAPSHOT
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "events", "--follow", "--limit", "1", "--url", up.url, "--token", token],
        cwd=up.tmp, env=up.env, capture_output=True, text=True, timeout=120,
    )
    tab.close()
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"no live feed to give ({stream.UNAVAILABLE_FULL}); try again later" in done.stderr, done.stderr
    assert token not in done.stdout + done.stderr
