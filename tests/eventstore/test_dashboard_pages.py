"""The dashboard's server-rendered pages, through Django's test client on the test store.

The live parts (the socket, a seat changing as a webhook lands, replaying a
dead letter) are driven in a real browser by tests/eventstore/test_dashboard_browser.py;
here: who may look, and what each page renders from the store.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterator

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from crewlet.events.types import SYSTEM_CLOSED_A2A
from crewlet.engine.interfaces import LIVE_PROJECTION
from crewlet.company.org import Organization
from crewlet.events.tracing import Trace
from eventstore.api import MAX_VALUE_LENGTH
from eventstore.questions import NodeScope
from eventstore_support import AT, make_event, store
from crewlet.engine.runtime import NO_ENGINE
from engine_support import engine_here
from seats_support import company

pytestmark = [pytest.mark.django_db(databases=["default", "events"])]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
T0 = AT - timedelta(hours=1)
S = timedelta(seconds=1)


def span(n: int, parent: int = 0) -> Trace:
    return Trace(TRACE, f"{n:016x}", f"{parent:016x}" if parent else "")


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_user("grace-admin", password="pw", is_staff=True))
    return client


@pytest.fixture
def no_live() -> None:
    """A web-only process, as this test process is: no engine, so no projection, no seat runtime, no queue."""
    from crewlet.engine import runtime
    from eventstore import projection

    assert (projection.current(), runtime.current_engine(), runtime.current_queue()) == (None, None, None)


@pytest.fixture
def engine_company() -> Iterator[Organization]:
    """The projection an engine runs, of its company (one that is not the example company)."""
    from eventstore import projection

    org = company(
        seats=[
            {"handle": "zed", "kind": "agent", "role": "engineer"},
            {"handle": "yve", "kind": "human", "role": "lead"},
        ]
    )
    with engine_here(company=org) as engine:
        engine.provide(LIVE_PROJECTION, projection.ProjectionService(engine, projection.LiveProjection(company=lambda: org)))
        yield org


def a_turn() -> list[Any]:
    return store(
        make_event("inbound_delivery", T0, event_id="delivery", span=span(1), surface="webhook", event_name="message"),
        make_event("agent_turn_started", T0 + S, event_id="start", span=span(2, 1), seat="ada", turn_id="t1"),
        make_event("auxiliary_spend", T0 + 2 * S, event_id="spend", span=span(2, 1), seat="ada", turn_id="t1"),
        make_event("agent_turn_completed", T0 + 3 * S, event_id="end", span=span(2, 1), seat="ada", turn_id="t1"),
    )


# -- who may look ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/events/", "/traces/abc/", "/seats/ada/", "/dead-letters/"])
def test_every_page_sends_a_visitor_who_is_not_signed_in_to_sign_in_first(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


def test_signing_in_takes_a_staff_user_where_they_were_going_and_refuses_everyone_else() -> None:
    users = get_user_model().objects
    users.create_user("grace-admin", password="pw", is_staff=True)
    users.create_user("guest", password="pw", is_staff=False)
    client = Client()
    assert client.post("/login/?next=/events/", {"username": "guest", "password": "pw", "next": "/events/"}).status_code == 200
    assert client.get("/events/").status_code == 302  # a valid password of an account that is not staff opens nothing
    response = client.post("/login/", {"username": "grace-admin", "password": "pw", "next": "/events/"})
    assert (response.status_code, response["Location"]) == (302, "/events/")


# -- pages ----------------------------------------------------------------------------------


def test_the_event_log_lists_what_the_feed_holds_with_a_chip_per_category(staff: Client, scope: NodeScope) -> None:
    a_turn()
    page = staff.get("/events/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-id="end"' in html and 'data-id="delivery"' in html
    assert 'data-id="spend"' not in html  # stored, not fed
    for category in ("lifecycle", "task", "a2a", "decision", "notification", "learning", "system", "webhook"):
        assert f'data-category="{category}" href="/events/?category={category}"' in html
    assert f'href="/traces/{TRACE}/"' in html

    chosen = staff.get("/events/?category=webhook").content.decode()
    assert 'data-id="delivery"' in chosen and 'data-id="end"' not in chosen
    assert 'class="chip on" data-category="webhook" href="/events/"' in chosen  # clicking it again takes it off


def test_a_pages_times_say_their_zone_and_keep_the_utc_instant_for_the_browser_to_show_in_its_own(
    staff: Client, scope: NodeScope
) -> None:
    """UTC with its name until the page's script rewrites it in the browser's zone (test_dashboard_browser.py)."""
    a_turn()
    html = staff.get("/events/").content.decode()
    stamp = "2025-03-10T11:30:03.000500Z"  # the turn's end, T0 + 3 s
    assert f'<time datetime="{stamp}" title="{stamp} UTC" data-clock="time">{stamp[11:19]} UTC</time>' in html


def test_an_unknown_category_is_refused_with_the_closed_set(staff: Client, scope: NodeScope) -> None:
    page = staff.get("/events/?category=gossip")
    assert page.status_code == 400
    assert "unknown category &#x27;gossip&#x27;; one of lifecycle, task" in page.content.decode()
    too_long = staff.get("/events/?seat=" + "x" * 2000)
    assert too_long.status_code == 400 and "seat: " in too_long.content.decode()


def test_a_trace_is_a_tree_of_folding_spans_and_a_swept_a2a_close_says_the_system_closed_it(
    staff: Client, scope: NodeScope
) -> None:
    a_turn()
    store(
        make_event("a2a_channel_closed", T0 + 4 * S, event_id="swept", span=span(3, 2),
                   channel_id="ch-1", participants=["ada", "linus"], message_count=1),
    )
    page = staff.get(f"/traces/{TRACE}/")
    assert page.status_code == 200
    html = page.content.decode()
    root, child, grandchild = (html.index(f'data-span="{n:016x}"') for n in (1, 2, 3))
    assert root < child < grandchild and html.count("<details") == 3
    assert f"{SYSTEM_CLOSED_A2A} ch-1 between ada and linus" in html
    assert 'data-id="spend"' in html  # a turn's trace holds its accounting rows

    assert staff.get("/traces/" + "0" * 32 + "/").status_code == 404


#: Each drawn screen keyed by its path: its path, the error page's title, the key the store names when it refuses one.
SCREENS = (
    ("/traces/{}/", "Trace", "trace_id"),
    ("/turns/{}/", "Turn", "turn_id"),
    ("/deliveries/{}/", "Delivery", "delivery_id"),
    ("/deliveries/event/{}/", "Delivery", "event_id"),
)


def test_a_screen_whose_path_key_the_store_refuses_is_the_error_page_with_400_naming_the_key(
    staff: Client, scope: NodeScope
) -> None:
    too_long = "x" * (MAX_VALUE_LENGTH + 1)
    for path, title, param in SCREENS:
        page = staff.get(path.format(too_long))
        html = page.content.decode()
        assert page.status_code == 400, path
        assert title in html and f"{param}: longer than {MAX_VALUE_LENGTH} characters" in html, path


def test_a_seat_page_shows_its_turns_and_the_pause_controls_only_for_an_agent_of_the_engines_company(
    staff: Client, scope: NodeScope, engine_company: Organization
) -> None:
    store(make_event("agent_turn_started", T0, event_id="start", span=span(1), seat="zed", turn_id="t1"))
    page = staff.get("/seats/zed/").content.decode()
    assert 'data-turn="t1"' in page and 'id="pause"' in page and 'id="no-engine"' not in page
    assert 'id="depth"' in page and f'title="{NO_ENGINE}"' in page  # no queue here: unknown, and says why
    assert 'id="pause"' not in staff.get("/seats/yve/").content.decode()  # a person has no inbox to pause
    assert staff.get("/seats/ada/").status_code == 404  # the example company's seat is not this company's


def test_without_an_engine_a_seat_page_shows_the_stored_turns_and_says_no_engine_runs_here(
    staff: Client, scope: NodeScope, no_live: None
) -> None:
    a_turn()
    page = staff.get("/seats/ada/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-turn="t1"' in html and 'data-id="end"' in html  # the store's rows of that handle
    assert f'<p class="notice" id="no-engine">Which seat this is and its live state are known where an engine runs: {NO_ENGINE}</p>' in html
    assert 'id="pause"' not in html and "engineer" not in html  # nothing taken from the example company
    assert 'data-state="unknown"' in html and f'title="{NO_ENGINE}"' in html


def test_without_an_engine_the_overview_shows_the_stored_feed_and_says_no_engine_runs_here_instead_of_any_seats(
    staff: Client, scope: NodeScope, no_live: None
) -> None:
    a_turn()
    html = staff.get("/").content.decode()
    assert "<tr data-seat=" not in html and "<h1>acme</h1>" not in html  # not the example company's seats
    assert f'<p class="notice" id="no-engine">The seats and their live state are shown where an engine runs: {NO_ENGINE}</p>' in html
    assert 'data-id="end"' in html and 'data-id="spend"' not in html


def test_with_an_engine_the_overview_lists_the_engines_company_live(
    staff: Client, scope: NodeScope, engine_company: Organization
) -> None:
    html = staff.get("/").content.decode()
    assert '<tr data-seat="zed">' in html and '<tr data-seat="yve">' in html
    assert '<tr data-seat="ada">' not in html and 'id="no-engine"' not in html
    assert 'data-state="idle"' in html


def test_the_dead_letter_page_says_why_it_cannot_read_the_stream_without_an_engine(staff: Client, no_live: None) -> None:
    html = staff.get("/dead-letters/").content.decode()
    assert f"Could not read the dead-letter stream: {NO_ENGINE}" in html


@pytest.mark.parametrize("path", ["/", "/events/", "/traces/t-1/", "/seats/ada/"])
def test_without_an_engine_a_page_that_reads_history_says_with_503_that_it_cannot_ask_the_fleet(
    staff: Client, no_live: None, path: str
) -> None:
    response = staff.get(path)
    assert response.status_code == 503 and "so it cannot ask the fleet" in response.content.decode()


def test_without_an_engine_the_spend_screen_shows_the_seats_counts_and_says_why_there_are_no_models(
    staff: Client, no_live: None
) -> None:
    response = staff.get("/spend/")
    html = response.content.decode()
    assert response.status_code == 200 and 'id="spend"' in html  # the usage counts are the coordination store's
    assert 'id="spend-models"' not in html  # the models are read from the fleet's history, through an engine
    assert f"The budgets' windows and the tokens per model are shown where an engine runs: {NO_ENGINE}" in html
