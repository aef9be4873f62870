"""Screenshots of every dashboard view at a phone's 390 px and a laptop's 1280 px, into docs/.

Run as ``bin/dashboard-screenshots`` (docs/dashboard.md). It starts its own
``manage.py up`` on a fresh data directory (the example company, SQLite, the
embedded broker), makes a staff user, posts a few Slack messages so there are
turns to draw, then drives Debian's chromium (``CREWLET_CHROMIUM``) with
Playwright (requirements-dev.txt) over each view at both widths, and stops
``up``. ``--url`` (with ``--user``/``--password``) pictures a running node instead.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CREWLET_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTHS = (390, 1280)
READY_LINE = "Crewlet is up: "
USER, PASSWORD = "screenshots", "screenshots-password-4711"


def _post(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        loaded: dict[str, Any] = json.loads(answer.read())
        return loaded


def _message(n: int) -> dict[str, Any]:
    return {
        "type": "event_callback", "event_id": f"EvShot{n}-{time.time_ns()}",
        "event": {"type": "message", "channel": "D0ADA", "channel_type": "im", "user": "U0GRACE",
                  "text": f"<@U0ADA> screenshot message {n}", "ts": f"1718000000.{n:06d}"},
        "authorizations": [{"user_id": "U0ADA", "is_bot": True}],
    }


def start_up(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}
    env.update(PYTHONUNBUFFERED="1", CREWLET_VAR_DIR=str(data_dir))
    process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--addr", "127.0.0.1:0", "--data-dir", str(data_dir)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if READY_LINE in line:
            url = line.split(READY_LINE, 1)[1].split()[0].rstrip("/")
            break
    else:
        raise SystemExit(f"manage.py up exited ({process.wait()}) before it was ready")
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", USER, "--email", "shots@example.com"],
        cwd=ROOT, env={**env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD}, check=True, capture_output=True,
    )
    return process, url


def shoot(url: str, user: str, password: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    traces = [_post(url + "/webhooks/slack", _message(n))["trace_id"] for n in range(3)] if user == USER else []
    saved: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for width in WIDTHS:
            context = browser.new_context(viewport={"width": width, "height": 900})
            page = context.new_page()
            page.goto(url + "/login/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", password)
            page.click("main form [type=submit]")
            page.wait_for_url(url + "/")
            turn_link = _first_turn(page, url, traces)
            views = {"overview": "/", "events": "/events/", "spend": "/spend/", "seat": "/seats/ada/"}
            if turn_link:
                views["turn"] = turn_link
            if traces:
                views["trace"] = f"/traces/{traces[-1]}/"
            for name, path in views.items():
                page.goto(url + path)
                if name == "events":
                    page.wait_for_selector("#axis[data-loaded=true]")
                page.wait_for_timeout(300)
                target = out / f"dashboard-{name}-{width}.png"
                page.screenshot(path=str(target), full_page=True)
                saved.append(target)
            context.close()
        browser.close()
    return saved


def _first_turn(page: Any, url: str, traces: list[str]) -> Optional[str]:
    """The page of the posted messages' largest turn (a burst may be coalesced into one), once none still runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = page.request.get(url + "/api/turns?seat=ada&limit=20").json().get("turns", [])
        ours = [t for t in rows if not traces or t["trace_id"] in traces]
        if ours and all(t["outcome"] != "running" for t in rows):
            biggest = max(ours, key=lambda t: t["tokens"]["total"])
            return f"/turns/{biggest['turn_id']}/"
        time.sleep(0.2)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="picture a running node instead of starting one")
    parser.add_argument("--user", default=USER)
    parser.add_argument("--password", default=PASSWORD)
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.url:
        saved = shoot(args.url.rstrip("/"), args.user, args.password, out)
    else:
        with tempfile.TemporaryDirectory(prefix="crewlet-shots-") as tmp:
            process, url = start_up(Path(tmp))
            try:
                saved = shoot(url, USER, PASSWORD, out)
            finally:
                process.terminate()
                process.wait(timeout=60)
    for path in saved:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
