"""GET /api/events/series: bars on an epoch-aligned grid, cut at the asker's instant, floored at the history."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

import pytest

from eventstore import here
from eventstore import questions as qs
from eventstore.questions import NodeScope, Question
from eventstore_support import AT, NODE, US, make_event, store

pytestmark = [pytest.mark.django_db(databases=["default", "events"])]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def series(api_client: Any, **params: Any) -> dict[str, Any]:
    response = api_client.get(f"/api/events/series?{urlencode(params, doseq=True)}")
    assert response.status_code == 200, response.content
    return response.json()


def _rows_around_three_hours() -> None:
    """At chosen instants around AT (12:30:00.000500) for a 3h window of 1h bars."""
    store(
        make_event("org_started", utc(2025, 3, 10, 9, 30, 0, 499), event_id="below-window"),
        make_event("org_started", utc(2025, 3, 10, 9, 45), event_id="in-partial-bar"),
        make_event("org_started", utc(2025, 3, 10, 10, 0), event_id="on-10"),
        make_event("sandbox_run_failed", utc(2025, 3, 10, 10, 59, 59, 999999), event_id="end-of-10", error="lost"),
        make_event("agent_turn_completed", utc(2025, 3, 10, 11, 0), event_id="on-11", failed=True),
        make_event("auxiliary_spend", utc(2025, 3, 10, 12, 10), event_id="spend"),
        make_event("org_stopped", AT, event_id="at-the-instant"),
        make_event("org_stopped", AT + US, event_id="after-the-instant"),
    )


def test_bars_sit_on_the_grid_the_last_is_cut_at_the_instant_and_the_partial_first_is_dropped(api_client: Any, scope: NodeScope) -> None:
    _rows_around_three_hours()
    body = series(api_client, window="3h", bucket="1h")
    assert body["bars"] == [
        {
            "start": "2025-03-10T10:00:00.000000Z",
            "end": "2025-03-10T11:00:00.000000Z",
            "total": 2,
            "failed": 1,
            "by_category": {"lifecycle": 1, "task": 1},
        },
        {
            "start": "2025-03-10T11:00:00.000000Z",
            "end": "2025-03-10T12:00:00.000000Z",
            "total": 1,
            "failed": 1,
            "by_category": {"system": 1},
        },
        {
            "start": "2025-03-10T12:00:00.000000Z",
            "end": "2025-03-10T12:30:00.000500Z",
            "total": 2,
            "failed": 0,
            "by_category": {"lifecycle": 1, "system": 1},
        },
    ]
    assert (body["window"], body["bucket"], body["at"]) == ("3h", "1h", "2025-03-10T12:30:00.000500Z")
    assert body["coverage"] == {"nodes": [{"id": NODE, "answered": True, "error": ""}], "complete": True}


def test_the_node_counts_the_partial_first_bar_above_its_edge_and_the_asker_drops_it(scope: NodeScope) -> None:
    _rows_around_three_hours()
    question = Question(kind=qs.EVENT_SERIES, at=AT, window_us=qs.parse_duration("3h"), bucket_us=qs.parse_duration("1h"))
    answer = qs.answer(question, scope)
    first = answer["bars"][0]
    assert (first["start"], first["partial"], first["total"]) == ("2025-03-10T09:00:00.000000Z", True, 1)
    assert [bar["partial"] for bar in answer["bars"]] == [True, False, False, False]
    finished = qs.finish_series(answer)
    assert [bar["start"][11:16] for bar in finished["bars"]] == ["10:00", "11:00", "12:00"]
    assert all("partial" not in bar for bar in finished["bars"])


def test_a_window_whose_edge_is_on_the_grid_keeps_its_first_bar(api_client: Any, scope: NodeScope, monkeypatch: pytest.MonkeyPatch) -> None:
    noon = utc(2025, 3, 10, 12, 0)
    monkeypatch.setattr(here, "clock", lambda: noon)
    store(
        make_event("org_started", utc(2025, 3, 10, 10, 0), event_id="at-the-edge"),
        make_event("org_started", utc(2025, 3, 10, 9, 59, 59, 999999), event_id="before-the-edge"),
        make_event("org_started", noon, event_id="at-noon"),
    )
    bars = series(api_client, window="2h", bucket="1h")["bars"]
    assert [(b["start"][11:19], b["end"][11:19], b["total"]) for b in bars] == [
        ("10:00:00", "11:00:00", 1),
        ("11:00:00", "12:00:00", 0),
        ("12:00:00", "12:00:00", 1),  # the bucket holding the instant, cut there: just that microsecond
    ]


def test_a_window_longer_than_the_history_is_floored_at_it_and_begins_at_the_first_whole_bucket(api_client: Any, scope: NodeScope) -> None:
    horizon = AT - timedelta(hours=720)  # 2025-02-08T12:30:00.000500Z
    store(
        make_event("org_started", horizon - US, event_id="past-the-history"),
        make_event("org_started", horizon, event_id="at-the-horizon"),
        make_event("org_started", utc(2025, 2, 8, 23, 0), event_id="in-the-partial-day"),
        make_event("org_started", utc(2025, 2, 9), event_id="first-whole-day"),
        make_event("org_started", utc(2025, 3, 10, 1), event_id="today"),
    )
    bars = series(api_client, window="40d", bucket="1d")["bars"]
    assert len(bars) == 30
    assert bars[0]["start"] == "2025-02-09T00:00:00.000000Z" and bars[0]["total"] == 1
    assert bars[-1]["start"] == "2025-03-10T00:00:00.000000Z" and bars[-1]["end"] == "2025-03-10T12:30:00.000500Z"
    assert bars[-1]["total"] == 1
    assert sum(bar["total"] for bar in bars) == 2


def test_a_shorter_retention_floors_the_window_too(api_client: Any, scope: NodeScope, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(here, "node_scope", lambda: NodeScope(NODE, retention_hours=5))
    store(make_event("org_started", utc(2025, 3, 10, 7, 45), event_id="above-horizon-in-partial-bar"))
    store(make_event("org_started", utc(2025, 3, 10, 8, 15), event_id="first-whole-bar"))
    bars = series(api_client, window="24h", bucket="1h")["bars"]
    assert [b["start"][11:16] for b in bars] == ["08:00", "09:00", "10:00", "11:00", "12:00"]
    assert [b["total"] for b in bars] == [1, 0, 0, 0, 0]


def test_the_default_is_24_hourly_bars(api_client: Any, scope: NodeScope) -> None:
    bars = series(api_client)["bars"]
    assert len(bars) == 24
    assert bars[0]["start"] == "2025-03-09T13:00:00.000000Z" and bars[-1]["start"] == "2025-03-10T12:00:00.000000Z"
    assert all(set(b) == {"start", "end", "total", "failed", "by_category"} for b in bars)


def test_the_event_filters_apply_to_the_bars(api_client: Any, scope: NodeScope) -> None:
    _rows_around_three_hours()
    assert [b["total"] for b in series(api_client, window="3h", bucket="1h", category="task")["bars"]] == [1, 0, 0]
    fed = series(api_client, window="3h", bucket="1h", feed_only="true")["bars"]
    assert [b["total"] for b in fed] == [2, 1, 1]  # auxiliary_spend is stored, not fed
    assert [b["total"] for b in series(api_client, window="3h", bucket="15m", category="system")["bars"]] == [0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]


@pytest.mark.parametrize("text, us", [("15m", 900_000_000), ("1h", 3_600_000_000), ("24h", 86_400_000_000), ("7d", 604_800_000_000), ("30s", 30_000_000)])
def test_durations_parse_strictly(text: str, us: int) -> None:
    assert qs.parse_duration(text) == us


def test_the_grid_arithmetic_is_exact_integers() -> None:
    lower, origin, bars = qs.series_grid(AT, qs.parse_duration("3h"), qs.parse_duration("1h"), 720)
    assert qs.from_us(lower) == utc(2025, 3, 10, 9, 30, 0, 500)
    assert qs.from_us(origin) == utc(2025, 3, 10, 9, 0)
    assert bars == 4


def test_a_window_of_more_bars_than_the_cap_is_answered_with_its_latest_bars_not_refused(api_client: Any, scope: NodeScope) -> None:
    """Each parameter alone is schema-valid, so their pair is answered: the latest MAX_BARS buckets, on the grid."""
    store(make_event("org_started", AT - timedelta(seconds=1), event_id="a-second-ago"))
    store(make_event("org_started", AT - timedelta(hours=2), event_id="before-the-latest-bars"))
    response = api_client.get("/api/events/series?window=24h&bucket=1s")
    assert response.status_code == 200, response.content[:300]
    bars = response.json()["bars"]
    assert len(bars) == qs.MAX_BARS
    assert bars[-1]["start"] == "2025-03-10T12:30:00.000000Z" and bars[0]["start"] == "2025-03-10T11:56:41.000000Z"
    assert sum(bar["total"] for bar in bars) == 1
