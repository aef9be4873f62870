"""What a signed-in browser and a dashboard socket meet at ``manage.py up``'s web server, each through a real ``up``.

``/ws/stream`` accepts a staff session's socket only from its own origin (scheme,
host and port) or a trusted one, and closes a socket with 4401 once its token is
revoked or its session signs out; ``up`` serves the admin's CSS and JS, and
signing in lands on the dashboard. ``up``, the browser and the socket are
tests/web_support.py's.

The module's tests share one ``up`` (with its staff user): each uses its own
operator token, session or socket, and the settings it needs (a trusted
origin, a short socket re-check) change nothing another test asserts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.up_support import serve
from web_support import STAFF_PASSWORD, STAFF_USER, WAIT_S, Browser, Socket, Up, bearer, staff_user

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """``up`` trusting ``https://dash.example.com``, re-checking a socket's credentials every 0.2 s, with a staff user."""
    tmp: Path = tmp_path_factory.mktemp("sessions")
    for process in serve(Up(tmp, CREWLET_TRUSTED_ORIGINS="https://dash.example.com", CREWLET_WS_RECHECK_S="0.2")):
        staff_user(process)
        yield process


# -- /ws/stream: the Origin is scheme, host and port; credentials are checked while it is open -------


@pytest.mark.timeout(180)
def test_a_staff_session_socket_is_refused_from_another_port_or_host_and_accepted_from_its_own_origin(
    up: Up
) -> None:
    browser = Browser(up)
    status, headers, _ = browser.sign_in(STAFF_USER, STAFF_PASSWORD)
    assert status == 302 and "sessionid" in browser.cookies, headers
    cookie = {"Cookie": f"sessionid={browser.cookies['sessionid']}"}
    own = f"http://{up.host}:{up.port}"

    for origin in (f"http://{up.host}:1", f"http://localhost:{up.port}", f"https://{up.host}:{up.port}", "http://evil.example"):
        refused = Socket(up, {**cookie, "Origin": origin})
        assert refused.status == 403, origin
        refused.close()
    accepted = Socket(up, {**cookie, "Origin": own})
    assert accepted.status == 101
    assert accepted.text()["kind"] == "snapshot"
    accepted.close()
    trusted = Socket(up, {**cookie, "Origin": "https://dash.example.com"})
    assert trusted.status == 101
    trusted.close()


@pytest.mark.timeout(180)
def test_a_socket_opened_with_an_operator_token_is_closed_4401_once_the_token_is_revoked(
    up: Up
) -> None:
    ws = Socket(up, bearer(up.operator_token("ws-tab")))
    assert ws.status == 101
    assert ws.text()["kind"] == "snapshot"
    up.manage("operator_token", "ws-tab", "--revoke")  # another process: the web process's cache never heard of it
    assert ws.close_code() == 4401
    ws.close()
    assert "event=ws_stream_revoked" in up.wait_for("event=ws_stream_revoked", timeout_s=WAIT_S)


@pytest.mark.timeout(180)
def test_a_staff_socket_is_closed_4401_when_its_session_signs_out(up: Up) -> None:
    browser = Browser(up)
    assert browser.sign_in(STAFF_USER, STAFF_PASSWORD)[0] == 302
    ws = Socket(up, {"Cookie": f"sessionid={browser.cookies['sessionid']}", "Origin": f"http://{up.host}:{up.port}"})
    assert ws.status == 101
    assert ws.text()["kind"] == "snapshot"
    assert browser.sign_out() == 302
    assert ws.close_code() == 4401
    ws.close()


# -- what an operator meets: the admin's look, where signing in lands ----------------------------------


@pytest.mark.timeout(180)
def test_up_serves_the_admins_css_and_js_and_signing_in_lands_on_the_dashboard(up: Up) -> None:
    status, headers, body = up.request("GET", "/static/admin/css/base.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css") and b"body" in body
    status, headers, body = up.request("GET", "/static/admin/js/core.js")
    assert status == 200 and b"function" in body
    assert up.request("GET", "/static/admin/css/no-such-file.css")[0] == 404
    status, _, page = up.request("GET", "/admin/login/")
    assert status == 200 and b"/static/admin/css/base.css" in page

    browser = Browser(up)
    status, headers, _ = browser.sign_in(STAFF_USER, STAFF_PASSWORD)
    assert status == 302 and headers["location"] == "/"
    status, _, page = browser.call("GET", headers["location"])
    assert status == 200 and b"Sign in" not in page
