"""The dashboard in a real browser: headless Chromium against `manage.py up`.

One company and one browser serve this folder's browser modules
(tests/eventstore/conftest.py: starting them takes seconds); each test signs
in with its own browser context. Every page a test visits is kept as a
screenshot under var/ci/screenshots/.
"""
from __future__ import annotations

import asyncio
import re
import time
import uuid
from datetime import datetime, timedelta
from typing import Any, Callable, Iterator

import pytest

from crewlet.events.registry import SYSTEM
from crewlet.queue import Outcome, Timings, topics
from crewlet.events.tracing import Trace
from tests.browser_support import (
    STAFF_USER,
    WAIT_MS,
    Company,
    LoopThread,
    live,
    screenshot,
    sign_in,
    slack_message,
)

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is in requirements-dev.txt; run bin/test")
from playwright.sync_api import Page, expect  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]

#: The test's own client dead-letters fast: the budget is the real 25 deliveries, the spacing shrunk.
FAST = Timings(backoff_base_s=0.001, backoff_cap_s=0.005)
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def queue(loop: LoopThread, broker: Any, company: Company) -> Iterator[Any]:
    """The test's own node on the company's broker (connected after `up` made the streams)."""
    from crewlet.queue.jetstream import JetStreamQueue

    client = loop.run(
        JetStreamQueue.connect(broker.url, node="tester", timings=FAST, memory_storage=broker.memory_storage)
    )
    yield client
    loop.run(client.close())


def shown_in_the_browsers_zone(time_element: Any) -> None:
    """A ``<time>`` reads in the browser's zone (UTC+05:30) with the zone's name, and keeps the UTC instant on hover."""
    stamp = time_element.get_attribute("datetime")
    local = datetime.fromisoformat(stamp.replace("Z", "+00:00")) + timedelta(hours=5, minutes=30)
    expect(time_element).to_have_text(f"{local:%H:%M:%S} GMT+5:30")
    assert time_element.get_attribute("title") == f"{stamp} UTC"


