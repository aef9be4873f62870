"""Conformance: the wire (docs/design.md § Wire), on every backend.

Design: docs/design.md § Event schema. What crosses the broker is an event's
bytes: typed bodies come back as their class, the envelope survives whole,
nobody shares an object, the queue stamps the origin node on a copy, and a
type this build does not know round-trips byte for byte.
"""
from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from datetime import datetime, timezone

from crewlet.events import Event, register
from crewlet.queue.contract import Outcome
from crewlet.queue.queuetest.harness import Collector, attached, drained, ev, inbox, uniq


@register("conformance_wire_typed")
@dataclass
class WireTyped:
    title: str = ""
    count: int = 0
    ratio: float = 0.0
    tags: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def typed(**kw) -> Event:
    return Event(type="conformance_wire_typed", data=WireTyped(**kw))


# ---------------------------------------------------------------------------
# Payloads


async def test_a_typed_payload_arrives_as_its_class(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    body = WireTyped(title="Ship it", count=3, ratio=0.25, tags=["a", "b"], meta={"k": {"n": 1}})
    sent = Event(type="conformance_wire_typed", data=body)
    await queue.publish(topic, sent)
    (got,) = await col.wait_for(1)
    assert got.event.type == "conformance_wire_typed"
    assert isinstance(got.event.data, WireTyped)
    assert got.event.data == body
    assert got.event.data is not body
    assert got.event.extra == {}, "a registered type's fields land in data, not in extra"


async def test_free_form_payload_values_survive_with_their_types(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    payload = {
        "int": 7,
        "negative": -3,
        "zero": 0,
        "float": 0.1,
        "float_whole": 2.0,
        "tiny": 5e-324,
        "huge_float": 1.7976931348623157e308,
        "true": True,
        "false": False,
        "none": None,
        "list": [1, "two", 3.5, [4, [5]], {"six": 6}],
        "empty_list": [],
        "empty_map": {},
        "nested": {"a": {"b": {"c": [1, {"d": None}]}}},
        "beyond_float_precision": 2**53 + 1,
        "int64_max": 2**63 - 1,
        "beyond_int64": 2**64 + 1,
        "very_large": 12345678901234567890123456789012345678901234567890,
        "very_negative": -(2**80),
        "text": "Grüße, 世界 😀 \"quoted\" \\ back\nslash\ttab \u0000nul",
    }
    sent = Event(type="conformance_probe", payload=copy.deepcopy(payload))
    await queue.publish(topic, sent)
    (got,) = await col.wait_for(1)
    received = got.event.payload
    assert received == payload
    for key, value in payload.items():
        assert type(received[key]) is type(value), f"{key}: {type(value).__name__} came back as {type(received[key]).__name__}"
    assert received["true"] is True and received["false"] is False
    assert received["beyond_float_precision"] == 9007199254740993
    assert received["float_whole"] == 2.0 and isinstance(received["float_whole"], float)


async def test_the_whole_envelope_survives(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    sent = Event(
        type="conformance_probe",
        payload={"i": 1, "k": ["v"]},
        id="3f1c2b8e-2d7a-4a6e-9c1b-0e5f6a7b8c9d",
        timestamp=datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=timezone.utc),
        source="jira",
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        parent_span_id="00f067aa0ba902b7",
        delegation_depth=3,
        parent_turn_id="turn-42",
        delegation_chain=["ceo", "cto", "dev-1"],
    )
    await queue.publish(topic, sent)
    (got,) = await col.wait_for(1)
    e = got.event
    assert e.id == sent.id
    assert e.type == sent.type
    assert e.source == "jira"
    assert e.payload == {"i": 1, "k": ["v"]}
    assert (e.trace_id, e.span_id, e.parent_span_id) == (sent.trace_id, sent.span_id, sent.parent_span_id)
    assert (e.delegation_depth, e.parent_turn_id, e.delegation_chain) == (3, "turn-42", ["ceo", "cto", "dev-1"])
    assert e.timestamp == sent.timestamp, "the timestamp keeps its microseconds"
    assert e.timestamp.microsecond == 123456 and e.timestamp.utcoffset().total_seconds() == 0
    assert e.node == "n1"
    assert e.extra == {}


# ---------------------------------------------------------------------------
# Nobody shares an object


async def test_what_one_groups_handler_mutates_is_invisible_to_another_group(harness, queue):
    topic, _ = inbox()
    mutated = asyncio.Event()

    async def vandal(delivery):
        e = delivery.event
        e.payload["i"] = "vandalised"
        e.payload.setdefault("list", []).append("added")
        e.delegation_chain.append("intruder")
        e.data.tags.append("vandal")
        e.data.meta["owned"] = True
        e.source = "changed"
        mutated.set()

    async def after_the_vandal(delivery):
        await mutated.wait()

    first = Collector(harness, vandal)
    second = Collector(harness, after_the_vandal)
    await queue.subscribe(topic, "first", first)
    await queue.subscribe(topic, "second", second)
    sent = Event(
        type="conformance_wire_typed",
        payload={"i": 1, "list": ["x"]},
        source="origin",
        delegation_chain=["a"],
        data=WireTyped(title="t", tags=["orig"], meta={"m": 1}),
    )
    snapshot = copy.deepcopy(sent)
    await queue.publish(topic, sent)
    await first.wait_for(1)
    (got,) = await second.wait_for(1)
    await asyncio.wait_for(mutated.wait(), harness.wait_s)
    e = got.event
    assert e.payload == {"i": 1, "list": ["x"]}
    assert e.delegation_chain == ["a"]
    assert e.source == "origin"
    assert e.data == WireTyped(title="t", tags=["orig"], meta={"m": 1})
    assert sent == snapshot, "a handler's mutation reached the publisher's object"


async def test_the_delivered_object_is_never_the_published_one(harness, queue):
    topic, group = inbox()
    sent = ev(1, nested={"k": [1]})

    def mutate_then_hand_back(delivery):
        if len(col) == 1:
            sent.payload["nested"]["k"].append("caller-after-publish")  # the caller goes on using its object
            delivery.event.payload["nested"]["k"].append("handler-before-nak")
            return Outcome.NAK
        return None

    col = Collector(harness, mutate_then_hand_back)
    await queue.subscribe(topic, group, col)
    await queue.publish(topic, sent)
    await col.wait_for(2)
    first_event, second_event = (d.event for d in col.items[:2])
    assert first_event is not sent and second_event is not sent and second_event is not first_event
    assert second_event.payload == {"i": 1, "nested": {"k": [1]}}, "a redelivery carries the stored bytes"
    assert second_event.id == sent.id
    await drained(harness, queue, topic, group)
    await col.quiet(2)


# ---------------------------------------------------------------------------
# The origin node


async def test_the_clients_node_is_stamped_where_none_is_set_for_listener_consumer_and_broadcast(harness, queue):
    topic = f"crewlet.events.{uniq('stamped')}"
    heard, consumed, streamed = [], Collector(harness), Collector(harness)

    async def listener(t, e):
        heard.append(e)

    queue.add_publish_listener(listener)
    await queue.subscribe(topic, "materializer", consumed)
    other = await harness.client("n2")
    await other.subscribe_stream(topic, streamed.stream_handler)
    sent = ev("unstamped")
    assert sent.node == ""
    await queue.publish(topic, sent)
    (delivery,) = await consumed.wait_for(1)
    ((subject, streamed_event),) = await streamed.wait_for(1)
    assert subject == topic
    assert [e.node for e in heard] == ["n1"]
    assert delivery.event.node == "n1"
    assert streamed_event.node == "n1"
    assert delivery.event.id == streamed_event.id == heard[0].id == sent.id


async def test_an_event_that_already_names_a_node_keeps_it(harness, queue):
    topic, group = inbox()
    relay_topic, relay_group = inbox("relay")
    other = await harness.client("n2")
    heard = []

    async def listener(t, e):
        heard.append((t, e.node))

    other.add_publish_listener(listener)
    relayed = Collector(harness)
    await queue.subscribe(relay_topic, relay_group, relayed)

    async def relay(delivery):  # n2 hands n1's event onwards, as a parked delivery is
        await other.publish(relay_topic, delivery.event)

    await other.subscribe(topic, group, Collector(harness, relay))
    await queue.publish(topic, ev("origin"))  # stamped n1
    (got,) = await relayed.wait_for(1)
    assert got.event.node == "n1", "a relay must not claim the event"
    await queue.publish(relay_topic, Event(type="conformance_probe", node="elsewhere"))
    (_, again) = await relayed.wait_for(2)
    assert again.event.node == "elsewhere"
    assert heard == [(relay_topic, "n1")]


async def test_publishing_never_mutates_the_callers_event(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    sent = Event(type="conformance_wire_typed", payload={"i": 1}, data=WireTyped(title="mine", tags=["t"]))
    snapshot = copy.deepcopy(sent)
    await queue.publish(topic, sent)
    (got,) = await col.wait_for(1)
    assert got.event.node == "n1"
    assert sent.node == "", "the queue stamps a copy, never the caller's object"
    assert sent == snapshot


async def test_a_client_with_no_node_stamps_nothing(harness):
    anonymous = await harness.client("")
    assert anonymous.node == ""
    topic, group = inbox()
    col, heard = Collector(harness), []

    async def listener(t, e):
        heard.append(e)

    anonymous.add_publish_listener(listener)
    await anonymous.subscribe(topic, group, col)
    await anonymous.publish(topic, ev("nobody's"))
    (got,) = await col.wait_for(1)
    assert got.event.node == ""
    assert "node" not in got.event.to_dict(), "no node key is written"
    assert heard[0].node == ""


# ---------------------------------------------------------------------------
# An event of a type this build does not know


UNKNOWN = (
    '{"id":"7b0c2f1e-unknown","type":"conformance_from_a_newer_build",'
    '"timestamp":"2024-02-29T23:59:59.123456789Z","source":"future",'
    '"payload":{"x":[1,2.5,{"y":null}],"big":123456789012345678901234567890},'
    '"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331",'
    '"parent_span_id":"00f067aa0ba902b7","delegation_depth":2,"parent_turn_id":"turn-9",'
    '"delegation_chain":["a","b"],"node":"n-future",'
    '"added_later":{"deep":[true,false,null]},"unicode":"Grüße 😀","zeta":1,"alpha":2}'
).encode("utf-8")


async def test_an_event_of_a_type_this_build_does_not_know_round_trips_byte_for_byte(harness, queue):
    topic, group = inbox()
    relay_topic, relay_group = inbox("relay")
    heard = []

    async def listener(t, e):
        heard.append(e.to_json())

    queue.add_publish_listener(listener)
    relayed = Collector(harness)
    await queue.subscribe(relay_topic, relay_group, relayed)

    async def relay(delivery):
        await queue.publish(relay_topic, delivery.event)

    first = Collector(harness, relay)
    await queue.subscribe(topic, group, first)
    unknown = Event.from_json(UNKNOWN)
    assert unknown.data is None
    await queue.publish(topic, unknown)
    (got,) = await first.wait_for(1)
    assert got.event.type == "conformance_from_a_newer_build"
    assert got.event.data is None
    assert got.event.to_json() == UNKNOWN
    (again,) = await relayed.wait_for(1)
    assert again.event.to_json() == UNKNOWN, "a relayed unknown event is re-published losslessly"
    assert heard == [UNKNOWN, UNKNOWN]
