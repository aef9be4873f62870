"""Typed events: the registry held to the design's list, categories, store/feed classes, new().

The design (docs/design.md § Event types) is transcribed below by hand, on
purpose: the test is only worth something if the list it checks against is
not derived from the code it checks.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

import crewlet.events as events
from crewlet.events import (
    CATEGORIES,
    CATEGORY_OF,
    ENVELOPE_KEYS,
    NOT_FED,
    NOT_STORED,
    Event,
    category_of,
    is_fed,
    is_stored,
    new,
    register,
    registered_types,
    store_label,
)
from crewlet.events import types as T
from crewlet.events.categories import types_in
from crewlet.events.tracing import Trace, start_span, trace_of

# Event Types, category by category, every name the block mentions: the typed
# list, the not-stored lines (agent_spawned/terminated), the inbox wakes named
# in comments (sandbox_answer_given, a2a_request, a2a_message), and the types
# only the exclusions paragraph names (agent_turn_progress, budget_meters,
# raw_webhook).
DESIGN: dict[str, list[str]] = {
    "lifecycle": [
        "org_started", "org_stopped",
        "config_revision_activated", "config_revision_applied",
        "operator_acted", "backup_requested",
        "seat_paused", "seat_resumed",
        "agent_spawned", "agent_terminated",
    ],
    "task": [
        "task_assigned",
        "sandbox_run_started", "sandbox_clarification_requested",
        "sandbox_run_completed", "sandbox_run_failed", "sandbox_run_answered",
        "sandbox_answer_given",
        "scheduled_task_fired",
    ],
    "a2a": [
        "a2a_channel_opened", "a2a_message_sent", "a2a_channel_closed",
        "a2a_request", "a2a_message",
    ],
    "decision": [
        "decision_requested", "decision_resolved",
        "contribution_requested", "contribution_received",
    ],
    "notification": [
        "external_notification", "notification_skipped",
        "notifications_coalesced", "turn_trigger_skipped",
    ],
    "learning": [
        "turn_completed", "episode_written", "persist_decider_completed",
        "counterparty_profile_updated", "reflection_completed",
        "skill_synthesized", "skill_refined", "skill_promoted",
        "skill_used",
        "skill_staled", "skill_archived", "skill_revived",
        "prefetch_summary",
        "knowledge_read",
        "compaction_requested", "compaction_completed",
    ],
    "system": [
        "agent_turn_started", "agent_turn_completed", "agent_turn_stopped",
        "agent_turn_steered", "agent_turn_progress",
        "agent_phase_started", "agent_phase_completed",
        "auxiliary_spend", "budget_exhausted", "budget_meters",
        "turn.guard_breach", "llm_unavailable", "provider_fallback",
        "subagent_batched", "phase.tool_skill_blocked", "skill_telemetry_write_failed",
        "prompt.size",
    ],
    "webhook": ["inbound_delivery", "raw_webhook"],
}
DESIGN_MAP = {name: cat for cat, names in DESIGN.items() for name in names}

# Types this build adds beyond the design's list, transcribed by hand with the
# category each is filed under. Each must be declared in
# crewlet.events.categories.EXTENSIONS with its reason, and none may shadow a
# design name: an extension is an addition, never a rename.
EXTENSIONS: dict[str, str] = {
    "message_dead_lettered": "system",
    "message_retry_scheduled": "system",
    "tool_server_restarted": "system",
    "tool_server_unavailable": "system",
    "history_partial": "system",
    "seats_unplaceable": "lifecycle",
    "memory_row": "learning",
}
BUILD_MAP = {**DESIGN_MAP, **EXTENSIONS}

# Excluded from the store (the design's exclusions table, plus the operator route's inbox
# wake the design's sandbox_run_answered note says "is not stored").
DESIGN_NOT_STORED = {
    "agent_spawned", "agent_terminated", "agent_turn_progress", "budget_meters",
    "raw_webhook", "a2a_request", "a2a_message", "sandbox_answer_given",
    # An extension: a history read's partial answer is a live record, never a row (a look would grow the log).
    "history_partial",
    # An extension: a memory row is state carried on CREWLET_MEMORY, never a record of what happened.
    "memory_row",
}


def _typed_registry() -> dict[str, type]:
    """The registry as crewlet.events.types fills it (a test module may register its own)."""
    return {name: cls for name, cls in registered_types().items() if cls.__module__.startswith(f"{T.__name__}.")}


# --- the registry and the map, held to the design -------------------------


def test_the_design_list_has_no_name_twice():
    names = [n for names in DESIGN.values() for n in names]
    assert len(names) == len(set(names))


def test_the_category_map_is_exactly_the_designs_list_plus_the_documented_extensions_both_ways():
    assert dict(CATEGORY_OF) == BUILD_MAP
    missing = set(BUILD_MAP) - set(CATEGORY_OF)
    unlisted = set(CATEGORY_OF) - set(BUILD_MAP)
    assert not missing and not unlisted, (missing, unlisted)


def test_every_extension_is_declared_with_its_reason_and_shadows_no_design_type():
    from crewlet.events.categories import EXTENSIONS as DECLARED

    assert set(DECLARED) == set(EXTENSIONS)
    assert not set(EXTENSIONS) & set(DESIGN_MAP)
    for name, reason in DECLARED.items():
        assert isinstance(reason, str) and len(reason.split()) >= 5, f"{name} needs its reason in words"


def test_every_design_type_is_registered_as_a_class_and_nothing_else_is():
    registry = _typed_registry()
    assert set(registry) == set(BUILD_MAP)
    for name, cls in registry.items():
        assert dataclasses.is_dataclass(cls) and cls.event_type == name
        assert isinstance(cls(), T.EventBody)


def test_importing_crewlet_events_registers_the_types():
    assert events.registered_type("seat_paused") is T.SeatPaused
    assert events.registered_type("turn.guard_breach") is T.TurnGuardBreach


def test_categories_are_the_closed_set():
    assert set(CATEGORIES) == {"lifecycle", "task", "a2a", "decision", "notification", "learning", "system", "webhook"}
    assert set(CATEGORY_OF.values()) == set(CATEGORIES)
    assert category_of("seat_paused") == "lifecycle"
    assert category_of("inbound_delivery") == "webhook"
    assert category_of("from_a_newer_build") is None
    assert types_in("decision") == (
        "decision_requested", "decision_resolved", "contribution_requested", "contribution_received",
    )
    with pytest.raises(ValueError):
        types_in("misc")


def test_the_map_cannot_be_edited_in_place():
    with pytest.raises(TypeError):
        CATEGORY_OF["x"] = "system"  # type: ignore[index]


# --- stored / fed ----------------------------------------------------------


def test_the_not_stored_types_are_the_designs_exclusions():
    assert NOT_STORED == DESIGN_NOT_STORED
    for name in DESIGN_NOT_STORED:
        assert not is_stored(name) and not is_fed(name), name


def test_auxiliary_spend_is_stored_and_not_fed():
    assert is_stored("auxiliary_spend") and not is_fed("auxiliary_spend")
    assert NOT_FED == NOT_STORED | {"auxiliary_spend"}


def test_everything_else_is_stored_and_fed_including_an_unknown_type():
    for name in set(BUILD_MAP) - NOT_FED:
        assert is_stored(name) and is_fed(name), name
    assert is_stored("from_a_newer_build") and is_fed("from_a_newer_build")


def test_the_decision_seam_is_mapped_and_stored():
    for name in DESIGN["decision"]:
        assert category_of(name) == "decision" and is_stored(name)


# --- bodies: fields, round trips, summary, actor ----------------------------


def test_no_typed_body_declares_an_envelope_key_or_a_method_name():
    reserved = set(ENVELOPE_KEYS) | {"summary", "actor", "event_type"}
    for name, cls in _typed_registry().items():
        clash = {f.name for f in dataclasses.fields(cls)} & reserved
        assert not clash, f"{name} declares {clash}"


def test_every_field_has_a_default_so_changes_stay_additive():
    for name, cls in _typed_registry().items():
        for f in dataclasses.fields(cls):
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            assert has_default, f"{name}.{f.name} has no default"


def test_documented_fields_are_present():
    def fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert {"seat", "paused_by", "paused_by_seat", "reason", "stop_running", "paused_at"} <= fields(T.SeatPaused)
    assert {"seat", "resumed_by", "resumed_by_seat", "paused_by", "paused_at"} <= fields(T.SeatResumed)
    assert {"channel_id", "participants", "message_count", "open_seconds", "closed_by", "turn_id", "work_key"} <= fields(
        T.A2AChannelClosed
    )
    assert {"reason", "detail"} <= fields(T.NotificationSkipped)
    assert {"partition_key", "count", "event_ids"} <= fields(T.NotificationsCoalesced)
    assert "conversation_key" not in fields(T.NotificationsCoalesced)
    assert "partition_key" not in fields(T.ExternalNotification)  # rides the payload map, per the design
    for cls in (T.AgentTurnStarted, T.AgentTurnCompleted):
        assert {"seat", "turn_id", "conversation_key", "work_item", "work_item_basis", "resumed"} <= fields(cls)
    assert {"input_tokens", "output_tokens", "tools", "suspended", "stopped", "failed"} <= fields(T.AgentTurnCompleted)
    assert {"token", "actor_seat", "tool", "transport", "request_id", "outcome", "position", "refusal"} <= fields(
        T.OperatorActed
    )
    assert {"dir", "finished", "streams"} <= fields(T.BackupRequested)
    assert {"source_page_id", "source_container"} <= fields(T.SkillUsed)
    assert {"pages", "backend", "phase", "via", "query"} <= fields(T.KnowledgeRead)
    assert {"stopped_by", "stopped_by_seat", "reason"} <= fields(T.AgentTurnStopped)
    assert {"status", "phase", "iteration", "round", "note", "note_id", "steered_by", "steered_by_seat", "sent_at"} <= fields(
        T.AgentTurnSteered
    )
    assert {"rounds", "error_kind", "refusal"} <= fields(T.AgentPhaseCompleted)
    assert {"outcome", "route", "answered_by"} <= fields(T.SandboxRunAnswered)
    assert {"to_provider_key"} <= fields(T.ProviderFallback)
    assert {"system_bytes", "user_bytes", "message_bytes", "tool_bytes", "tool_count"} <= fields(T.PromptSize)
    assert {"scope", "period", "window", "resets_at", "spend", "ceiling"} <= fields(T.BudgetExhausted)
    aux = fields(T.AuxiliarySpend)
    assert {"stage", "purpose", "calls", "failed_calls", "model", "company_day"} <= aux and "failed" not in aux


def test_skip_reasons_are_the_fixed_phrases():
    assert T.SKIP_REASONS == (
        "unreadable delivery payload",
        "this source was disconnected",
        "no parser for this source",
        "parse failed",
        "no seat matches this recipient",
        "human seat",
        "self-action: the recipient caused this event",
        "rate limit exceeded",
    )


def _sample(cls: type) -> object:
    """An instance with a non-default value in every field, so a round trip proves each one travels."""
    values: dict[str, object] = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if isinstance(default, bool):
            values[f.name] = not default
        elif isinstance(default, int):
            values[f.name] = i + 7
        elif isinstance(default, float):
            values[f.name] = i + 0.5
        elif isinstance(default, str):
            values[f.name] = f"{f.name}-{i}"
        elif isinstance(default, list):
            values[f.name] = [f"{f.name}-a", f"{f.name}-b"] if str(f.type).startswith("list[str") else [{"k": i}]
        elif isinstance(default, dict):
            values[f.name] = {"k": f"v{i}"}
        else:  # Optional[dict] = None
            values[f.name] = {"backend": "native", "key": f"K-{i}"}
    return cls(**values)


@pytest.mark.parametrize("name", sorted(BUILD_MAP))
def test_every_type_round_trips_as_its_class(name):
    cls = registered_types()[name]
    body = _sample(cls)
    event = new(body, Trace.root(), source="somewhere")
    raw = json.loads(event.to_json())
    for f in dataclasses.fields(cls):
        assert raw[f.name] == getattr(body, f.name), f"{name}.{f.name} is not marshalled flat"
    back = Event.from_json(event.to_json())
    assert back.type == name
    assert type(back.data) is cls and back.data == body
    assert back.extra == {}
    assert back.to_json() == event.to_json()


@pytest.mark.parametrize("name", sorted(BUILD_MAP))
def test_every_type_says_who_did_what(name):
    cls = registered_types()[name]
    for body, source in ((cls(), ""), (_sample(cls), "somewhere")):
        event = new(body, Trace.root(), source=source)
        assert event.summary().strip(), name
        assert event.actor().strip(), name
    assert new(cls(), Trace.root()).actor() == "system"


def test_actor_precedence_is_role_then_source_then_agent_id_then_system():
    def actor(source: str = "", **fields: str) -> str:
        return new(T.AgentTurnStarted(**fields), Trace.root(), source=source).actor()

    assert actor("slack", role="CTO", agent_id="a-1") == "CTO"
    assert actor("slack", agent_id="a-1") == "slack"
    assert actor(agent_id="a-1") == "a-1"
    assert actor() == "system"


def test_the_audit_names_the_token_as_actor():
    e = new(T.OperatorActed(token="release-bot", actor_seat="ada", tool="pause_seat"), Trace.root(), source="operator")
    assert e.actor() == "release-bot"
    assert new(T.OperatorActed(), Trace.root(), source="operator").actor() == "operator"


def test_summaries_read_like_a_person_wrote_them():
    t = Trace.root()
    paused = new(T.SeatPaused(seat="grace", paused_by="Ada", reason="too chatty"), t)
    assert paused.summary() == "Ada paused seat grace: too chatty"
    swept = new(T.A2AChannelClosed(channel_id="c1", participants=["ada", "grace"], message_count=1), t)
    assert swept.summary().startswith("system closed A2A channel c1")
    answered = new(T.A2AChannelClosed(channel_id="c1", closed_by="grace", turn_id="t1"), t)
    assert answered.summary().startswith("grace closed")
    skipped = new(T.NotificationSkipped(reason=T.SKIP_NO_SEAT, recipient="bob"), t, source="slack")
    assert "no seat matches this recipient" in skipped.summary()


def test_an_unknown_type_still_has_an_actor_and_a_summary():
    e = Event.from_json(b'{"id":"1","type":"from_a_newer_build","timestamp":"2026-01-01T00:00:00Z","role":"CFO"}')
    assert e.data is None and e.actor() == "CFO"
    assert "from a newer build" in e.summary()
    e2 = Event.from_json(b'{"id":"2","type":"x","timestamp":"2026-01-01T00:00:00Z","source":"jira","agent_id":"a"}')
    assert e2.actor() == "jira"
    assert Event(type="y").actor() == "system"


# --- node ------------------------------------------------------------------


@register("event_types_test_smuggles_node")
@dataclass
class _Smuggler:
    seat: str = ""
    node: str = ""


def test_a_typed_body_cannot_smuggle_node():
    body = _Smuggler(seat="ada", node="forged")
    e = Event(type="event_types_test_smuggles_node", data=body, node="n1")
    raw = json.loads(e.to_json())
    assert raw["node"] == "n1" and raw["seat"] == "ada"
    unstamped = json.loads(Event(type="event_types_test_smuggles_node", data=body).to_json())
    assert "node" not in unstamped, "a payload's node must never stand in for the queue's stamp"
    back = Event.from_json(e.to_json())
    assert back.node == "n1" and back.data.node == ""


def test_new_never_sets_node():
    assert new(T.OrgStarted(org="acme"), Trace.root()).node == ""


# --- unknown types -----------------------------------------------------------


def test_an_unknown_type_decodes_with_no_data_and_republishes_losslessly():
    original = (
        b'{"id":"5d1c5c8e-0000-4000-8000-000000000002","type":"seat_teleported",'
        b'"timestamp":"2026-11-30T02:53:08.123456Z","source":"","payload":{},'
        b'"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7","parent_span_id":"",'
        b'"delegation_depth":0,"parent_turn_id":"","delegation_chain":[],"node":"n2",'
        b'"seat":"grace","to":{"region":"eu"}}'
    )
    e = Event.from_json(original)
    assert e.data is None and category_of(e.type) is None
    assert e.extra == {"seat": "grace", "to": {"region": "eu"}}
    assert e.to_json() == original


# --- inbound_delivery's label ------------------------------------------------


@pytest.mark.parametrize(
    ("surface", "event_name", "label"),
    [
        ("webhook", "jira:issue_updated", "webhook:jira:issue_updated"),
        ("forge", "pull_request", "forge:pull_request"),
        ("socket", "posted", "socket:posted"),
        ("socket", "", "socket:posted"),
        ("", "page_updated", "webhook:page_updated"),
    ],
)
def test_an_inbound_delivery_is_filed_under_its_own_label(surface, event_name, label):
    body = T.InboundDelivery(surface=surface, event_name=event_name, seat="grace")
    e = new(body, Trace.root(), source="github")
    assert store_label(e) == label
    assert store_label(Event.from_json(e.to_json())) == label


def test_every_other_type_is_filed_under_its_name():
    e = new(T.SeatPaused(seat="grace"), Trace.root())
    assert store_label(e) == "seat_paused"
    assert store_label(Event(type="from_a_newer_build")) == "from_a_newer_build"


def test_an_untyped_inbound_delivery_is_labelled_from_its_kept_keys():
    e = Event.from_dict({"type": "inbound_delivery", "surface": "forge", "event_name": "push"})
    e.data = None  # as a build without the class would hold it
    e.extra = {"surface": "forge", "event_name": "push"}
    assert store_label(e) == "forge:push"


def test_the_providers_exact_bytes_survive_the_wire():
    for raw in (b'{"b":1,  "a":"\xc3\xa9"}\n', b"\xff\xfe not utf-8"):
        body = T.InboundDelivery(surface="webhook", event_name="x")
        body.set_raw_bytes(raw)
        back = Event.from_json(new(body, Trace.root()).to_json())
        assert back.data.raw_bytes() == raw


def test_a_search_query_is_clipped_to_200_bytes_without_splitting_a_character():
    clipped = T.clip_query("é" * 150)
    assert len(clipped.encode("utf-8")) <= 200 and clipped == "é" * 100
    assert T.clip_query("short") == "short"


# --- new(payload, trace) -----------------------------------------------------


def test_new_copies_the_given_trace_and_the_type_from_the_registration():
    t = Trace.root().child()
    e = new(
        T.SeatPaused(seat="grace"),
        t,
        source="operator",
        delegation_depth=2,
        parent_turn_id="turn-1",
        delegation_chain=["ada", "grace"],
        extras={"k": 1},
    )
    assert e.type == "seat_paused" and isinstance(e.data, T.SeatPaused)
    assert (e.trace_id, e.span_id, e.parent_span_id) == (t.trace_id, t.span_id, t.parent_span_id)
    assert e.source == "operator" and e.payload == {"k": 1}
    assert (e.delegation_depth, e.parent_turn_id, e.delegation_chain) == (2, "turn-1", ["ada", "grace"])


def test_new_can_repeat_an_event_exactly():
    ts = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
    a = new(T.SandboxRunFailed(run_id="r1"), Trace.root(), event_id="fixed-id", timestamp=ts)
    assert a.id == "fixed-id" and a.timestamp == ts


def test_new_does_not_read_the_ambient_span():
    given = Trace.root()
    with start_span("ambient"):
        ambient = trace_of()
        e = new(T.OrgStarted(org="acme"), given)
    assert ambient.trace_id != given.trace_id
    assert (e.trace_id, e.span_id, e.parent_span_id) == (given.trace_id, given.span_id, "")


def test_new_refuses_a_missing_trace_and_an_unregistered_body():
    with pytest.raises(TypeError):
        new(T.OrgStarted(), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        new(T.OrgStarted(), {"trace_id": "x"})  # type: ignore[arg-type]

    @dataclass
    class NotRegistered:
        x: int = 0

    with pytest.raises(TypeError):
        new(NotRegistered(), Trace.root())
    with pytest.raises(TypeError):
        new({"type": "seat_paused"}, Trace.root())


# --- the declaration is the registration ------------------------------------


def test_a_registration_outside_the_closed_category_set_is_refused():
    with pytest.raises(ValueError, match="closed"):
        register("event_types_test_misc", category="misc")


def test_a_live_only_type_cannot_be_declared_fed_and_an_extension_needs_a_category():
    with pytest.raises(ValueError, match="fed without being stored"):
        register("event_types_test_fed_ghost", category="system", stored=False, fed=True)
    with pytest.raises(ValueError, match="category"):
        register("event_types_test_stray_extension", extension="a reason given in several words here")


def test_each_types_declaration_is_what_the_maps_report():
    for name, cls in _typed_registry().items():
        declared = events.registration(name)
        assert declared is not None and declared.cls is cls
        assert category_of(name) == declared.category
        assert is_stored(name) == declared.stored and is_fed(name) == declared.fed
