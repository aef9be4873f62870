"""GET /api/traces/{id} (a tree of spans) and GET /api/turns[/{id}] (turns folded from their rows)."""
from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest

from crewlet.events.tracing import Trace
from eventstore import questions as qs
from eventstore.questions import NodeScope
from eventstore_support import AT, NODE, US, ids, make_event, store

pytestmark = [pytest.mark.django_db(databases=["default", "events"])]

TRACE = "0af7651916cd43dd8448eb211c80319c"
T0 = AT - timedelta(hours=2)
S = timedelta(seconds=1)


def span(n: int, parent: int = 0, trace_id: str = TRACE) -> Trace:
    return Trace(trace_id, f"{n:016x}", f"{parent:016x}" if parent else "")


def get(api_client: Any, path: str, **params: Any) -> Any:
    return api_client.get(f"{path}?{urlencode(params)}" if params else path)


# -- traces ------------------------------------------------------------------------


def _tree(spans: list[dict[str, Any]]) -> list[Any]:
    return [(s["span_id"][-1], ids(s["events"]), _tree(s["children"])) for s in spans]


def test_a_trace_is_a_tree_of_spans_each_with_its_events(api_client: Any, scope: NodeScope) -> None:
    store(
        make_event("inbound_delivery", T0, event_id="delivery", span=span(1), surface="webhook", event_name="push"),
        make_event("agent_turn_started", T0 + S, event_id="turn-start", span=span(2, 1), turn_id="t1"),
        make_event("agent_phase_completed", T0 + 3 * S, event_id="phase", span=span(3, 2), turn_id="t1"),
        make_event("provider_fallback", T0 + 4 * S, event_id="fallback", span=span(3, 2), turn_id="t1"),
        make_event("agent_turn_completed", T0 + 5 * S, event_id="turn-end", span=span(2, 1), turn_id="t1"),
        make_event("knowledge_read", T0 + 2 * S, event_id="read", span=span(4, 2), turn_id="t1"),
        make_event("skill_used", T0 + 6 * S, event_id="orphan", span=span(5, 9)),  # parent not in the trace
        make_event("org_started", T0, event_id="other-trace", span=span(1, trace_id="1" * 32)),
    )
    response = api_client.get(f"/api/traces/{TRACE}")
    assert response.status_code == 200
    body = response.json()
    assert body["trace_id"] == TRACE and body["total"] == 7 and body["truncated"] is False
    assert _tree(body["spans"]) == [
        ("1", ["delivery"], [
            ("2", ["turn-start", "turn-end"], [
                ("4", ["read"], []),
                ("3", ["phase", "fallback"], []),
            ]),
        ]),
        ("5", ["orphan"], []),
    ]
    root = body["spans"][0]
    assert root["parent_span_id"] == "" and root["events"][0]["type"] == "webhook:push"
    assert "wire" not in root["events"][0]
    assert body["coverage"]["complete"] is True and body["at"] == "2025-03-10T12:30:00.000500Z"


def test_spans_whose_parents_loop_are_roots_rather_than_lost() -> None:
    rows = [
        {"id": "a", "timestamp": "1", "span_id": "e", "parent_span_id": "f"},
        {"id": "b", "timestamp": "2", "span_id": "f", "parent_span_id": "e"},
        {"id": "c", "timestamp": "3", "span_id": "g", "parent_span_id": "e"},
    ]
    roots = qs.span_tree(rows)
    assert [(s["span_id"], [c["span_id"] for c in s["children"]]) for s in roots] == [("e", ["g"]), ("f", [])]


def test_a_trace_only_holds_rows_inside_the_askers_history(api_client: Any, scope: NodeScope) -> None:
    store(
        make_event("org_started", AT + US, event_id="later", span=span(1)),
        make_event("org_started", AT - timedelta(hours=720) - US, event_id="too-old", span=span(1)),
    )
    assert api_client.get(f"/api/traces/{TRACE}").status_code == 404
    store(make_event("org_started", AT, event_id="now", span=span(1)))
    assert _tree(api_client.get(f"/api/traces/{TRACE}").json()["spans"]) == [("1", ["now"], [])]


