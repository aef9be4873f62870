"""Clients flooding `up`'s web server over time: slow bodies past its connection caps, dashboard tabs past its live-stream cap.

The caps themselves, and their refusals one by one, are tests/http/test_hardening_web_caps.py's.
Here the flood goes on while normal traffic flows, and the figures are what an
operator would want to know: how many of the flood's connections were held,
shed or cut, and whether anything a normal client asked was refused or slow.
"""
from __future__ import annotations

import socket
import statistics
import threading
import time
import types
from pathlib import Path
from typing import Optional

import pytest

from crewlet.http.limits import derived_connection_caps
from eventstore import stream
from tests.faults.conftest import Figures
from tests.faults.fault_support import TOKEN, Sender, Up, company_yaml, request, wait_until
from web_support import Socket
from tests.http.test_hardening_web_caps import children_with_nofile, next_event, served_tab

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

#: The issue's machine: ``nofile`` 1024, 512 slow bodies; here from four addresses, a byte a second each.
NOFILE = 1024
FLOOD_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
FLOOD_PER_ADDRESS = 128
#: A body's whole deadline (shrunk from 60 s so the flood meets it several times).
BODY_TIMEOUT_S = 4.0
FLOOD_S = 14.0
HEAD = (b"POST /webhooks/slack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{")


class Flood:
    """Connections from ``addresses`` that keep ``per_address`` slow bodies open each, reopening what the server ends."""

    def __init__(self, port: int, addresses: tuple[str, ...], per_address: int) -> None:
        self.port = port
        self.per_address = per_address
        self.open: dict[str, list[socket.socket]] = {a: [] for a in addresses}
        self.opened = 0
        #: How the server ended each: its status ("503" shed, "408" past the body's deadline), or "none" (closed
        #: unanswered: shed while SHED_LINGER_MAX shed ones still linger).
        self.answers: dict[str, int] = {}

    def _fill(self) -> None:
        for address, socks in self.open.items():
            while len(socks) < self.per_address:
                try:
                    sock = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(address, 0))
                    sock.sendall(HEAD)
                except OSError:
                    self.answers["connect_failed"] = self.answers.get("connect_failed", 0) + 1
                    break
                sock.setblocking(False)
                socks.append(sock)
                self.opened += 1

    def _reap(self) -> None:
        """Close what the server answered (503 at once, or 408 at the body's deadline), counting each answer."""
        for address, socks in self.open.items():
            held = []
            for sock in socks:
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    held.append(sock)
                    continue
                except OSError:
                    data = b""
                status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else "none"
                self.answers[status] = self.answers.get(status, 0) + 1
                sock.close()
            self.open[address] = held

    def run(self, until: float) -> None:
        while time.monotonic() < until:
            self._fill()
            for socks in self.open.values():  # one more byte each: an idle timer would restart on it
                for sock in socks:
                    try:
                        sock.send(b" ")
                    except OSError:
                        pass
            self._reap()
            time.sleep(1.0)  # the flood's own pace (a byte a second), not a wait for a condition
        for socks in self.open.values():
            for sock in socks:
                sock.close()


