"""The envelope's wire form: exact keys, microsecond UTC timestamps, lossless unknowns."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

from crewlet.events import ENVELOPE_KEYS, Event, register


@register("envelope_test_typed")
@dataclass
class _Typed:
    seat: str = ""
    count: int = 0


def test_the_envelope_writes_exactly_the_designs_keys_in_order():
    e = Event(type="x", payload={"a": 1}, node="n1")
    assert list(json.loads(e.to_json())) == list(ENVELOPE_KEYS)
    assert ENVELOPE_KEYS == (
        "id", "type", "timestamp", "source", "payload", "trace_id", "span_id",
        "parent_span_id", "delegation_depth", "parent_turn_id", "delegation_chain", "node",
    )


def test_an_event_without_a_node_writes_no_node_key():
    assert "node" not in json.loads(Event(type="x").to_json())


def test_the_timestamp_is_rfc3339_utc_with_microseconds():
    ts = datetime(2026, 11, 30, 2, 53, 8, 123456, tzinfo=timezone.utc)
    raw = json.loads(Event(type="x", timestamp=ts).to_json())
    assert raw["timestamp"] == "2026-11-30T02:53:08.123456Z"
    assert Event.from_json(Event(type="x", timestamp=ts).to_json()).timestamp == ts


def test_a_typed_body_is_marshalled_flat_beside_the_envelope_and_decodes_as_its_class():
    e = Event(type="envelope_test_typed", data=_Typed(seat="ada", count=3))
    raw = json.loads(e.to_json())
    assert raw["seat"] == "ada" and raw["count"] == 3
    back = Event.from_json(e.to_json())
    assert isinstance(back.data, _Typed) and back.data == _Typed(seat="ada", count=3)
    assert back.extra == {}


def test_an_unknown_type_round_trips_byte_for_byte():
    original = (
        b'{"id":"5d1c5c8e-0000-4000-8000-000000000001","type":"from_a_newer_build",'
        b'"timestamp":"2026-11-30T02:53:08.123456789Z","source":"elsewhere","payload":{"big":123456789012345678901234567890},'
        b'"trace_id":"","span_id":"","parent_span_id":"","delegation_depth":2,"parent_turn_id":"t",'
        b'"delegation_chain":["a","b"],"node":"n9","new_field":{"nested":[1,2.5,true,null]},"another":"x"}'
    )
    e = Event.from_json(original)
    assert e.data is None
    assert e.extra == {"new_field": {"nested": [1, 2.5, True, None]}, "another": "x"}
    assert e.to_json() == original


def test_a_field_that_collides_with_the_envelope_is_dropped_in_favour_of_the_envelope():
    e = Event.from_json(b'{"id":"1","type":"x","timestamp":"2026-01-01T00:00:00Z","node":"n1"}')
    e.extra["node"] = "forged"
    assert json.loads(e.to_json())["node"] == "n1"


@pytest.mark.parametrize("bad", [b"[]", b'{"id":"1"}', b'{"type":""}', b"not json"])
def test_a_body_that_is_not_an_event_is_refused(bad):
    with pytest.raises(ValueError):
        Event.from_json(bad)


def test_go_zero_time_round_trips_with_a_four_digit_year():
    e = Event.from_json(b'{"id":"1","type":"x","timestamp":"0001-01-01T00:00:00Z"}')
    assert e.timestamp.year == 1
    again = Event.from_json(Event(type="x", timestamp=e.timestamp).to_json())
    assert again.timestamp == e.timestamp
    assert json.loads(Event(type="x", timestamp=e.timestamp).to_json())["timestamp"].startswith("0001-01-01T")


# --- Event.field: one precedence for every reader -----------------------------


def test_a_set_typed_field_wins_over_the_kept_keys_and_the_payload():
    e = Event(type="envelope_test_typed", data=_Typed(seat="ada"), payload={"seat": "bob"}, extra={"seat": "eve"})
    assert e.field("seat") == "ada"


def test_an_unset_typed_field_yields_to_a_kept_key_then_to_the_payload():
    e = Event(type="envelope_test_typed", data=_Typed(), payload={"seat": "bob"})
    assert e.field("seat") == "bob"
    e.extra["seat"] = "eve"
    assert e.field("seat") == "eve", "a newer build's flat field wins over a payload copy"


def test_false_and_zero_are_values_and_an_unset_typed_field_still_reads_as_its_default():
    e = Event(type="envelope_test_typed", data=_Typed(count=0), payload={"flag": False})
    assert e.field("flag") is False
    assert e.field("count") == 0 and e.field("seat") == ""


def test_an_untyped_event_reads_its_kept_keys_before_its_payload_and_a_named_empty_value_stays_empty():
    e = Event.from_json(b'{"id":"1","type":"from_a_newer_build","payload":{"seat":"bob","body":""},"seat":"ada"}')
    assert e.data is None
    assert e.field("seat") == "ada"
    assert e.field("body") == "", "named and empty is not the same as not named"
    assert e.field("nowhere") is None


@pytest.mark.integration  # starts a child process
def test_building_and_decoding_an_event_loads_neither_opentelemetry_nor_crewlet_tracing():
    """The envelope and the trace codec are usable without the SDK: the import runs one way."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from crewlet.events import Event, Trace, new\n"
        "from crewlet.events.types import SeatPaused\n"
        "e = Event.from_json(new(SeatPaused(seat='ada'), Trace.root()).to_json())\n"
        "assert e.data == SeatPaused(seat='ada') and Trace.of(e) is not None\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'crewlet.events.tracing')))\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
