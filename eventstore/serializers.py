"""Response shapes of the /api/ reads, declared for the OpenAPI schema.

The views build their answers as plain dicts (eventstore.questions) and do
not run these serializers over every row: a page of 500 rows is on the hot
path and the answer is already exactly what goes on the wire. These classes
are the schema's description of that wire shape, nothing more.
"""
from __future__ import annotations

from rest_framework import serializers

from crewlet.http.bodies import ErrorSerializer  # noqa: F401  (the error answers, as s.* in the views)
from crewlet.events import CATEGORIES
from eventstore.questions.turns import TURN_OUTCOMES


class NodeCoverageSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="node id")
    answered = serializers.BooleanField()
    error = serializers.CharField(help_text="why the node did not answer; empty when it did")


class CoverageSerializer(serializers.Serializer):
    nodes = NodeCoverageSerializer(many=True)
    complete = serializers.BooleanField(help_text="true only when every live node answered")


class AnswerSerializer(serializers.Serializer):
    coverage = CoverageSerializer()
    at = serializers.CharField(help_text="the asker's instant (RFC 3339, microseconds) every node answered as of")


class MissSerializer(ErrorSerializer, AnswerSerializer):
    """A detail read's 404: the one error shape, with the history it looked at (``coverage``, ``at``)."""


class EventRowSerializer(serializers.Serializer):
    id = serializers.CharField()
    timestamp = serializers.CharField(help_text="RFC 3339, UTC, microseconds")
    type = serializers.CharField(help_text="the row's label: the event type, or an inbound delivery's own label")
    category = serializers.ChoiceField(choices=list(CATEGORIES) + [""])
    node = serializers.CharField()
    source = serializers.CharField()
    trace_id = serializers.CharField()
    span_id = serializers.CharField()
    parent_span_id = serializers.CharField()
    seat = serializers.CharField()
    turn_id = serializers.CharField()
    conversation_key = serializers.CharField()
    partition_key = serializers.CharField()
    actor_seat = serializers.CharField()
    tool = serializers.CharField()
    dir = serializers.CharField()
    delegation_depth = serializers.IntegerField()
    parent_turn_id = serializers.CharField()
    failed = serializers.BooleanField()
    actor = serializers.CharField()
    summary = serializers.CharField()


class EventPageSerializer(AnswerSerializer):
    events = EventRowSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="pass as cursor for the next (older) page; null at the end")


class EventDetailRowSerializer(EventRowSerializer):
    wire = serializers.DictField(help_text="the whole event exactly as it was published")
    provider_body = serializers.CharField(required=False, help_text="inbound deliveries: the provider's exact bytes")
    provider_body_encoding = serializers.CharField(required=False, help_text='"" (UTF-8 text) or "base64"')


class EventDetailSerializer(AnswerSerializer):
    event = EventDetailRowSerializer()


class SeriesBarSerializer(serializers.Serializer):
    start = serializers.CharField()
    end = serializers.CharField(help_text="the bar's end, cut at the asker's instant for the last bar")
    total = serializers.IntegerField()
    failed = serializers.IntegerField()
    by_category = serializers.DictField(child=serializers.IntegerField())


class SeriesSerializer(AnswerSerializer):
    bars = SeriesBarSerializer(many=True)
    window = serializers.CharField()
    bucket = serializers.CharField()


class SpanSerializer(serializers.Serializer):
    span_id = serializers.CharField()
    parent_span_id = serializers.CharField()
    events = EventRowSerializer(many=True)
    children = serializers.ListField(child=serializers.DictField(), help_text="spans, recursively")


class TraceSerializer(AnswerSerializer):
    trace_id = serializers.CharField()
    total = serializers.IntegerField()
    truncated = serializers.BooleanField()
    spans = SpanSerializer(many=True, help_text="root spans")


class TriggerSerializer(serializers.Serializer):
    type = serializers.CharField()
    event_id = serializers.CharField()


class TokensSerializer(serializers.Serializer):
    input = serializers.IntegerField()
    output = serializers.IntegerField()
    total = serializers.IntegerField()


class TurnSerializer(serializers.Serializer):
    turn_id = serializers.CharField()
    seat = serializers.CharField()
    nodes = serializers.ListField(child=serializers.CharField())
    conversation_key = serializers.CharField()
    trace_id = serializers.CharField()
    trigger = TriggerSerializer(allow_null=True)
    work_item = serializers.DictField(allow_null=True)
    started = serializers.CharField(allow_null=True)
    ended = serializers.CharField(allow_null=True)
    duration_ms = serializers.IntegerField(allow_null=True)
    outcome = serializers.ChoiceField(choices=list(TURN_OUTCOMES))
    segments = serializers.IntegerField()
    phases = serializers.IntegerField()
    tokens = TokensSerializer()


