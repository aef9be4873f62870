"""The dashboard's pages: server-rendered Django templates over the same reads as ``/api/``.

The dashboard belongs to the event store: it shows the store, its reads and
the live projection, and the seats' pause state beside them (which is why it
lives in the store's console room, :mod:`eventstore.console`, the one part of
the store that may import ``seats``). Each page asks the
function its ``/api/`` twin asks (``eventstore.api``, ``seats.api``, the queue), so a page and the API can never disagree about a
row; the small script in ``templates/dashboard/base.html`` then keeps the page
live over ``/ws/stream`` and pages on through ``/api/events``. Only active
staff may look — the same people a staff session lets through ``/api/``.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import user_passes_test
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse_lazy

from crewlet.engine import runtime
from crewlet.events import categories
from crewlet.events.types import DEAD_LETTER_REASONS
from crewlet.queue import topics
from eventstore import api as store_api
from eventstore import here, projection
from eventstore.console import reads
from eventstore.console import replay
from seats import actions, episodes
from seats.api import state
from seats.memory.api import read_rows
from seats.memory.rows import RowRefused, checked_table

log = logging.getLogger("crewlet.eventstore.dashboard")

#: Rows per page of the event log (the script asks /api/events for more of the same size).
EVENTS_PAGE_SIZE = 50
#: The windows the event log's axis offers (the first is drawn first), each with its bar length.
AXIS_WINDOWS: list[dict[str, str]] = [
    {"window": "1h", "bucket": "1m"},
    {"window": "6h", "bucket": "5m"},
    {"window": "24h", "bucket": "30m"},
    {"window": "7d", "bucket": "6h"},
]
#: Turns shown on a seat's page.
SEAT_TURNS = 20
#: Conversation episodes shown on a seat's page, newest first.
SEAT_EPISODES = 20
#: Dead letters listed at once.
DEAD_LETTERS_SHOWN = 200
#: How long a page waits for the engine's loop to answer a queue read.
QUEUE_READ_TIMEOUT_S = 3.0

LOGIN_URL = reverse_lazy("dash-login")


def _is_staff(user: Any) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def staff_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Anyone else is sent to sign in (and back here afterwards); a page that cannot ask the fleet says why, with 503.

    The pages' one place for the "no engine here" error (``EngineAway``) a
    read raised: the page is the error page, 503, its reason.
    """

    @functools.wraps(view)
    def asking_the_fleet(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except runtime.EngineAway as exc:
            return render(request, "dashboard/error.html", {"title": "History", "reason": exc.reason}, status=503)

    return user_passes_test(_is_staff, login_url=LOGIN_URL)(asking_the_fleet)


class LoginView(auth_views.LoginView):
    """Django's sign-in, refusing an account that is not active staff (the admin's form does that)."""

    template_name = "dashboard/login.html"
    authentication_form = AdminAuthenticationForm


class LogoutView(auth_views.LogoutView):
    next_page = LOGIN_URL


# -- reads shared by the pages -----------------------------------------------------------


def on_engine_loop(make: Callable[[Any], Any]) -> tuple[Optional[Any], str]:
    """Ask the engine's queue for a page: (answer, "") or (None, why it could not be read)."""
    try:
        return runtime.on_engine(make, QUEUE_READ_TIMEOUT_S), ""
    except runtime.EngineAway as exc:
        return None, str(exc)
    except Exception as exc:  # the broker is away, or slow: the page says so rather than failing
        log.warning("dashboard_queue_read_failed", extra={"error": repr(exc)})
        return None, f"the queue did not answer ({type(exc).__name__})"


def _query(**params: Any) -> QueryDict:
    query = QueryDict(mutable=True)
    for name, value in params.items():
        if isinstance(value, (list, tuple)):
            query.setlist(name, [str(v) for v in value])
        elif value not in (None, ""):
            query[name] = str(value)
    return query


# -- pages ---------------------------------------------------------------------------------


@staff_only
def overview(request: HttpRequest) -> HttpResponse:
    """The engine's company live; in a process with no engine, the stored feed and why there are no seats."""
    try:
        live = projection.running()
    except runtime.EngineAway as exc:
        rows = store_api.events_page(_query(feed_only="true", limit=EVENTS_PAGE_SIZE))["events"]
        context: dict[str, Any] = {"org": None, "live": {"seats": [], "feed": rows}, "counters": [], "no_engine": str(exc)}
        return render(request, "dashboard/overview.html", {**context, "page": "overview"})
    org = live.company()
    snapshot = live.snapshot()
    counters = [
        {"name": name, "label": name.replace("_", " ").capitalize(), "value": value}
        for name, value in (snapshot.get("counters") or {}).items()
    ]
    context = {
        "org": org, "live": snapshot, "counters": counters, "connections": connections(), "page": "overview",
        "running": reads.running_now(snapshot.get("seats") or []),
        "charts": reads.seat_charts([seat.handle for seat in org.agent_seats()]),
        "turns_type": reads.TURNS_TYPE,
    }
    return render(request, "dashboard/overview.html", context)


def connections() -> list[dict[str, Any]]:
    """What the engine's self-reporting services say (a surface's socket: connected, last frame, last error), one row each."""
    running = runtime.current_engine()
    reports = running.status_reports() if running is not None else {}
    return [{"name": name, **report} for name, report in sorted(reports.items())]


@staff_only
def events(request: HttpRequest) -> HttpResponse:
    chosen = [c for c in request.GET.getlist("category") if c]
    unknown = [c for c in chosen if c not in categories.CATEGORIES]
    if unknown:
        return render(
            request,
            "dashboard/error.html",
            {"title": "Events", "reason": f"unknown category {unknown[0]!r}; one of {', '.join(categories.CATEGORIES)}"},
            status=400,
        )
    query = _query(category=chosen, feed_only="true", limit=EVENTS_PAGE_SIZE, seat=request.GET.get("seat", ""))
    try:
        answer = store_api.events_page(query)
    except store_api.BadParameter as exc:
        return render(request, "dashboard/error.html", {"title": "Events", "reason": f"{exc.param}: {exc.reason}"}, status=400)
    chips = []
    for name in categories.CATEGORIES:
        toggled = [c for c in chosen if c != name] if name in chosen else [*chosen, name]
        chips.append({"name": name, "on": name in chosen, "query": _query(category=toggled).urlencode()})
    return render(
        request,
        "dashboard/events.html",
        {
            "page": "events",
            "rows": answer["events"],
            "next_cursor": answer.get("next_cursor"),
            "chips": chips,
            "api_query": query.urlencode(),
            "series_query": _query(category=chosen, feed_only="true", seat=request.GET.get("seat", "")).urlencode(),
            "windows": AXIS_WINDOWS,
            "window": AXIS_WINDOWS[0]["window"],
            "chosen": chosen,
        },
    )


@staff_only
def seat(request: HttpRequest, handle: str) -> HttpResponse:
    projected = projection.current()
    target = projected.company().seat_by_handle(handle) if projected is not None else None
    if projected is not None and target is None:
        raise Http404(f"no seat {handle!r} in the company")
    turns = store_api.turns_page(_query(seat=handle, limit=SEAT_TURNS))["turns"]
    recent = store_api.events_page(_query(seat=handle, feed_only="true", limit=EVENTS_PAGE_SIZE))["events"]
    depth: Optional[int] = None
    depth_error = ""
    if target is None:  # no engine here: which seat this is, and its inbox, are not known
        depth_error = runtime.NO_ENGINE
    elif target.is_agent:
        depth, depth_error = on_engine_loop(
            lambda queue: queue.backlog(topics.agent_inbox(handle), topics.agent_inbox_group(handle))
        )
    live = projected.seat(handle) if projected is not None else None
    chain = projected.company().providers_of(target) if projected is not None and target is not None else ()
    return render(
        request,
        "dashboard/seat.html",
        {
            "page": "seat",
            "handle": handle,
            "seat": target,
            "no_engine": runtime.NO_ENGINE if projected is None else "",
            "live": live,
            "pause": state(actions.pause_states([handle]).get(handle)),
            "turns": turns,
            "episodes": episodes.of_seat(handle, SEAT_EPISODES),
            "recent": recent,
            "depth": depth,
            "depth_error": depth_error,
            "chain": [provider.key for provider in chain],
        },
    )


@staff_only
def seat_memory(request: HttpRequest, handle: str) -> HttpResponse:
    """A seat's memory as CREWLET_MEMORY holds it (one table, or all), each row with a button to forget it."""
    projected = projection.current()
    if projected is not None and projected.company().seat_by_handle(handle) is None:
        raise Http404(f"no seat {handle!r} in the company")
    table, error = request.GET.get("table", ""), ""
    try:
        if table:
            checked_table(table)
    except RowRefused as exc:
        table, error = "", str(exc)
    rows, read_error = on_engine_loop(lambda queue: read_rows(queue, handle))
    every = rows or []
    shown = [row for row in every if not table or row["table"] == table]
    tables = sorted({row["table"] for row in every})
    return render(
        request,
        "dashboard/seat_memory.html",
        {"page": "seat", "handle": handle, "rows": shown, "tables": tables, "table": table, "error": error or read_error},
    )


@staff_only
def dead_letters(request: HttpRequest) -> HttpResponse:
    """The dead letters a filter matches, each with its preview: what a replay of it would do."""
    given = {key: value for key, value in request.GET.items() if key in replay.FILTER_KEYS and value}
    context: dict[str, Any] = {"page": "dead-letters", "rows": [], "filter": given, "reasons": DEAD_LETTER_REASONS}
    try:
        wanted = replay.parse_filter(given)
    except replay.BadFilter as exc:
        return render(request, "dashboard/dead_letters.html", {**context, "bad_filter": f"{exc.param}: {exc.reason}"}, status=400)
    letters, error = on_engine_loop(replay.scan)
    found, matched = replay.matching(letters or [], wanted, here.clock(), DEAD_LETTERS_SHOWN)
    replay.preview(found)
    rows = [facts.answer(preview=True) for facts in found]
    return render(request, "dashboard/dead_letters.html", {**context, "rows": rows, "matched": matched, "error": error})
