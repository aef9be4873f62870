"""A wake read through its typed view: the values Event.field gives, typed, and the wire left as it was."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from crewlet import events
from crewlet.events import Event
from crewlet.events.trace import Trace
from crewlet.events.types import A2ARequest, ExternalNotification
from seats import wake as keys
from seats.coalescer import coalesce, coalesced_record, partition_key_of
from seats.wake import Wake, WakeValueError

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


def slack_wake(n: int, body: str, *, sender: str = "sam", digest: str = "", position: str = "") -> Event:
    """A wake as the notification service builds one (typed fields and the payload beside them), fixed in every value."""
    extras = {
        "partition_key": "slack:C1",
        "conversation_identity": "slack:C1",
        "sender": sender,
        "sender_id": f"U-{sender}",
        "body": body,
        "digest_body": digest,
        "direct": n != 2,
        "recon": False,
        "delivery_id": f"Ev{n}",
        "message_id": f"C1:{n}",
        "why": "dm",
        "notification_source": "slack",
        "title": f"title {n}",
        "url": f"https://x/{n}",
    }
    if position:
        extras["trigger_position"] = position
    return events.new(
        ExternalNotification(
            seat="ada",
            role="engineer",
            agent_id="a-1",
            event_name="message",
            delivery_id=f"Ev{n}",
            sender=sender,
            title=f"title {n}",
            body=body,
            url=f"https://x/{n}",
        ),
        Trace(f"{n:032x}", f"{n:016x}"),
        source="slack",
        extras=extras,
        event_id=str(uuid.UUID(int=n)),
        timestamp=T0 + timedelta(seconds=n),
        delegation_depth=n % 2,
    )


def test_the_typed_view_reads_what_event_field_reads_and_leaves_the_wire_as_it_was() -> None:
    ev = slack_wake(1, "hello", digest="lead", position="s@1:4")
    wire = ev.to_json()
    for strict in (False, True):
        w = Wake(ev, strict=strict)
        assert (w.partition_key, w.conversation_identity) == (ev.field("partition_key"), ev.field("conversation_identity"))
        assert (w.sender, w.sender_id, w.body, w.digest_body) == ("sam", "U-sam", "hello", "lead")
        assert (w.seat, w.event_name, w.title, w.url) == ("ada", "message", "title 1", "https://x/1")
        assert (w.delivery_id, w.message_id, w.trigger_position, w.messages) == ("Ev1", "C1:1", "s@1:4", [])
        assert (w.direct, w.recon) == (True, False)
    assert ev.to_json() == wire
    assert Event.from_json(wire).to_json() == wire


def test_the_keys_the_seats_read_are_the_typed_fields_where_the_wake_declares_them() -> None:
    declared = {f.name for f in dataclasses.fields(ExternalNotification)}
    typed = {keys.SEAT, keys.EVENT_NAME, keys.DELIVERY_ID, keys.SENDER, keys.TITLE, keys.BODY, keys.URL, keys.MESSAGES}
    assert typed <= declared
    payload_only = {keys.PARTITION_KEY, keys.CONVERSATION_IDENTITY, keys.SENDER_ID, keys.DIGEST_BODY, keys.MESSAGE_ID}
    assert not payload_only & declared  # promoting one would change the wire


def test_a_lenient_read_of_a_stray_type_is_empty_and_a_strict_one_names_it() -> None:
    ev = slack_wake(1, "hello")
    ev.payload["partition_key"] = 7
    ev.payload["messages"] = "not a list"
    assert Wake(ev).partition_key == "" and Wake(ev).messages == []
    assert partition_key_of(ev) == f"event:{ev.id}"  # the inbox's key: a wake naming no partition is its own
    with pytest.raises(WakeValueError, match="partition_key is a int, not a string"):
        Wake(ev, strict=True).partition_key
    with pytest.raises(WakeValueError, match="messages is not a list"):
        Wake(ev, strict=True).messages


def test_any_inbox_event_is_a_wake_and_what_its_type_does_not_carry_reads_empty() -> None:
    ask = events.new(
        A2ARequest(from_seat="linus", to_seat="ada"),
        Trace.root(),
        extras={"sender": "linus", "body": "help?", "conversation_identity": "a2a:1"},
    )
    w = Wake(ask)
    assert (w.sender, w.body, w.conversation_identity, w.partition_key, w.digest_body) == ("linus", "help?", "a2a:1", "", "")


def _canonical_digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_the_merged_trigger_and_its_record_carry_every_key_and_value_they_did_before_the_typed_view() -> None:
    """The digests are of what the coalescer made before it read wakes through ``Wake``, keys sorted.

    Sorted, because the event bodies' shared field groups (``crewlet/events/types/base.py``)
    put a body's keys in another order on the wire; JSON readers do not see the order, and
    every key and value is what it was.
    """
    evs = [
        slack_wake(1, "+1", position="s@1:4"),
        slack_wake(2, "full text", digest="lead", position="s@1:9"),
        slack_wake(3, "+1"),
        slack_wake(4, "latest", sender="kim", position="s@1:7"),
    ]
    merged = coalesce(evs)
    assert _canonical_digest(json.loads(merged.to_json())) == "caa05670764a5b8e04f79a68db96af9b38a07a9a41e79ddec443b6212bfa4766"
    record = coalesced_record(merged, seat="ada", role="engineer", agent_id="a-1", trace=Trace("f" * 32, "e" * 16))
    fields = {k: v for k, v in record.to_dict().items() if k not in ("id", "timestamp")}
    assert _canonical_digest(fields) == "6d85617348f298677afe7e753efe539bc2f02ca6ef41db23b1e4e384f20661eb"
