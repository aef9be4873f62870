"""Slow clients don't stall others: slow-loris headers and trickled bodies held open while normal traffic flows.

The figures (how long the normal requests took while the slow ones were held,
how many slow connections the server had closed by the end) are measured and
reported; the assertions are about outcomes: every normal request is answered
and every accepted delivery runs exactly once.
"""
from __future__ import annotations

import socket
import statistics
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Figures
from tests.faults.fault_support import Sender, Up, company_yaml, request

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLOW_HEADERS = 20
SLOW_BODIES = 20
NORMAL = 15


def _open(port: int, first: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(first)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def test_slow_loris_and_slow_body_connections_do_not_stall_normal_requests(tmp_path: Path, figures: Figures) -> None:
    up = Up(tmp_path, company=company_yaml())
    slow: list[socket.socket] = []
    try:
        up.start()
        port = int(up.url.rsplit(":", 1)[1])
        for i in range(SLOW_HEADERS):
            slow.append(_open(port, b"POST /webhooks/slack HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-" + str(i).encode() + b": "))
        for _ in range(SLOW_BODIES):
            slow.append(_open(port, b"POST /webhooks/slack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: 100000\r\n\r\n{\"type\": \"event_callback\", "))
        sender = Sender(up)
        latencies: list[float] = []
        for i in range(NORMAL):
            for sock in slow:  # each slow client trickles one more byte between normal requests
                try:
                    sock.sendall(b"a")
                except OSError:
                    pass
            began = time.monotonic()
            status, _ = request(f"{up.url}/healthz", timeout_s=30)
            assert status == 200
            delivery = sender.new()
            assert sender.send(delivery, retries=1, timeout_s=30) == 202, delivery.statuses
            latencies.append(time.monotonic() - began)
        outcome = sender.wait_all_ran(timeout_s=60)
        closed = sum(1 for sock in slow if _closed_by_server(sock))
        lost = [d.key for d in sender.accepted if outcome.runs(d.key) == 0]
        doubled = [d.key for d in sender.accepted if outcome.runs(d.key) > 1]
        figures.record(
            sent=NORMAL, accepted=len(sender.accepted), lost=len(lost), duplicated=len(doubled), delayed=None,
            max_delay_s=max(latencies), recovery_s=None, bound_s=None,
            note=(f"{len(slow)} slow connections held; healthz+delivery pair p50 {statistics.median(latencies) * 1000:.0f} ms, "
                  f"max {max(latencies) * 1000:.0f} ms; {closed} slow connections closed by the server"),
        )
        assert not lost and not doubled, (lost, doubled)
    finally:
        for sock in slow:
            sock.close()
        up.cleanup()