def until(condition: Callable[[], bool], what: str, *, page: Page, timeout_s: float = WAIT_MS / 1000, reload: bool = False) -> None:
    """Wait for ``condition`` (a server-side change a page only shows once reloaded, when ``reload``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not seen in {timeout_s:.0f} s: {what}"
        page.wait_for_timeout(100)
        if reload:
            page.reload()


def seat_state(page: Page, handle: str) -> Any:
    return page.locator(f"tr[data-seat={handle}] .state")


# -- tests ---------------------------------------------------------------------------------


def test_a_staff_user_signs_in_and_the_overview_shows_every_seat_live(page: Page, company: Company) -> None:
    sign_in(page, company)
    live(page)
    for handle in ("ada", "linus", "grace"):
        expect(page.locator(f"tr[data-seat={handle}]")).to_be_visible()
    expect(seat_state(page, "ada")).to_have_attribute("data-state", re.compile(r"^(idle|queued|running)$"))
    screenshot(page, "overview")


def test_a_wrong_password_is_refused_and_the_dashboard_stays_closed(page: Page, company: Company) -> None:
    page.goto(company.url + "/events/")
    page.fill("input[name=username]", STAFF_USER)
    page.fill("input[name=password]", "not-the-password")
    page.click("button[type=submit]")
    expect(page.locator(".notice")).to_contain_text("didn't match")
    page.goto(company.url + "/")
    expect(page).to_have_url(re.compile(r"/login/"))


def test_a_posted_webhook_changes_the_seat_and_the_feed_live_without_a_reload(page: Page, company: Company) -> None:
    sign_in(page, company)
    live(page)
    # Every state ada's row shows from now on, in order, and a marker a reload would wipe. Each change's old
    # value is kept as it was, so states the page set in one task (records delivered together) are all seen.
    page.evaluate(
        """() => {
            window.__notReloaded = true;
            window.__adaCell = document.querySelector('tr[data-seat=ada] .state');
            window.__adaStates = [];
            new MutationObserver((records) => records.forEach((r) => window.__adaStates.push(r.oldValue)))
                .observe(window.__adaCell, {attributeFilter: ['data-state'], attributeOldValue: true});
        }"""
    )
    status, answer = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "live please"))
    assert status == 202, answer
    trace_id = answer["trace_id"]

    feed_turn = page.locator(f"#feed li[data-type=agent_turn_completed] a.trace[href='/traces/{trace_id}/']")
    expect(feed_turn).to_have_count(1)
    turn_row = page.locator("#feed li[data-type=agent_turn_completed]", has=page.locator(f"a.trace[href='/traces/{trace_id}/']"))
    shown_in_the_browsers_zone(turn_row.locator("time"))  # a row the live socket added
    wake_row = page.locator("#feed li[data-type=external_notification]", has=page.locator(f"a.trace[href='/traces/{trace_id}/']"))
    expect(wake_row.locator("a.delivery[href^='/deliveries/event/']")).to_have_count(1)  # the live row links its delivery too
    expect(page.locator(f"tr[data-seat=ada] .last-turn a[href='/traces/{trace_id}/']")).to_be_visible()
    expect(seat_state(page, "ada")).to_have_attribute("data-state", "idle")
    states = page.evaluate("() => [...window.__adaStates, window.__adaCell.dataset.state]")
    assert "running" in states, states  # the turn was shown as it ran, then ended
    assert page.evaluate("() => window.__adaCell === document.querySelector('tr[data-seat=ada] .state')")  # never replaced
    assert page.evaluate("() => window.__notReloaded") is True
    screenshot(page, "overview-after-webhook")


def test_a_category_chip_filters_the_event_log(page: Page, company: Company) -> None:
    status, _ = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "for the log"))
    assert status == 202
    sign_in(page, company, "/events/")
    expect(page.locator("#log li.ev[data-category=webhook]").first).to_be_visible()
    shown_in_the_browsers_zone(page.locator("#log li.ev time").first)  # written by the server, shown by the page's script
    categories_shown = set(page.locator("#log li.ev").evaluate_all("els => els.map(e => e.dataset.category)"))
    assert len(categories_shown) > 1, categories_shown  # the unfiltered log mixes categories

    page.click("#chips a.chip[data-category=system]")
    expect(page).to_have_url(re.compile(r"/events/\?category=system$"))
    expect(page.locator("#chips a.chip.on")).to_have_text("system")
    rows = page.locator("#log li.ev")
    expect(rows.first).to_be_visible()
    assert set(rows.evaluate_all("els => els.map(e => e.dataset.category)")) == {SYSTEM}
    screenshot(page, "events-system")

    page.click("#chips a.chip[data-category=system]")  # a second click takes the chip off again
    expect(page).to_have_url(company.url + "/events/")


def test_older_events_page_on_through_the_api(page: Page, company: Company) -> None:
    for n in range(20):  # a delivery row and a notification row each, and the turns: past one page of 50
        status, _ = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", f"page {n}"))
        assert status == 202
    sign_in(page, company, "/events/")
    rows = page.locator("#log li.ev")
    until(lambda: rows.count() == 50, "a full first page", page=page, reload=True)
    older = page.locator("#older")
    expect(older).to_be_visible()
    with page.expect_response(re.compile(r"/api/events\?.*feed_only=true.*cursor=")) as answer:
        older.click()
    assert answer.value.status == 200
    expect(rows).not_to_have_count(50)
    ids = rows.evaluate_all("els => els.map(e => e.dataset.id)")
    assert len(ids) == len(set(ids)) > 50  # the next page, not the first again
    screenshot(page, "events-older")


def test_a_trace_opens_as_a_tree_whose_spans_fold(page: Page, company: Company) -> None:
    status, answer = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "trace me"))
    assert status == 202
    trace_id = answer["trace_id"]
    sign_in(page, company, "/events/")
    link = page.locator(f"#log li.ev[data-type=agent_turn_completed] a.trace[href='/traces/{trace_id}/']")
    until(lambda: link.count() > 0, "the turn's row in the log", page=page, reload=True)  # written just after the 202
    link.first.click()
    expect(page).to_have_url(f"{company.url}/traces/{trace_id}/")

    nested = page.locator("#tree details.span details.span").first
    expect(nested).to_be_visible()
    row = nested.locator(":scope > ol.events > li").first
    expect(row).to_be_visible()
    screenshot(page, "trace")
    nested.locator(":scope > summary").click()
    expect(row).to_be_hidden()
    assert nested.evaluate("d => d.open") is False
    screenshot(page, "trace-folded")


def test_a_seat_is_paused_and_resumed_from_its_page(page: Page, company: Company) -> None:
    sign_in(page, company, "/seats/linus/")
    live(page)
    expect(page.locator("#paused")).to_have_attribute("data-paused", "false")
    page.fill("#pause-reason", "browser test")
    page.click("#pause")
    expect(page.locator("#paused")).to_have_attribute("data-paused", "true")
    expect(page.locator("#pause-detail")).to_contain_text(f"Paused by {STAFF_USER}: browser test")
    expect(page.locator("#seat-state")).to_have_attribute("data-state", "paused")  # over the socket
    screenshot(page, "seat-paused")

    page.click("#resume")
    expect(page.locator("#paused")).to_have_attribute("data-paused", "false")
    expect(page.locator("#seat-state")).not_to_have_attribute("data-state", "paused")
    expect(page.locator("#depth")).to_have_text(re.compile(r"^\d+$"))
    screenshot(page, "seat")


def test_a_dead_letter_is_replayed_onto_its_topic_and_audited(
    page: Page, company: Company, queue: Any, loop: LoopThread
) -> None:
    from crewlet import events
    from crewlet.events.types import TaskAssigned

    topic, group = topics.agent_inbox("ghost"), topics.agent_inbox_group("ghost")
    sent = events.new(TaskAssigned(seat="ghost", title="a task nobody can do"), Trace.root())
    got: list[Any] = []

    async def fail(delivery: Any) -> Outcome:
        raise RuntimeError("this handler always fails")

    async def dead_letter() -> None:
        sub = await queue.subscribe(topic, group, fail)
        await queue.publish(topic, sent)
        while not any(d.event.id == sent.id for d in await queue.dead_letters()):
            await asyncio.sleep(0.01)  # 25 real deliveries, spaced by FAST's backoff
        await sub.detach()

    loop.run(dead_letter(), timeout_s=60)

    sign_in(page, company, "/dead-letters/")
    row = page.locator(f"#dead-letters tbody tr[data-event='{sent.id}']")
    expect(row).to_have_count(1)
    expect(row).to_contain_text(topic)
    expect(row).to_contain_text("task_assigned")
    expect(row.locator("td").nth(3)).to_have_text("max_deliveries")  # why it was buried
    expect(row.locator("td").nth(4)).to_have_text("25")  # after how many deliveries
    screenshot(page, "dead-letters")

    async def receive(delivery: Any) -> Outcome:
        got.append(delivery.event)
        return Outcome.ACK

    receiver = loop.run(queue.subscribe(topic, group, receive))
    try:
        row.locator("button.replay").click()
        expect(page.locator("#replay-result")).to_contain_text(f"Replayed onto {topic}")
        expect(row).to_have_count(0)
        until(lambda: bool(loop.call(lambda: list(got))), "the replayed event at a subscriber of its topic", page=page)
        assert [e.id for e in loop.call(lambda: list(got))] == [sent.id]
    finally:
        loop.run(receiver.detach())
    page.reload()
    expect(page.locator(f"#dead-letters tbody tr[data-event='{sent.id}']")).to_have_count(0)

    page.goto(company.url + "/events/?category=lifecycle")
    audit = page.locator("#log li.ev[data-type=operator_acted]").first
    expect(audit).to_contain_text(f"{STAFF_USER} called dead_letter_replay")


def test_a_revision_created_and_activated_in_the_admin_is_applied(page: Page, company: Company) -> None:
    sign_in(page, company, "/admin/crewlet/configrevision/add/")
    text = page.input_value("textarea[name=yaml_text]")
    assert "notification_coalesce_window_seconds: 0" in text  # prefilled with the active revision
    page.fill("textarea[name=yaml_text]", text.replace("notification_coalesce_window_seconds: 0", "notification_coalesce_window_seconds: 2"))
    page.click("input[name=_continue]")
    expect(page.locator("#activate-revision")).to_be_visible()
    expect(page.locator("body")).to_contain_text("notification_coalesce_window_seconds: 2")  # the diff
    screenshot(page, "admin-revision")
    page.click("#activate-revision")
    expect(page.locator(".messagelist")).to_contain_text("Revision 2 is now active")

    page.goto(company.url + "/")
    live(page)
    applied = page.locator("#feed li[data-type=config_revision_applied]", has_text="config revision 2")
    expect(applied.first).to_be_visible()  # live: the nudge, or the poller within its 10 s
    expect(applied.first).to_contain_text("web1")
    screenshot(page, "overview-revision-applied")
