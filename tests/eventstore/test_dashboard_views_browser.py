"""The dashboard's drawn views in a real browser, at a phone's 390 px and a laptop's 1280 px.

The company and the browser are the ones tests/eventstore/conftest.py starts
for this folder's browser modules. Each test loads its view once per width
and checks what it draws against the ``/api/`` answer it draws from, and that
nothing is wider than the window (``document.documentElement.scrollWidth``).
"""
from __future__ import annotations

import uuid
from typing import Any

import pytest

from crewlet.events import parse_timestamp
from tests.browser_support import WAIT_MS, Company, live, screenshot, sign_in, slack_message

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is in requirements-dev.txt; run bin/test")
from playwright.sync_api import Page, expect  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]

WIDTHS = (390, 1280)
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def turns(browser: Any, company: Company) -> list[str]:
    """Two Slack messages to ada, each a trace holding an ended turn (their trace ids).

    Each is posted once the one before it has its turn: the company's coalesce
    window (another module's test may have raised it) would otherwise merge
    them into one turn.
    """
    context = browser.new_context()
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    sign_in(tab, company)
    traces: list[str] = []
    for n in range(2):
        status, answer = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", f"draw me {n}"))
        assert status == 202, answer
        traces.append(answer["trace_id"])
        settled_turns(tab, traces)
    context.close()
    return traces


def api(page: Page, path: str) -> Any:
    """``path`` of /api/ read with the page's staff session."""
    origin = page.evaluate("location.origin")
    answer = page.request.get(origin + path)
    assert answer.ok, (path, answer.status, answer.text()[:500])
    return answer.json()


def settled_turns(page: Page, traces: list[str]) -> list[dict[str, Any]]:
    """Every turn of the company once the posted traces' turns have ended (the /api/turns answer's rows)."""
    done: list[dict[str, Any]] = []

    def ended() -> bool:
        rows = api(page, "/api/turns?limit=500")["turns"]
        done[:] = rows
        ours = [t for t in rows if t["trace_id"] in traces]
        return bool(ours) and {t["trace_id"] for t in ours} == set(traces) and all(t["outcome"] != "running" for t in rows)

    waited_ms = 0
    while not ended():
        assert waited_ms < WAIT_MS, f"the posted messages' turns did not end: {[t for t in done if t['outcome'] == 'running']}"
        page.wait_for_timeout(100)
        waited_ms += 100
    return done


def fits(page: Page, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth") <= width, f"wider than {width} px"
    header_right = page.evaluate("document.querySelector('header').getBoundingClientRect().right")
    assert header_right <= width


def test_the_event_logs_axis_draws_the_series_bars_narrows_the_rows_to_a_bar_and_follows_the_chips(
    page: Page, company: Company, turns: list[str]
) -> None:
    sign_in(page, company)
    settled_turns(page, turns)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(company.url + "/events/")
        expect(page.locator("#axis[data-loaded=true]")).to_have_count(1)
        live(page)
        drawn = page.locator("#axis g.bar").evaluate_all("gs => gs.map(g => [g.dataset.start, +g.dataset.total])")
        series = api(page, "/api/events/series?feed_only=true&window=1h&bucket=1m")["bars"]
        assert drawn == [[b["start"], b["total"]] for b in series]
        assert sum(total for _, total in drawn) > 0
        fits(page, width)
        screenshot(page, f"events-axis-{width}")

    # A bar narrows the rows to its own stretch of time, and only its rows.
    busiest = max(range(len(drawn)), key=lambda i: drawn[i][1])
    bar = page.locator("#axis g.bar").nth(busiest)
    start, end = bar.get_attribute("data-start"), bar.get_attribute("data-end")
    with page.expect_response(lambda r: "/api/events?" in r.url and "since=" in r.url):
        bar.click(position={"x": 1, "y": 1}, force=True)
    rows = page.locator("#log li.ev")
    expect(rows).to_have_count(min(drawn[busiest][1], 50))
    stamps = rows.evaluate_all("els => els.map(e => e.querySelector('time').title)")
    assert all(start <= s < end for s in stamps), (start, end, stamps[:3])

    # A chip filters the axis as it filters the rows.
    page.click("#chips a.chip[data-category=webhook]")
    expect(page.locator("#axis[data-loaded=true]")).to_have_count(1)
    drawn = page.locator("#axis g.bar").evaluate_all("gs => gs.map(g => [g.dataset.start, +g.dataset.total])")
    series = api(page, "/api/events/series?feed_only=true&category=webhook&window=1h&bucket=1m")["bars"]
    assert drawn == [[b["start"], b["total"]] for b in series]
    assert sum(t for _, t in drawn) >= len(turns)

    # Live: a new delivery counts on the axis without a reload.
    before = sum(t for _, t in drawn)
    status, _ = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "count me live"))
    assert status == 202
    page.wait_for_function(f"() => [...document.querySelectorAll('#axis g.bar')].reduce((n, g) => n + +g.dataset.total, 0) > {before}")