# -- turns -------------------------------------------------------------------------------


def _turn(turn_id: str, start: Any, *rows: tuple[str, int, dict[str, Any]], seat: str = "grace") -> list[Any]:
    """A turn's rows: a start at ``start``, then (type, seconds after, fields) each."""
    out = [
        make_event(
            "agent_turn_started", start, event_id=f"{turn_id}-start", seat=seat, turn_id=turn_id, conversation_key=f"jira:{turn_id}",
            trigger_type="task_assigned", trigger_event_id=f"wake-{turn_id}", work_item={"backend": "native", "key": "POC-7"},
        )
    ]
    for i, (etype, after, fields) in enumerate(rows):
        out.append(make_event(etype, start + after * S, event_id=f"{turn_id}-{i}", seat=seat, turn_id=turn_id, **fields))
    return out


def _turns() -> None:
    base = AT - timedelta(hours=1)
    store(
        *_turn("t-ok", base, ("agent_phase_completed", 1, {"input_tokens": 10, "output_tokens": 5}),
               ("agent_phase_completed", 2, {"input_tokens": 20, "output_tokens": 5}),
               ("knowledge_read", 2, {}),
               ("agent_turn_completed", 3, {"input_tokens": 100, "output_tokens": 40})),
        *_turn("t-phases", base + 10 * S, ("agent_phase_completed", 1, {"input_tokens": 10, "output_tokens": 5}),
               ("agent_phase_completed", 2, {"input_tokens": 20, "output_tokens": 5}),
               ("agent_turn_completed", 3, {})),
        *_turn("t-failed", base + 20 * S, ("agent_turn_completed", 1, {"failed": True, "error": "boom"}), seat="linus"),
        *_turn("t-stopped", base + 30 * S, ("agent_turn_stopped", 1, {"stopped_by": "ada"}), ("agent_turn_completed", 2, {"stopped": True})),
        *_turn("t-parked", base + 40 * S, ("agent_turn_completed", 1, {"suspended": True})),
        *_turn("t-running", base + 50 * S, ("agent_phase_completed", 1, {"input_tokens": 7, "output_tokens": 1})),
        *_turn("t-breach", base + 60 * S, ("turn.guard_breach", 4, {"guard": "stall"})),
    )
    # A turn parked on a coding run and resumed: two segments under one id, one turn.
    resumed = _turn("t-resumed", base + 70 * S, ("agent_turn_completed", 1, {"suspended": True, "input_tokens": 5, "output_tokens": 1}))
    resumed.append(make_event("agent_turn_started", base + 80 * S, event_id="t-resumed-again", seat="grace", turn_id="t-resumed", resumed=True))
    resumed.append(make_event("agent_turn_completed", base + 90 * S, event_id="t-resumed-end", seat="grace", turn_id="t-resumed", input_tokens=8, output_tokens=2))
    store(*resumed)


