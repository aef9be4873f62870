"""What an attacker and an operator meet first at ``manage.py up``'s web server, each through a real ``up``.

Body limits enforced while reading, header timeouts, the sign-in throttle,
credentials kept out of the logs, ``/healthz``'s broker round trip and the
production settings ``check --deploy`` asks for. ``/ws/stream``'s re-checks
and Origin rule and the admin's static files are
tests/http/test_hardening_web_sessions.py's, the caps on slow clients
tests/http/test_hardening_web_caps.py's. ``up``, the browser and the socket are
tests/web_support.py's, the ``start_up`` fixture tests/http/conftest.py's.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.process_support import REPO_ROOT
from waiting_support import wait_until
from web_support import STAFF_PASSWORD, STAFF_USER, WAIT_S, Browser, Up, staff_user

pytestmark = pytest.mark.integration


# -- credentials never reach a log line ------------------------------------------------------------


JIRA_SECRET = "jira-query-secret-7f3a9c"
BEARER = "bearer-token-value-51d2e8"
SESSION = "sessioncookie0value9b7"
SIGNATURE = "sha256=deadbeefsignature4c1"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("log_format", ["kv", "json"])
def test_a_query_secret_header_token_cookie_or_signature_never_reaches_up_s_log_in_either_format(
    start_up: Callable[..., Up], log_format: str
) -> None:
    up = start_up(CREWLET_LOG_FORMAT=log_format)
    status, _, _ = up.request(
        "POST",
        f"/webhooks/jira?secret={JIRA_SECRET}",
        body=b"{not json",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {BEARER}",
            "Cookie": f"sessionid={SESSION}",
            "X-Hub-Signature": SIGNATURE,
        },
    )
    assert status == 400
    status, _, _ = up.request("GET", f"/api/events?token={BEARER}", headers={"Authorization": f"Bearer {BEARER}"})
    assert status == 401
    up.wait_for("Unauthorized", timeout_s=WAIT_S)
    text = up.stop()
    for secret in (JIRA_SECRET, BEARER, SESSION, SIGNATURE, "deadbeefsignature"):
        assert secret not in text
    request_lines = [line for line in text.splitlines() if "Bad Request" in line and "/webhooks/jira" in line]
    assert request_lines, text  # django.request did log the refusal...
    assert "secret=[redacted]" in request_lines[0]  # ...with the request, its secret blanked
    if log_format == "json":
        assert json.loads(request_lines[0])["logger"] == "django.request"


def test_both_formatters_blank_credential_fields_headers_url_passwords_and_tracebacks() -> None:
    import logging

    from crewlet.base.logfmt import JsonFormatter, KeyValueFormatter, RedactSecrets

    try:
        raise ValueError(f"cannot reach nats://crewlet:{BEARER}@127.0.0.1:4222 with Authorization: Bearer {BEARER}")
    except ValueError:
        exc_info = sys.exc_info()
    for formatter in (KeyValueFormatter(), JsonFormatter()):
        record = logging.LogRecord("crewlet.test", logging.WARNING, __file__, 1, "delivery_refused", None, exc_info)
        record.signing_secret = JIRA_SECRET
        record.headers = {"X-Slack-Signature": SIGNATURE, "Cookie": f"sessionid={SESSION}", "user-agent": "Slackbot"}
        record.scope_headers = [(b"authorization", f"Token {BEARER}".encode()), (b"host", b"localhost")]
        record.url = f"/webhooks/confluence?page=1&secret={JIRA_SECRET}"
        record.token_name = "env:CREWLET_OPERATOR_TOKEN"  # a token's name is not a token
        assert RedactSecrets().filter(record)
        line = formatter.format(record)
        for secret in (JIRA_SECRET, BEARER, SESSION, "deadbeefsignature"):
            assert secret not in line
        assert "Slackbot" in line and "page=1" in line and "env:CREWLET_OPERATOR_TOKEN" in line
        assert "ValueError" in line and "127.0.0.1:4222" in line


# -- a browser's and a socket's view of up -----------------------------------------------------------


# -- the web server bounds what a client can make it hold --------------------------------------------


MIB = 1024 * 1024


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def read_response_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.timeout(300)
def test_a_chunked_body_over_the_webhook_limit_is_refused_413_while_it_is_still_being_sent_holding_no_memory(
    start_up: Callable[..., Up]
) -> None:
    import select

    up = start_up()
    assert up.proc is not None
    peak_before = vm_kib(up.proc.pid, "VmHWM")
    total = 300 * MIB
    chunk = b"x" * MIB
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sock = socket.create_connection((up.host, up.port), timeout=WAIT_S)
    sock.sendall(
        b"POST /webhooks/slack HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" % (up.host.encode(), up.port)
    )
    sent = 0
    answered = False
    while sent < total:
        if select.select([sock], [], [], 0)[0]:
            answered = True
            break
        try:
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(chunk)
    if not answered:  # the connection broke: the answer must already be waiting
        answered = bool(select.select([sock], [], [], WAIT_S)[0])
    head = read_response_head(sock) if answered else b""
    sock.close()
    assert head.startswith(b"HTTP/1.1 413"), head
    assert b"1048576-byte limit" in head or b"Content-Length" in head
    assert sent < total, "the server waited for the whole body before answering"
    growth_mib = (vm_kib(up.proc.pid, "VmHWM") - peak_before) / 1024
    assert growth_mib < 100, f"the server's peak RSS grew {growth_mib:.0f} MiB"
    up.wait_for("event=web_body_too_large path=/webhooks/slack limit=1048576", timeout_s=WAIT_S)

    # A small chunked delivery still goes through, on a fresh connection.
    from tests.browser_support import slack_message

    body = json.dumps(slack_message("Ev-chunked-ok", "hello")).encode()
    sock = socket.create_connection((up.host, up.port), timeout=WAIT_S)
    sock.sendall(
        b"POST /webhooks/slack HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
        % (up.host.encode(), up.port, len(body), body)
    )
    assert read_response_head(sock).startswith(b"HTTP/1.1 202")
    sock.close()


@pytest.mark.timeout(180)
def test_a_declared_length_over_the_routes_limit_is_refused_413_before_any_body_is_sent(start_up: Callable[..., Up]) -> None:
    up = start_up(CREWLET_HTTP_MAX_BODY_BYTES="65536")
    for path, length, limit in (("/webhooks/github", 2 * MIB, 1048576), ("/api/events", 70000, 65536)):
        sock = socket.create_connection((up.host, up.port), timeout=WAIT_S)
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Expect: 100-continue\r\n\r\n" % (path.encode(), up.host.encode(), up.port, length)
        )
        response = b""
        while True:  # to the server's FIN: everything it said
            more = sock.recv(65536)
            if not more:
                break
            response += more
        sock.close()
        assert response.startswith(b"HTTP/1.1 413") and b"100 Continue" not in response, (path, response)
        reason = f"the body is over the {limit}-byte limit"
        expected = {"error": "too_large", "param": "", "reason": reason} if path.startswith("/api/") else {"error": reason}
        assert json.loads(response.split(b"\r\n\r\n", 1)[1]) == expected


@pytest.mark.timeout(180)
def test_connections_that_do_not_finish_their_request_head_in_time_are_closed_even_when_trickling(
    start_up: Callable[..., Up]
) -> None:
    import select

    up = start_up(CREWLET_HTTP_HEADER_TIMEOUT_S="1")
    partial = b"GET /healthz HTTP/1.1\r\nHost: %s:%d\r\nX-Slow: " % (up.host.encode(), up.port)
    silent = []
    for _ in range(5):
        sock = socket.create_connection((up.host, up.port), timeout=WAIT_S)
        sock.sendall(partial)
        silent.append(sock)
    trickler = socket.create_connection((up.host, up.port), timeout=WAIT_S)
    trickler.sendall(partial)

    def closed(sock: socket.socket) -> bool:
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True

    deadline = time.monotonic() + WAIT_S
    while True:  # a byte of the head at a time, each well inside the timeout: it never completes
        if select.select([trickler], [], [], 0.2)[0]:
            assert closed(trickler)
            break
        assert time.monotonic() < deadline, "the trickling connection was never closed"
        try:
            trickler.sendall(b"a")
        except (BrokenPipeError, ConnectionResetError):
            break
    for sock in silent:
        assert closed(sock)  # a blocking read: returns once the server closed it (socket timeout WAIT_S)
        sock.close()
    trickler.close()
    assert "event=web_header_timeout" in up.wait_for("event=web_header_timeout", timeout_s=WAIT_S)
    # A whole request on a kept-alive connection is answered, and the next one too.
    conn = http.client.HTTPConnection(up.host, up.port, timeout=WAIT_S)
    for _ in range(2):
        conn.request("GET", "/healthz")
        assert conn.getresponse().read()
    conn.close()


# -- sign-in throttle ----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_failed_sign_ins_lock_an_account_only_from_the_address_that_failed_and_an_address_past_a_looser_limit_with_429(
    start_up: Callable[..., Up]
) -> None:
    up = start_up(CREWLET_LOGIN_FAILURES="3", CREWLET_LOGIN_WINDOW_S="600")
    staff_user(up)

    guesser = Browser(up, source_ip="127.0.0.2")
    for _ in range(3):
        status, _, page = guesser.sign_in(STAFF_USER, "wrong-password")
        assert status == 200 and b"match, or the account is not staff" in page
    status, headers, page = guesser.sign_in(STAFF_USER, STAFF_PASSWORD)  # the right password no longer helps
    assert status == 429 and b"Too many failed sign-ins" in page
    assert 0 < int(headers["retry-after"]) <= 600
    status, headers, _ = guesser.call("POST", "/admin/login/", form={"username": STAFF_USER, "password": "x"})
    assert status == 429 and "retry-after" in headers  # the admin's form shares the count

    # A stranger's failures do not lock the owner out: from another address the right password signs in.
    assert Browser(up, source_ip="127.0.0.3").sign_in(STAFF_USER, STAFF_PASSWORD)[0] == 302
    # An address spraying usernames is locked at the looser per-address limit (4 x 3), whatever it tries next.
    sprayer = Browser(up, source_ip="127.0.0.4")
    for n in range(12):
        assert sprayer.sign_in(f"user{n}", "guess")[0] == 200
    assert sprayer.sign_in("dave", "guess")[0] == 429
    assert sprayer.sign_in(STAFF_USER, STAFF_PASSWORD)[0] == 429
    # An address and a username with no failures are not held back.
    assert Browser(up, source_ip="127.0.0.5").sign_in("erin", "guess")[0] == 200
    assert "event=sign_in_locked" in up.wait_for("event=sign_in_locked", timeout_s=WAIT_S)


# -- /healthz asks the broker ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_healthz_says_the_broker_is_unresponsive_while_it_is_frozen_and_connected_once_it_resumes(
    start_up: Callable[..., Up]
) -> None:
    up = start_up(CREWLET_HEALTH_BROKER_TIMEOUT_S="0.5")
    broker = [pid for pid, name in up.children.items() if name == "nats-server"]
    assert len(broker) == 1, up.children

    def health() -> tuple[int, dict[str, Any]]:
        status, _, body = up.request("GET", "/healthz")
        return status, json.loads(body)

    assert health() == (200, {"status": "ok", "broker": "connected", "loops": "running", "node": "hw1"})
    os.kill(broker[0], signal.SIGSTOP)
    try:
        frozen = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(health()), WAIT_S, "a 503 while frozen")
        assert frozen == (503, {"status": "down", "broker": "unresponsive", "loops": "running", "node": "hw1"})
    finally:
        os.kill(broker[0], signal.SIGCONT)
    wait_until(lambda: health()[0] == 200, WAIT_S, "/healthz back to 200 after SIGCONT")
    assert health()[1]["broker"] == "connected"


# -- production settings ---------------------------------------------------------------------------------

#: The environment docs/operating.md's "Production: behind TLS" section gives for a deployment behind TLS.
PRODUCTION_ENV = {
    "CREWLET_SECURE_COOKIES": "1",
    "CREWLET_HSTS_SECONDS": "31536000",
    "CREWLET_HSTS_INCLUDE_SUBDOMAINS": "1",
    "CREWLET_HSTS_PRELOAD": "1",
    "CREWLET_SSL_REDIRECT": "1",
    "CREWLET_BEHIND_TLS_PROXY": "1",
    "CREWLET_ALLOWED_HOSTS": "crewlet.example.com",
}


def _check_deploy(tmp_path: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}
    env.update(DJANGO_SETTINGS_MODULE="crewlet.settings", CREWLET_VAR_DIR=str(tmp_path / "var"), **extra)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


def test_check_deploy_reports_nothing_with_the_documented_production_environment(tmp_path: Path) -> None:
    laptop = _check_deploy(tmp_path, {})
    assert laptop.returncode != 0 and "security.W012" in laptop.stderr  # the laptop defaults are not production
    production = _check_deploy(tmp_path, PRODUCTION_ENV)
    assert production.returncode == 0, production.stderr
    assert "System check identified no issues" in production.stdout
    doc = (REPO_ROOT / "docs" / "operating.md").read_text()
    for name in PRODUCTION_ENV:
        assert f"`{name}=" in doc, f"{name} is not documented in docs/operating.md"


@pytest.mark.timeout(180)
def test_behind_a_tls_proxy_up_redirects_http_to_https_but_not_healthz_and_sets_secure_cookies(
    start_up: Callable[..., Up]
) -> None:
    up = start_up(**{**PRODUCTION_ENV, "CREWLET_ALLOWED_HOSTS": "127.0.0.1"})
    status, headers, _ = up.request("GET", "/login/")
    assert status == 301 and headers["Location"].startswith("https://")
    assert up.request("GET", "/healthz")[0] == 200
    status, headers, _ = up.request("GET", "/login/", headers={"X-Forwarded-Proto": "https"})
    assert status == 200
    assert "secure" in headers["Set-Cookie"].lower() and "max-age=31536000" in headers["Strict-Transport-Security"]


@pytest.mark.timeout(180)
def test_behind_a_proxy_sign_ins_are_throttled_per_forwarded_client_not_per_proxy(start_up: Callable[..., Up]) -> None:
    up = start_up(CREWLET_BEHIND_TLS_PROXY="1", CREWLET_LOGIN_FAILURES="2", CREWLET_LOGIN_WINDOW_S="600")
    proxied = {"X-Forwarded-Proto": "https"}
    first = Browser(up)
    for _ in range(2):
        status, _, page = first.call("GET", "/login/", headers={**proxied, "X-Forwarded-For": "203.0.113.7"})
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert status == 200 and token is not None
        form = {"csrfmiddlewaretoken": token.group(1).decode(), "username": "alice", "password": "guess", "next": ""}
        headers = {**proxied, "X-Forwarded-For": "203.0.113.7", "Referer": f"https://{up.host}:{up.port}/login/"}
        assert first.call("POST", "/login/", form=form, headers=headers)[0] == 200
    assert first.call("POST", "/login/", form=form, headers=headers)[0] == 429
    headers["X-Forwarded-For"] = "198.51.100.9"  # another client behind the same proxy
    assert first.call("POST", "/login/", form=form, headers=headers)[0] == 200