def _extent(span: dict[str, Any]) -> tuple[float, float]:
    moments = [parse_timestamp(e["timestamp"]).timestamp() for e in span["events"]]
    for child in span["children"]:
        moments.extend(_extent(child))
    return min(moments), max(moments)


def test_a_trace_is_a_timeline_whose_bars_are_ordered_and_sized_by_the_spans_durations(
    page: Page, company: Company, turns: list[str]
) -> None:
    sign_in(page, company)
    settled_turns(page, turns)
    trace_id = turns[0]
    answer = api(page, f"/api/traces/{trace_id}")
    expected: dict[str, float] = {}

    def walk(spans: list[dict[str, Any]]) -> None:
        for s in spans:
            a, b = _extent(s)
            expected[s["span_id"]] = round((b - a) * 1000, 3)
            walk(s["children"])

    walk(answer["spans"])
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{company.url}/traces/{trace_id}/")
        rows = page.locator("#tree details.span > summary.tl-row").evaluate_all(
            """els => els.map(s => {
                const track = s.querySelector('.tl-track').getBoundingClientRect();
                const bar = s.querySelector('.tl-bar').getBoundingClientRect();
                return {span: s.parentElement.dataset.span, ms: +s.dataset.durationMs, start: +s.dataset.startMs,
                        left: bar.left - track.left, width: bar.width, track: track.width, trackLeft: track.left};
            })"""
        )
        axis_ms = float(page.locator("#tree").get_attribute("data-axis-ms") or 0)
        assert {r["span"]: r["ms"] for r in rows} == pytest.approx(expected, abs=0.002)
        assert len({round(r["trackLeft"]) for r in rows}) == 1  # one axis: every track at the same place
        for r in rows:
            assert r["width"] == pytest.approx(max(r["ms"] / axis_ms, 0.004) * r["track"], abs=1.5)
            assert r["left"] == pytest.approx(r["start"] / axis_ms * r["track"], abs=1.5)
        starts = [r["start"] for r in rows]
        assert starts == sorted(starts)  # parents before children, siblings by start
        wait = page.locator("#tree .tl-row[data-kind=wait]")
        expect(wait).to_have_count(1)  # the wake's time in ada's inbox, between the routing and the turn
        assert float(wait.get_attribute("data-duration-ms") or 0) >= 0
        expect(page.locator("#tree .tl-row[data-kind=model]").first).to_be_visible()
        fits(page, width)
        screenshot(page, f"trace-timeline-{width}")
    nested = page.locator("#tree details.span details.span").first
    nested.locator(":scope > summary").click()
    assert nested.evaluate("d => d.open") is False


def test_a_turns_page_lists_the_rounds_its_phase_recorded_with_the_trigger(page: Page, company: Company, turns: list[str]) -> None:
    sign_in(page, company)
    rows = settled_turns(page, turns)
    turn = next(t for t in rows if t["trace_id"] == turns[1])
    detail = api(page, f"/api/turns/{turn['turn_id']}")["turn"]
    phases = [e for e in detail["events"] if e["type"] == "agent_phase_completed"]
    recorded = [r for p in phases for r in api(page, f"/api/events/{p['id']}")["event"]["wire"]["rounds"]]
    assert recorded
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{company.url}/turns/{turn['turn_id']}/")
        shown = page.locator("tr.round").evaluate_all(
            "els => els.map(e => [+e.dataset.round, e.dataset.model, e.dataset.provider, e.dataset.stop])"
        )
        assert shown == [[r["round"], r.get("model", ""), r["provider_key"], r.get("stop_reason", "")] for r in recorded]
        expect(page.locator("#turn-tokens")).to_have_text(str(turn["tokens"]["total"]))
        expect(page.locator("#trigger li.ev")).to_have_attribute("data-id", turn["trigger"]["event_id"])
        prompt = page.locator("details.prompts").nth(1)
        assert prompt.evaluate("d => d.open") is False  # the prompts are folded
        prompt.locator("summary").click()
        expect(prompt.locator("pre")).to_contain_text("draw me 1")
        fits(page, width)
        screenshot(page, f"turn-{width}")