def test_turns_are_folded_from_their_rows_newest_first(api_client: Any, scope: NodeScope) -> None:
    _turns()
    body = get(api_client, "/api/turns").json()
    turns = {t["turn_id"]: t for t in body["turns"]}
    assert [t["turn_id"] for t in body["turns"]] == [
        "t-resumed", "t-breach", "t-running", "t-parked", "t-stopped", "t-failed", "t-phases", "t-ok",
    ]
    ok = turns["t-ok"]
    assert ok["seat"] == "grace" and ok["nodes"] == [NODE] and ok["conversation_key"] == "jira:t-ok"
    assert ok["trigger"] == {"type": "task_assigned", "event_id": "wake-t-ok"}
    assert ok["work_item"] == {"backend": "native", "key": "POC-7"}
    assert ok["started"] == "2025-03-10T11:30:00.000500Z" and ok["ended"] == "2025-03-10T11:30:03.000500Z"
    assert ok["duration_ms"] == 3000
    assert (ok["outcome"], ok["phases"], ok["segments"]) == ("ok", 2, 1)
    assert ok["tokens"] == {"input": 100, "output": 40, "total": 140}
    assert turns["t-phases"]["tokens"] == {"input": 30, "output": 10, "total": 40}  # the completion carried none
    assert {k: turns[k]["outcome"] for k in turns} == {
        "t-ok": "ok", "t-phases": "ok", "t-failed": "failed", "t-stopped": "stopped", "t-parked": "suspended",
        "t-running": "running", "t-breach": "failed", "t-resumed": "ok",
    }
    assert turns["t-running"]["ended"] is None and turns["t-running"]["tokens"]["total"] == 8
    assert turns["t-breach"]["ended"] == "2025-03-10T11:31:04.000500Z"
    resumed = turns["t-resumed"]
    assert (resumed["segments"], resumed["started"], resumed["ended"]) == (2, "2025-03-10T11:31:10.000500Z", "2025-03-10T11:31:30.000500Z")
    assert resumed["tokens"]["total"] == 16
    assert body["coverage"]["complete"] is True and body["at"] == "2025-03-10T12:30:00.000500Z"


def test_turns_filter_on_the_start_rows(api_client: Any, scope: NodeScope) -> None:
    _turns()
    assert [t["turn_id"] for t in get(api_client, "/api/turns", seat="linus").json()["turns"]] == ["t-failed"]
    since = get(api_client, "/api/turns", since="2025-03-10T11:31:00.000500Z").json()["turns"]
    assert [t["turn_id"] for t in since] == ["t-resumed", "t-breach"]
    thread = get(api_client, "/api/turns", conversation="jira:t-ok").json()
    assert [t["turn_id"] for t in thread["turns"]] == ["t-ok"] and thread["coverage"]["complete"] is True
    # The events read names the tag; the turns read names the thread.
    assert get(api_client, "/api/turns", conversation_key="jira:t-ok").json()["param"] == "conversation_key"
    assert get(api_client, "/api/events", conversation="jira:t-ok").json()["param"] == "conversation"


def test_paging_turns_visits_each_once_when_many_start_in_one_microsecond(api_client: Any, scope: NodeScope) -> None:
    same = AT - timedelta(minutes=3)
    for i in range(23):
        store(*_turn(f"turn-{i:02d}", same))
    store(*_turn("turn-later", same + US), *_turn("turn-earlier", same - US))
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 5}
        if cursor:
            params["cursor"] = cursor
        body = get(api_client, "/api/turns", **params).json()
        seen += [t["turn_id"] for t in body["turns"]]
        cursor = body["next_cursor"]
        if not cursor:
            break
    assert seen == ["turn-later", *[f"turn-{i:02d}" for i in range(22, -1, -1)], "turn-earlier"]


def test_one_turn_comes_back_folded_with_all_its_rows(api_client: Any, scope: NodeScope) -> None:
    _turns()
    response = api_client.get("/api/turns/t-ok")
    assert response.status_code == 200
    turn = response.json()["turn"]
    assert (turn["outcome"], turn["tokens"]["total"], turn["phases"]) == ("ok", 140, 2)
    assert [e["type"] for e in turn["events"]] == [
        "agent_turn_started", "agent_phase_completed", "agent_phase_completed", "knowledge_read", "agent_turn_completed",
    ]
    assert turn["truncated"] is False
    assert api_client.get("/api/turns/nope").status_code == 404


@pytest.mark.parametrize(
    "params, param",
    [({"category": "system"}, "category"), ({"feed_only": "true"}, "feed_only"), ({"limit": "900"}, "limit"), ({"cursor": qs.encode_cursor("e", AT, "x")}, "cursor")],
)
def test_a_turns_page_refuses_a_parameter_it_does_not_take(api_client: Any, scope: NodeScope, params: dict[str, str], param: str) -> None:
    response = get(api_client, "/api/turns", **params)
    assert response.status_code == 400 and response.json()["param"] == param
