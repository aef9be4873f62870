"""The web server of a real ``manage.py up`` as tests/http meets it: the process, a browser, a WebSocket client.

:class:`Up` is ``up`` on a free port with a fresh data directory (the
``start_up`` fixture in tests/http/conftest.py starts and stops them);
:class:`Browser` signs in with cookies and CSRF from a chosen source address;
:class:`Socket` opens ``/ws/stream`` and reads its frames.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import struct
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlencode

from tests.up_support import UpProcess, http_call, up_env

STAFF_USER = "operator"
STAFF_PASSWORD = "hardening-test-password-4711"
#: A condition the test waits for is expected well within this.
WAIT_S = 30.0


class Up(UpProcess):
    """``manage.py up`` on a free port with a fresh data dir (SQLite, the example company) and ``env``."""

    def __init__(self, tmp: Path, **env: str) -> None:
        self.data_dir = tmp / "data"
        super().__init__(tmp, node="hw1", env=up_env(CREWLET_VAR_DIR=str(self.data_dir), **env))
        self.host = ""
        self.port = 0

    def start(self) -> "Up":
        super().start()
        self.host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        self.port = int(port)
        return self

    def request(
        self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[dict[str, str]] = None
    ) -> tuple[int, dict[str, str], bytes]:
        return http_call(method, self.url + path, body, headers, redirects=False, timeout_s=30)

    def rss_kib(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def operator_token(self, name: str) -> str:
        """A new operator token named ``name``, minted with ``manage.py operator_token`` as an operator would."""
        return self.manage("operator_token", name).strip()


def bearer(token: str) -> dict[str, str]:
    """The header that presents ``token`` (an operator token) to the API or ``/ws/stream``."""
    return {"Authorization": f"Bearer {token}"}


class Browser:
    """Cookies, CSRF and a chosen source address (any 127.x.y.z reaches a loopback listener)."""

    def __init__(self, up: Up, source_ip: str = "127.0.0.1") -> None:
        self.up = up
        self.source_ip = source_ip
        self.cookies: dict[str, str] = {}

    def call(
        self, method: str, path: str, form: Optional[dict[str, str]] = None, headers: Optional[dict[str, str]] = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.up.host, self.up.port, timeout=30, source_address=(self.source_ip, 0))
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            data = response.read()
            for name, value in response.getheaders():
                if name.lower() == "set-cookie":
                    cookie = value.split(";", 1)[0]
                    key, _, val = cookie.partition("=")
                    self.cookies[key.strip()] = val.strip().strip('"')
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data
        finally:
            conn.close()

    def sign_in(self, username: str, password: str) -> tuple[int, dict[str, str], bytes]:
        status, _, page = self.call("GET", "/login/")
        assert status == 200, page
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token is not None, page
        form = {"csrfmiddlewaretoken": token.group(1).decode(), "username": username, "password": password, "next": ""}
        return self.call("POST", "/login/", form=form)

    def sign_out(self) -> int:
        return self.call("POST", "/logout/", headers={"X-CSRFToken": self.cookies["csrftoken"]})[0]


def staff_user(up: Up) -> None:
    up.manage("createsuperuser", "--noinput", "--username", STAFF_USER, "--email", "op@example.com",
              extra_env={"DJANGO_SUPERUSER_PASSWORD": STAFF_PASSWORD})


class Socket:
    """A WebSocket client in a few lines: the handshake, then frames (answering the server's pings)."""

    def __init__(self, up: Up, headers: dict[str, str], host_header: Optional[str] = None) -> None:
        self.sock = socket.create_connection((up.host, up.port), timeout=WAIT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            "GET /ws/stream HTTP/1.1",
            f"Host: {host_header or f'{up.host}:{up.port}'}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.status = int(head.split()[1]) if head else 0

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the server closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def frame(self) -> tuple[int, bytes]:
        while True:
            b0, b1 = self._read(2)
            length = b1 & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(length)
            opcode = b0 & 0x0F
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            return opcode, payload

    def text(self) -> dict[str, Any]:
        opcode, payload = self.frame()
        assert opcode == 0x1, (opcode, payload)
        return json.loads(payload)

    def close_code(self, timeout_s: float = WAIT_S) -> int:
        """Read on (events, pings) until the server's close frame; its code. Fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the server did not close the socket within {timeout_s} s")
            self.sock.settimeout(remaining)
            try:
                opcode, payload = self.frame()
            except socket.timeout:
                raise AssertionError(f"the server did not close the socket within {timeout_s} s") from None
            if opcode == 0x8:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005

    def close(self) -> None:
        self.sock.close()