def rounds_per_model(page: Page) -> dict[str, int]:
    """Every recorded round's tokens (input + output) by its model, from each phase's body through /api/."""
    per_model: dict[str, int] = {}
    phases = api(page, "/api/events?type=agent_phase_completed&limit=500")["events"]
    for phase in phases:
        for r in api(page, f"/api/events/{phase['id']}")["event"]["wire"]["rounds"]:
            tokens = int(r.get("input_tokens") or 0) + int(r.get("output_tokens") or 0)
            if tokens:
                per_model[r.get("model", "")] = per_model.get(r.get("model", ""), 0) + tokens
    return per_model


def test_the_spend_screen_totals_the_turns_tokens_per_seat_and_per_model_and_draws_each_budget(
    page: Page, company: Company, turns: list[str]
) -> None:
    sign_in(page, company)
    rows = settled_turns(page, turns)
    per_seat: dict[str, int] = {}
    for t in rows:
        per_seat[t["seat"]] = per_seat.get(t["seat"], 0) + t["tokens"]["total"]
    per_model = rounds_per_model(page)
    assert per_model and sum(per_model.values()) == sum(per_seat.values())
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(company.url + "/spend/")
        expect(page.locator("#spend-total")).to_have_text(str(sum(per_seat.values())))
        shown = page.locator("#spend tbody tr[data-seat]").evaluate_all("els => els.map(e => [e.dataset.seat, +e.dataset.total])")
        assert dict(shown) == {seat: n for seat, n in per_seat.items() if n}
        models = page.locator("#spend-models tbody tr[data-model]").evaluate_all("els => els.map(e => [e.dataset.model, +e.dataset.total])")
        assert dict(models) == per_model  # each model's total is the sum of its rounds' tokens
        expect(page.locator("#spend-models-total")).to_have_text(str(sum(per_model.values())))
        expect(page.locator("#models-partial")).to_have_count(0)  # every node answered
        # The company's budget (browser_support.BUDGETS): each capped window's spend against its ceiling.
        budgets = page.locator("#budget-windows tr[data-budget]").evaluate_all(
            "els => els.map(e => [e.dataset.budget, +e.dataset.spend, +e.dataset.ceiling, e.querySelector('.meter span').style.width])"
        )
        assert {b[0] for b in budgets} >= {"company::day", "seat:ada:day"}, budgets
        for _, spend, ceiling, drawn in budgets:
            assert 0 < spend < ceiling and drawn.endswith("%")
            assert float(drawn[:-1]) == pytest.approx(spend * 100 / ceiling, abs=0.01) and float(drawn[:-1]) > 0
        fits(page, width)
        screenshot(page, f"spend-{width}")


def test_the_overview_charts_each_seats_turns_and_the_live_strip_shows_a_running_turn(
    page: Page, company: Company, turns: list[str]
) -> None:
    sign_in(page, company)
    rows = settled_turns(page, turns)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(company.url + "/")
        live(page)
        ada = sum(1 for t in rows if t["seat"] == "ada")
        expect(page.locator("#charts figure[data-seat=ada]")).to_have_attribute("data-total", str(ada))
        drawn = page.locator("#charts figure[data-seat=ada] rect.total").evaluate_all("rs => rs.reduce((n, r) => n + +r.dataset.total, 0)")
        assert drawn == ada
        fits(page, width)
        expect(page.locator("#seats th").last).to_be_attached()
        screenshot(page, f"overview-charts-{width}")
    page.evaluate(
        """() => {
            window.__strip = [];
            const strip = document.getElementById('running');
            new MutationObserver((records) => records.forEach((r) => {
                const li = r.target.closest && r.target.closest('li[data-seat]');
                if (li) window.__strip.push([li.dataset.seat, li.dataset.turn, +(li.querySelector('.round') || {dataset: {}}).dataset.round || 0]);
            })).observe(strip, {subtree: true, attributes: true, attributeFilter: ['data-turn', 'data-round']});
        }"""
    )
    status, answer = company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "watch me run"))
    assert status == 202
    expect(page.locator(f"#feed li[data-type=agent_turn_completed] a.trace[href='/traces/{answer['trace_id']}/']")).to_have_count(1)
    seen = page.evaluate("() => window.__strip")
    assert any(seat == "ada" and turn for seat, turn, _ in seen), seen  # the turn was on the strip while it ran
    assert any(seat == "ada" and n >= 1 for seat, _, n in seen), seen  # with the round it was on (agent_turn_progress)
    expect(page.locator("#running li.empty")).to_have_count(1)  # and left it when it ended
    # The chart counted the turn that ended, without a reload.
    expect(page.locator("#charts figure[data-seat=ada]")).to_have_attribute("data-total", str(ada + 1))
    drawn = page.locator("#charts figure[data-seat=ada] rect.total").evaluate_all("rs => rs.reduce((n, r) => n + +r.dataset.total, 0)")
    assert drawn == ada + 1
