"""GET /api/events and /api/events/{id}, and the question objects behind them, on either test database."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest

from crewlet.events import Event
from crewlet.queue import topics
from eventstore import here
from eventstore import questions as qs
from eventstore.questions import Filters, NodeScope, Question
from eventstore_support import AT, NODE, US, ids, make_event, store, trace

pytestmark = [pytest.mark.django_db(databases=["default", "events"])]

HORIZON = AT - timedelta(hours=720)


def get(api_client: Any, path: str, **params: Any) -> Any:
    query = urlencode(params, doseq=True)
    return api_client.get(f"{path}?{query}" if query else path)


def page(api_client: Any, **params: Any) -> dict[str, Any]:
    response = get(api_client, "/api/events", **params)
    assert response.status_code == 200, response.content
    return response.json()


def _mixed() -> list[Event]:
    """One row of most kinds, a minute apart, newest last."""
    t = AT - timedelta(hours=1)
    m = timedelta(minutes=1)
    return store(
        make_event("org_started", t, event_id="e01"),
        make_event("agent_turn_started", t + m, event_id="e02", seat="grace", turn_id="t1", conversation_key="jira:POC-7", span=trace(2)),
        make_event("agent_phase_completed", t + 2 * m, event_id="e03", seat="grace", turn_id="t1", conversation_key="jira:POC-7", system_prompt="secret prompt", span=trace(2)),
        make_event("auxiliary_spend", t + 3 * m, event_id="e04", seat="grace", turn_id="t1", calls=2),
        make_event("notifications_coalesced", t + 4 * m, event_id="e05", seat="linus", partition_key="slack:C9:1718.001", count=3),
        make_event("a2a_channel_opened", t + 5 * m, event_id="e06", node="n2"),
        make_event("sandbox_run_failed", t + 6 * m, event_id="e07", seat="linus", error="lost"),
        make_event("inbound_delivery", t + 7 * m, event_id="e08", surface="webhook", event_name="push", seat="grace"),
    )


def test_a_page_is_newest_first_and_carries_the_tags_but_no_payload(api_client: Any, scope: NodeScope) -> None:
    _mixed()
    body = page(api_client)
    assert ids(body["events"]) == ["e08", "e07", "e06", "e05", "e04", "e03", "e02", "e01"]
    assert body["next_cursor"] is None
    phase = body["events"][5]
    assert phase["type"] == "agent_phase_completed" and phase["category"] == "system"
    assert (phase["seat"], phase["turn_id"], phase["conversation_key"], phase["node"]) == ("grace", "t1", "jira:POC-7", NODE)
    assert phase["trace_id"] == trace(2).trace_id and phase["span_id"] == trace(2).span_id
    assert phase["timestamp"] == "2025-03-10T11:32:00.000500Z"
    for row in body["events"]:
        assert not {"body", "wire", "payload", "system_prompt"} & set(row)
    assert "secret prompt" not in str(body)


def test_every_answer_says_who_answered_and_at_which_instant(api_client: Any, scope: NodeScope) -> None:
    body = page(api_client)
    assert body["coverage"] == {"nodes": [{"id": NODE, "answered": True, "error": ""}], "complete": True}
    assert body["at"] == "2025-03-10T12:30:00.000500Z"


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"category": "system"}, ["e04", "e03", "e02"]),
        ({"category": ["task", "a2a"]}, ["e07", "e06"]),
        ({"category": "webhook,lifecycle"}, ["e08", "e01"]),
        ({"type": "agent_turn_started"}, ["e02"]),
        ({"type": "webhook:push"}, ["e08"]),
        ({"seat": "linus"}, ["e07", "e05"]),
        ({"trace_id": trace(2).trace_id}, ["e03", "e02"]),
        ({"conversation_key": "jira:POC-7"}, ["e03", "e02"]),
        ({"partition_key": "slack:C9:1718.001"}, ["e05"]),
        ({"node": "n2"}, ["e06"]),
        ({"since": "2025-03-10T11:35:00.000500Z"}, ["e08", "e07", "e06"]),  # inclusive
        ({"until": "2025-03-10T11:32:00.000500Z"}, ["e02", "e01"]),  # exclusive
        ({"seat": "grace", "category": "system", "feed_only": "true"}, ["e03", "e02"]),
        ({"feed_only": "false", "seat": "grace", "category": "system"}, ["e04", "e03", "e02"]),
    ],
)
def test_each_filter_narrows_the_page(api_client: Any, scope: NodeScope, params: dict[str, Any], expected: list[str]) -> None:
    _mixed()
    assert ids(page(api_client, **params)["events"]) == expected


def test_feed_only_keeps_out_exactly_what_the_feed_never_holds(api_client: Any, scope: NodeScope) -> None:
    _mixed()
    assert "e04" not in ids(page(api_client, feed_only="1")["events"])
    assert len(page(api_client, feed_only="1")["events"]) == 7


def test_the_history_is_floored_at_the_askers_instant_both_ways(api_client: Any, scope: NodeScope) -> None:
    store(
        make_event("org_started", AT + US, event_id="after-at"),
        make_event("org_started", AT, event_id="at"),
        make_event("org_started", HORIZON, event_id="at-horizon"),
        make_event("org_started", HORIZON - US, event_id="past-horizon"),
    )
    assert ids(page(api_client)["events"]) == ["at", "at-horizon"]


def test_the_limit_defaults_to_100_and_a_walk_of_pages_ends(api_client: Any, scope: NodeScope) -> None:
    store(*(make_event("org_started", AT - i * US, event_id=f"r{i:03d}") for i in range(130)))
    first = page(api_client)
    assert len(first["events"]) == 100 and first["next_cursor"]
    second = page(api_client, cursor=first["next_cursor"])
    assert len(second["events"]) == 30 and second["next_cursor"] is None


def test_paging_visits_every_row_exactly_once_when_many_share_one_microsecond(api_client: Any, scope: NodeScope) -> None:
    same = AT - timedelta(minutes=5)
    events = [make_event("org_started", same, event_id=f"same-{i:03d}") for i in range(53)]
    events += [make_event("org_started", same + US, event_id=f"after-{i}") for i in range(4)]
    events += [make_event("org_started", same - US, event_id=f"before-{i}") for i in range(5)]
    store(*events)

    seen: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 7}
        if cursor:
            params["cursor"] = cursor
        body = page(api_client, **params)
        seen += body["events"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 9
    assert sorted(ids(seen)) == sorted(e.id for e in events)
    assert len(ids(seen)) == len(set(ids(seen))) == 62
    order = [(row["timestamp"], row["id"]) for row in seen]
    assert order == sorted(order, reverse=True)


def test_a_page_with_filters_pages_within_them(api_client: Any, scope: NodeScope) -> None:
    same = AT - timedelta(minutes=5)
    store(*(make_event("seat_paused", same, event_id=f"x{i:02d}", seat="grace" if i % 2 else "linus") for i in range(20)))
    first = page(api_client, seat="grace", limit=4)
    rest = page(api_client, seat="grace", limit=50, cursor=first["next_cursor"])
    assert ids(first["events"]) + ids(rest["events"]) == [f"x{i:02d}" for i in range(19, 0, -2)]


EVENTS, SERIES = "/api/events", "/api/events/series"


@pytest.mark.parametrize(
    "path, params, param",
    [
        (EVENTS, {"limit": "501"}, "limit"),
        (EVENTS, {"limit": "0"}, "limit"),
        (EVENTS, {"limit": "ten"}, "limit"),
        (EVENTS, {"category": "gossip"}, "category"),
        (EVENTS, {"since": "yesterday"}, "since"),
        (EVENTS, {"since": "2025-03-10T10:00:00"}, "since"),  # no time zone
        (EVENTS, {"until": "2025-02-30T10:00:00Z"}, "until"),
        (EVENTS, {"since": "2025-03-10T10:00:00Z", "until": "2025-03-10T09:00:00Z"}, "since"),
        (EVENTS, {"feed_only": "maybe"}, "feed_only"),
        (EVENTS, {"cursor": "not-a-cursor"}, "cursor"),
        (EVENTS, {"seat": ""}, "seat"),
        (EVENTS, {"type": ["a", "b"]}, "type"),
        (EVENTS, {"categroy": "system"}, "categroy"),
        (EVENTS, {"window": "1h"}, "window"),
        (SERIES, {"window": "24x"}, "window"),
        (SERIES, {"window": "0h"}, "window"),
        (SERIES, {"window": "1.5h"}, "window"),
        (SERIES, {"window": "-1h"}, "window"),
        (SERIES, {"bucket": "h"}, "bucket"),
        (SERIES, {"window": "1h", "bucket": "2h"}, "bucket"),
        (SERIES, {"limit": "5"}, "limit"),
        (SERIES, {"category": "nope"}, "category"),
    ],
)
def test_a_bad_query_parameter_of_a_page_or_a_series_is_400_naming_the_parameter_and_the_reason(
    api_client: Any, scope: NodeScope, path: str, params: dict[str, Any], param: str
) -> None:
    response = get(api_client, path, **params)
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "bad_parameter" and body["param"] == param and body["reason"]


def test_a_turns_cursor_is_not_an_events_cursor(api_client: Any, scope: NodeScope) -> None:
    cursor = qs.encode_cursor("t", AT, "turn-1")
    response = get(api_client, "/api/events", cursor=cursor)
    assert response.status_code == 400 and response.json()["param"] == "cursor"


def test_one_event_comes_back_whole_exactly_as_it_was_published(api_client: Any, scope: NodeScope) -> None:
    (event,) = store(
        make_event("agent_phase_completed", AT - timedelta(minutes=1), seat="grace", turn_id="t1", system_prompt="you are grace", rounds=[{"stop_reason": "end"}])
    )
    response = api_client.get(f"/api/events/{event.id}")
    assert response.status_code == 200
    body = response.json()
    assert body["event"]["wire"] == event.to_dict()
    assert body["event"]["type"] == "agent_phase_completed" and body["event"]["seat"] == "grace"
    assert body["coverage"]["complete"] is True and body["at"] == "2025-03-10T12:30:00.000500Z"


def test_an_inbound_delivery_comes_back_with_the_providers_exact_bytes(api_client: Any, scope: NodeScope) -> None:
    event = make_event("inbound_delivery", AT - timedelta(minutes=1), surface="webhook", event_name="issue_updated", provider="jira")
    raw = b'{"webhookEvent":"jira:issue_updated" ,\n "issue": {"key": "POC-7"}}'
    event.data.set_raw_bytes(raw)
    store(event, topic=topics.NOTIFICATIONS_INBOUND)
    body = api_client.get(f"/api/events/{event.id}").json()["event"]
    assert body["type"] == "webhook:issue_updated" and body["category"] == "webhook"
    assert body["provider_body"].encode() == raw and body["provider_body_encoding"] == ""
    assert Event.from_dict(body["wire"]).data.raw_bytes() == raw


@pytest.mark.parametrize("offset", [US, -timedelta(hours=720) - US])
def test_an_event_outside_the_askers_history_is_404(api_client: Any, scope: NodeScope, offset: timedelta) -> None:
    (event,) = store(make_event("org_started", AT + offset))
    response = api_client.get(f"/api/events/{event.id}")
    assert response.status_code == 404
    assert response.json()["coverage"]["complete"] is True


def test_an_unknown_event_is_404(api_client: Any, scope: NodeScope) -> None:
    assert api_client.get("/api/events/nope").status_code == 404


def test_a_detail_route_takes_no_query_parameters(api_client: Any, scope: NodeScope) -> None:
    response = api_client.get("/api/events/x?limit=3")
    assert response.status_code == 400 and response.json()["param"] == "limit"


# -- the question objects -----------------------------------------------------------


def test_a_question_without_an_instant_is_refused_rather_than_answered_at_the_nodes_clock() -> None:
    question = Question(kind=qs.EVENTS, at=None)
    with pytest.raises(qs.MissingInstant) as refused:
        qs.answer(question, NodeScope(NODE))
    assert isinstance(refused.value, ValueError)


def test_a_question_of_another_protocol_version_is_refused() -> None:
    question = Question(kind=qs.EVENTS, at=AT, version=qs.PROTOCOL_VERSION + 1)
    with pytest.raises(qs.UnsupportedVersion) as refused:
        qs.answer(question, NodeScope(NODE))
    assert isinstance(refused.value, ValueError)
    answer = qs.refusal(question, NodeScope(NODE), refused.value)
    assert answer["coverage"] == {
        "nodes": [{"id": NODE, "answered": False, "error": f"protocol version: {refused.value}"}],
        "complete": False,
    }


def test_a_refusing_node_is_named_in_the_coverage_of_the_http_answer(api_client: Any, scope: NodeScope, monkeypatch: pytest.MonkeyPatch) -> None:
    from eventstore.fanout import service

    real = service.node_part

    def old_build(question: Question, node: NodeScope) -> dict[str, Any]:
        return real(replace(question, version=0), node)

    monkeypatch.setattr(service, "node_part", old_build)
    body = page(api_client)
    assert body["coverage"]["complete"] is False
    assert body["coverage"]["nodes"][0]["error"].startswith("protocol version")


def test_the_per_node_answer_is_the_same_for_the_same_question() -> None:
    question = Question(kind=qs.EVENTS, at=AT, filters=Filters(categories=("system",), since=AT - timedelta(days=1)), limit=5)
    assert Question.from_dict(question.to_dict()) == question


def test_the_per_node_function_answers_a_question_directly(scope: NodeScope) -> None:
    _mixed()
    question = Question(kind=qs.EVENTS, at=AT, filters=Filters(node="n2"))
    answer = qs.answer(question, scope)
    assert ids(answer["events"]) == ["e06"]
    assert answer["at"] == "2025-03-10T12:30:00.000500Z"
    assert here.node_scope() is scope


# -- the listing's formatting: fast, and the same bytes as the datetime-based way ------------


def _datetime_format_us(us: int) -> str:
    """The reference: a datetime built and formatted the way every other timestamp is."""
    from crewlet.events import format_timestamp

    return format_timestamp(qs.from_us(us))


def _edge_instants_us() -> list[int]:
    from datetime import datetime, timezone

    def us(*args: int) -> int:
        return qs.to_us(datetime(*args, tzinfo=timezone.utc))

    edges = [
        0,  # the epoch
        1,
        999_999,
        -1,  # the last microsecond before the epoch
        us(1, 1, 1),  # Go's zero time: the year is zero-padded to four digits
        us(999, 12, 31, 23, 59, 59, 999_999),
        us(2000, 2, 29, 12, 0, 0),  # a leap day of a century leap year
        us(2024, 2, 29, 0, 0, 0, 0),
        us(2024, 2, 29, 23, 59, 59, 999_999),  # the end of a leap day
        us(2024, 3, 1),
        us(2100, 2, 28, 23, 59, 59, 999_999),  # 2100 is not a leap year
        us(2026, 12, 31, 23, 59, 59, 999_999),  # the end of a day and a year
        us(9999, 12, 31, 0, 0, 0, 0),
        us(9999, 12, 31, 23, 59, 59, 999_999),  # the last instant a datetime holds
    ]
    return edges + [e + d for e in edges for d in (-1, 1) if us(1, 1, 1) <= e + d <= edges[-1]]


def test_the_fast_timestamp_formatter_matches_the_datetime_based_one_byte_for_byte() -> None:
    import random

    rng = random.Random(5)
    lo, hi = _edge_instants_us()[4], _edge_instants_us()[13]
    values = _edge_instants_us() + [rng.randint(lo, hi) for _ in range(5000)]
    for us in values + values:  # twice: the second pass is served by the per-day cache
        assert qs.format_us(us) == _datetime_format_us(us), us
    assert qs.format_us(0) == "1970-01-01T00:00:00.000000Z"
    assert qs.format_us(-1) == "1969-12-31T23:59:59.999999Z"
    assert qs.format_us(_edge_instants_us()[13]) == "9999-12-31T23:59:59.999999Z"


def test_a_listing_row_has_the_same_keys_in_the_same_order_and_values_as_before() -> None:
    import json

    def before(values: Any) -> dict[str, Any]:  # the dict-and-pop it replaced
        row = dict(zip(qs.LIST_COLUMNS, values))
        row["timestamp"] = _datetime_format_us(row.pop("ts"))
        row["failed"] = bool(row["failed"])
        return row

    for ts, failed in ((0, 0), (1_735_689_600_123_456, 1), (-1, False), (253_402_300_799_999_999, True)):
        values = tuple(ts if c == "ts" else failed if c == "failed" else f"{c}-value" for c in qs.LIST_COLUMNS)
        assert json.dumps(qs.list_row(values)) == json.dumps(before(values))
        assert json.dumps(qs.list_row(list(values))) == json.dumps(before(values))


# -- the JSON renderer: orjson, the same JSON values as DRF's -----------------------------------


def test_the_orjson_renderer_gives_the_same_json_values_as_drfs_renderer() -> None:
    import datetime as dt
    import decimal
    import json
    import uuid

    from django.utils.translation import gettext_lazy
    from rest_framework.renderers import JSONRenderer

    from crewlet.http.renderers import OrjsonRenderer

    data = {
        "text": "naïve café — 日本 \u2028 line \u2029 para \"quoted\" \\ back",
        "when": dt.datetime(2026, 2, 28, 23, 59, 59, 123456, tzinfo=dt.timezone.utc),
        "naive": dt.datetime(2026, 1, 1, 0, 0),
        "offset": dt.datetime(2026, 1, 1, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "day": dt.date(2024, 2, 29),
        "clock": dt.time(12, 30, 0, 5),
        "span": dt.timedelta(seconds=90),
        "money": decimal.Decimal("12.50"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "lazy": gettext_lazy("Not found."),
        "big": 2**70,  # beyond orjson: DRF's renderer answers
        "nested": [{"n": 1, "f": 1.5, "b": True, "z": None}, ("a", "b"), {3, 3}],
        "empty": {},
    }
    drf = JSONRenderer().render(data)
    ours = OrjsonRenderer().render(data)
    assert json.loads(ours) == json.loads(drf)
    small = {k: v for k, v in data.items() if k != "big"}  # orjson's own path, not the fallback
    ours_small = OrjsonRenderer().render(small)
    assert json.loads(ours_small) == json.loads(JSONRenderer().render(small))
    assert b"\\u2028" in ours_small and "\u2028".encode() not in ours_small  # still a strict JavaScript subset
    assert "日本".encode() in ours_small  # UTF-8, not \u escapes: the same values
    assert OrjsonRenderer().render(None) == b""
    indented = OrjsonRenderer().render(small, "application/json; indent=2")
    assert indented == JSONRenderer().render(small, "application/json; indent=2")


def test_an_api_page_renders_through_orjson_with_the_same_values(api_client: Any, scope: NodeScope) -> None:
    import json

    from rest_framework.renderers import JSONRenderer

    _mixed()
    response = get(api_client, "/api/events")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert json.loads(response.content) == json.loads(JSONRenderer().render(response.data))


@pytest.mark.parametrize("path", ["/api/events", "/api/events/series", "/api/events/ev-1", "/api/traces/t-1", "/api/turns", "/api/turns/t-1"])
def test_a_process_without_an_engine_refuses_every_history_read_with_503_rather_than_answer_from_its_own_store(
    api_client: Any, path: str
) -> None:
    from crewlet.engine.runtime import NO_FLEET

    store(make_event("org_started", AT - US, event_id="only-this-store"))
    response = api_client.get(path)
    assert response.status_code == 503 and response.json() == {"error": "unavailable", "param": "", "reason": NO_FLEET}
