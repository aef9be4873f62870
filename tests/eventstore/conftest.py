"""One company and one browser for every browser test of the dashboard (both of this folder's browser modules).

Starting `manage.py up` and Chromium costs seconds on a shared 2-core machine,
so the broker and the company are package-scoped: the modules that drive the
dashboard share them, each test in its own browser context. The browser is
per module: Playwright's sync API holds an event loop on the main thread while
it runs, which Django's async-safety check would see in every later test.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.browser_support import BROWSER_ZONE, CHROMIUM, CHROMIUM_ARGS, WAIT_MS, Company, LoopThread, budgeted_company


@pytest.fixture(scope="package")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="package")
def broker(loop: LoopThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from crewlet.queue.broker import EmbeddedBroker

    server = EmbeddedBroker(store_dir=tmp_path_factory.mktemp("jetstream"))
    loop.run(server.start())
    yield server
    loop.run(server.stop())


@pytest.fixture(scope="package")
def company(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Company]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: bin/test installs Debian's chromium (or set CREWLET_CHROMIUM)")
    running = Company(tmp_path_factory.mktemp("company"), broker.url, budgeted_company())
    try:
        running.start()
        yield running
    finally:
        output = running.stop()
        assert "clean=true" in output, output[-4000:]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is in requirements-dev.txt; run bin/test")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, company: Company) -> Iterator[Any]:
    """A signed-out tab of its own (a fresh browser context) at 1280 x 900, in a zone that is not UTC."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id=BROWSER_ZONE, locale="en-US")
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    yield tab
    context.close()