class TurnListedSerializer(TurnSerializer):
    listed_at = serializers.CharField(help_text="where the page lists the turn: its earliest start passing the filters")


class TurnPageSerializer(AnswerSerializer):
    turns = TurnListedSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class TurnDetailRowSerializer(TurnSerializer):
    events = EventRowSerializer(many=True)
    truncated = serializers.BooleanField()


class TurnDetailSerializer(AnswerSerializer):
    turn = TurnDetailRowSerializer()


class DeliveryAcceptedSerializer(serializers.Serializer):
    event_id = serializers.CharField()
    timestamp = serializers.CharField()
    node = serializers.CharField()


class DeliverySkipSerializer(serializers.Serializer):
    event_id = serializers.CharField()
    timestamp = serializers.CharField()
    seat = serializers.CharField(allow_blank=True)
    recipient = serializers.CharField(allow_blank=True)
    reason = serializers.CharField(help_text="the notification_skipped reason phrase")
    detail = serializers.CharField(allow_blank=True)


class DeliveryCoalescedSerializer(serializers.Serializer):
    event_id = serializers.CharField(help_text="the notifications_coalesced record")
    timestamp = serializers.CharField()
    trigger_event_id = serializers.CharField(help_text="the merged trigger a turn names as its trigger_event_id")
    event_ids = serializers.ListField(child=serializers.CharField(), help_text="the wakes merged, this seat's among them")
    count = serializers.IntegerField()


class DeliveryTriggerSkipSerializer(serializers.Serializer):
    event_id = serializers.CharField()
    reason = serializers.CharField(help_text="the turn_trigger_skipped reason")
    detail = serializers.CharField(allow_blank=True)


class DeliveryHoldSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="pause, budget, no_provider, sandbox (a coding run holds the seat) or running_turn")
    reason = serializers.CharField(allow_blank=True)
    by = serializers.CharField(allow_blank=True, help_text="who paused it, or the running turn's id")


class DeliveryRetrySerializer(serializers.Serializer):
    event_id = serializers.CharField(help_text="the message_retry_scheduled row")
    delivery = serializers.IntegerField(help_text="the deliveries it spent, the failed one included")
    max_deliveries = serializers.IntegerField(help_text="the budget: its last failure dead-letters it")
    retry_at = serializers.CharField(help_text="when the broker offers it again, behind the mail waiting then")


class DeliveryWaitingSerializer(serializers.Serializer):
    seat_state = serializers.CharField(allow_blank=True, help_text="the seat's live state (empty where no live projection runs)")
    held_by = DeliveryHoldSerializer(allow_null=True)
    behind_turn = serializers.CharField(allow_null=True)
    position = serializers.IntegerField(allow_null=True, help_text="1-based place among the seat's waiting wakes, where known")
    queued = serializers.IntegerField(allow_null=True)
    retry = DeliveryRetrySerializer(allow_null=True, help_text="set when a failed attempt handed it back to come again")


class DeliveryDeadLetterSerializer(serializers.Serializer):
    ref = serializers.CharField()
    topic = serializers.CharField()
    deliveries = serializers.IntegerField()


class DeliverySeatSerializer(serializers.Serializer):
    seat = serializers.CharField()
    state = serializers.CharField(help_text="waiting, coalesced, running, worked, skipped or dead_lettered")
    wake_event_id = serializers.CharField()
    routed_at = serializers.CharField()
    node = serializers.CharField(allow_blank=True)
    why = serializers.CharField(allow_blank=True)
    coalesced = DeliveryCoalescedSerializer(allow_null=True)
    turn = TurnSerializer(allow_null=True, help_text="the turn that took it (the wake or its digest), folded")
    skip = DeliveryTriggerSkipSerializer(allow_null=True)
    waiting = DeliveryWaitingSerializer(allow_null=True)
    dead_letter = DeliveryDeadLetterSerializer(allow_null=True)


class DeliveryRowSerializer(serializers.Serializer):
    delivery_id = serializers.CharField()
    state = serializers.CharField(help_text="the least settled seat's state; skipped when every recipient was skipped; accepted before routing")
    source = serializers.CharField()
    event_name = serializers.CharField(allow_blank=True)
    trace_id = serializers.CharField()
    accepted = DeliveryAcceptedSerializer(allow_null=True)
    seats = DeliverySeatSerializer(many=True)
    skipped = DeliverySkipSerializer(many=True)
    events = EventRowSerializer(many=True)
    dead_letters_checked = serializers.BooleanField(help_text="whether the dead letters were looked through for its wakes")


class DeliverySerializer(AnswerSerializer):
    delivery = DeliveryRowSerializer()
