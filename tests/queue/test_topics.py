"""Every subject is built in crewlet.queue.topics; these hold the builders to the design."""
from __future__ import annotations

import pytest

from crewlet.queue import topics
from crewlet.queue.errors import InvalidArgument


def test_the_seat_subjects_and_groups_are_spelled_as_the_design_spells_them():
    assert topics.agent_inbox("ada") == "crewlet.agent.ada.inbox"
    assert topics.agent_inbox_group("ada") == "agent-ada"
    assert topics.agent_control("ada") == "crewlet.agent.ada.control"
    assert topics.agent_control_group("ada") == "agent-ada-control"
    assert topics.agent_reflect("ada") == "crewlet.agent.ada.reflect"


def test_the_fleet_wide_and_control_plane_subjects_are_fixed_strings():
    assert topics.NOTIFICATIONS_INBOUND == "crewlet.notifications.inbound"
    assert topics.CONFIG_REVISION_ACTIVATED == "crewlet.config.revision_activated"
    assert topics.CONFIG_REVISION_APPLIED == "crewlet.config.revision_applied"
    assert topics.event("agent_turn_started") == "crewlet.events.agent_turn_started"
    assert topics.event("turn.guard_breach") == "crewlet.events.turn.guard_breach"


def test_a_memory_row_has_one_subject_with_its_key_digested():
    a = topics.memory("ada", "episodes", "some key with spaces/and.dots")
    b = topics.memory("ada", "episodes", "another key")
    assert a.startswith("crewlet.memory.ada.episodes.") and b.startswith("crewlet.memory.ada.episodes.")
    assert a != b
    assert a == topics.memory("ada", "episodes", "some key with spaces/and.dots")
    assert len(a.split(".")) == 5


def test_a_dead_letter_subject_keeps_a_readable_head_and_takes_its_identity_from_the_digest():
    one = topics.dlq("a.b", "h_i")
    two = topics.dlq("a_b", "h.i")
    assert one.startswith("dlq.a.b.")
    assert one != two  # a join alone would alias these distinct pairs
    assert one.rsplit(".", 1)[1] == topics.digest("a.b", "h_i")
    assert topics.matches(topics.DLQ_ALL, one)


@pytest.mark.parametrize("bad", ["", "a b", "a.b", "*", ">"])
def test_a_handle_that_is_not_one_subject_token_is_refused(bad):
    with pytest.raises(InvalidArgument):
        topics.agent_inbox(bad)


#: Each pattern, the subjects it matches, and the subjects it does not.
GRAMMAR = {
    "crewlet.events.>": (["crewlet.events.x", "crewlet.events.turn.guard_breach"], ["crewlet.events"]),
    "crewlet.*.inbox": (["crewlet.ada.inbox"], ["crewlet.ada.b.inbox"]),
    "crewlet.agent.*.inbox": (["crewlet.agent.ada.inbox"], []),
    "*": (["a"], ["a.b"]),
    ">": (["a.b.c"], []),
    "a.b": (["a.b"], ["a_b"]),
    "a.*": ([], ["a"]),
}


@pytest.mark.parametrize(
    "pattern,subject,expected",
    [
        (pattern, subject, expected)
        for pattern, (matched, unmatched) in GRAMMAR.items()
        for expected, subjects in ((True, matched), (False, unmatched))
        for subject in subjects
    ],
)
def test_subject_matching_follows_the_nats_grammar(pattern, subject, expected):
    assert topics.matches(pattern, subject) is expected


@pytest.mark.parametrize("bad", ["", "a..b", "a.>.b", "a.b*", "a. b"])
def test_a_malformed_pattern_is_refused(bad):
    with pytest.raises(InvalidArgument):
        topics.validate_pattern(bad)


def test_each_subject_lands_on_the_stream_its_purpose_needs():
    assert topics.stream_for("crewlet.agent.ada.inbox").name == "CREWLET_AGENT"
    assert topics.stream_for("crewlet.notifications.inbound").name == "CREWLET_NOTIFICATIONS"
    assert topics.stream_for("crewlet.events.x").retention == "limits"
    assert topics.stream_for("crewlet.config.revision_applied").max_age == "config"
    assert topics.stream_for("crewlet.memory.ada.t.k").per_subject_last
    assert topics.stream_for("dlq.a.b.c").name == "CREWLET_DLQ"


def test_another_namespace_gets_a_derived_interest_stream():
    spec = topics.stream_for("acme.jobs")
    assert spec.name.startswith("CREWLET_NS_ACME")
    assert spec.retention == "interest"
    assert spec.subjects == "acme.>"
    assert topics.stream_for("crewlet.fleet.x").name.startswith("CREWLET_NS_CREWLET_FLEET")


@pytest.mark.parametrize("pattern", [">", "*.>", "*", "crewlet.>", "crewlet.*.x"])
def test_a_broadcast_pattern_spanning_every_namespace_is_refused(pattern):
    with pytest.raises(InvalidArgument):
        topics.streams_for_pattern(pattern)


def test_a_broadcast_pattern_resolves_to_the_streams_it_touches():
    assert [s.name for s in topics.streams_for_pattern("crewlet.events.>")] == ["CREWLET_EVENTS"]
    assert [s.name for s in topics.streams_for_pattern("crewlet.agent.*.inbox")] == ["CREWLET_AGENT"]


def test_a_seats_subject_names_its_handle_and_lane_and_only_an_inbox_names_an_inbox_seat() -> None:
    assert topics.agent_of(topics.agent_inbox("ada")) == ("ada", "inbox")
    assert topics.agent_of(topics.agent_control("ada")) == ("ada", "control")
    assert topics.inbox_seat(topics.agent_inbox("ada")) == "ada"
    for other in (topics.agent_control("ada"), topics.event("agent_turn_started"), "crewlet.agent..inbox", "crewlet.agent.a*.inbox",
                  "crewlet.agent.ada.inbox.extra", "dlq.crewlet.agent.ada.inbox", ""):
        assert topics.inbox_seat(other) == "", other
    assert topics.agent_of("crewlet.notifications.inbound") == ("", "")