def test_a_slow_body_flood_from_four_addresses_is_shed_past_each_ones_share_and_cut_at_its_deadline_while_normal_requests_are_served(
    tmp_path: Path, figures: Figures, monkeypatch: pytest.MonkeyPatch
) -> None:
    total, per_client = derived_connection_caps(NOFILE)
    up = Up(tmp_path, company=company_yaml(), env={"CREWLET_HTTP_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)})
    try:
        with children_with_nofile(monkeypatch, NOFILE):
            up.start()
        flood = Flood(int(up.url.rsplit(":", 1)[1]), FLOOD_ADDRESSES, FLOOD_PER_ADDRESS)
        attacker = threading.Thread(target=flood.run, args=(time.monotonic() + FLOOD_S,), daemon=True)
        attacker.start()
        sender = Sender(up)
        latencies: list[float] = []
        refused = 0
        while attacker.is_alive():
            began = time.monotonic()
            status, _ = request(f"{up.url}/healthz", timeout_s=30)
            delivery = sender.send(sender.new(), retries=1, timeout_s=30)
            latencies.append(time.monotonic() - began)
            refused += (status != 200) + (delivery != 202)
        attacker.join()
        outcome = sender.wait_all_ran(timeout_s=60)
        shed_lines = up.log_text().count("event=http_connection_shed")
        record_note = (
            f"nofile {NOFILE} (caps {total} total, {per_client} per address); {len(FLOOD_ADDRESSES)}x{FLOOD_PER_ADDRESS} slow bodies "
            f"for {FLOOD_S:g} s, {flood.opened} opened: "
            f"{flood.answers.get('503', 0)} shed 503, {flood.answers.get('none', 0)} shed unanswered (16 sheds already lingering), "
            f"{flood.answers.get('408', 0)} held until cut 408 at {BODY_TIMEOUT_S:g} s; "
            f"{len(latencies)} normal healthz+webhook pairs, {refused} refused, p50 {statistics.median(latencies) * 1000:.0f} ms, "
            f"max {max(latencies) * 1000:.0f} ms; {shed_lines} shed log records"
        )
        lost = [d.key for d in sender.accepted if outcome.runs(d.key) == 0]
        doubled = [d.key for d in sender.accepted if outcome.runs(d.key) > 1]
        figures.record(
            sent=len(sender.deliveries), accepted=len(sender.accepted), lost=len(lost), duplicated=len(doubled), delayed=None,
            max_delay_s=max(latencies), recovery_s=None, bound_s=None, note=record_note,
            flood_opened=flood.opened, flood_answers=flood.answers, normal_refused=refused,
        )
        # Were an address's share not held to its cap, the flood (512 > the total cap) would take every place.
        assert refused == 0 and not lost and not doubled, (refused, lost, doubled)
        assert flood.answers.get("503", 0) > 0 and flood.answers.get("408", 0) > 0, flood.answers
        assert 1 <= shed_lines < flood.answers["503"]  # logged, rate-limited
    finally:
        up.cleanup()


#: The live-stream cap of the tabs case (200 by default; shrunk so the case opens tens of sockets, not hundreds).
MAX_STREAMS = 30
TABS = 45


def test_dashboard_tabs_past_the_live_stream_cap_are_told_4013_while_the_served_ones_keep_the_feed_and_places_come_back(
    tmp_path: Path, figures: Figures
) -> None:
    up = Up(tmp_path, company=company_yaml(), env={"CREWLET_WS_MAX_STREAMS": str(MAX_STREAMS)})
    tabs: list[Socket] = []
    try:
        up.start()
        host, port = up.url.split("://", 1)[1].rsplit(":", 1)
        where = types.SimpleNamespace(host=host, port=int(port))
        auth = {"Authorization": f"Bearer {TOKEN}"}
        served, codes = [], {}
        for _ in range(TABS):
            tab = Socket(where, auth)  # type: ignore[arg-type]  # the socket needs only host and port
            tabs.append(tab)
            tab.sock.settimeout(30)
            opcode, payload = tab.frame()
            if opcode == 0x1:
                served.append(tab)
            else:
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                codes[code] = codes.get(code, 0) + 1
        sender = Sender(up)
        sender.send_new(3)
        fed = [next_event(tab)["kind"] for tab in served]  # every served tab gets the live feed
        for tab in served[:10]:
            tab.close()
        asked = [0]

        def a_place() -> Optional[Socket]:
            asked[0] += 1
            return served_tab(where, auth)  # type: ignore[arg-type]  # the socket needs only host and port

        again = [wait_until(a_place, timeout_s=30, what="a tab served in a place a closed one gave back") for _ in range(10)]
        tabs.extend(again)
        outcome = sender.wait_all_ran(timeout_s=60)
        log = up.log_text()
        figures.record(
            sent=len(sender.deliveries), accepted=len(sender.accepted), lost=sum(1 for d in sender.accepted if outcome.runs(d.key) == 0),
            duplicated=sum(1 for d in sender.accepted if outcome.runs(d.key) > 1), delayed=None, max_delay_s=None,
            recovery_s=None, bound_s=None,
            note=(f"{TABS} tabs at a cap of {MAX_STREAMS}: {len(served)} served, close codes {codes}; {len(fed)} served tabs fed "
                  f"the live events; 10 closed, 10 new tabs served in their places after {asked[0]} tries; "
                  f"{log.count('code=1011')} close 1011, {log.count('Traceback')} tracebacks"),
            tabs_served=len(served), tabs_shed=codes, tries_for_10_places=asked[0],
        )
        assert len(served) == MAX_STREAMS and codes == {stream.CLOSE_TRY_AGAIN_LATER: TABS - MAX_STREAMS}, (len(served), codes)
        assert fed == [stream.KIND_EVENT] * MAX_STREAMS
        assert "code=1011" not in log and "Traceback" not in log
    finally:
        for tab in tabs:
            tab.close()
        up.cleanup()

