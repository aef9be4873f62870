"""``GET /api/dead-letters`` filtered, ``GET /api/dead-letters/preview`` and ``POST /operator/dead-letters/replay``.

The reads take the filter as query parameters (``source``, ``seat``,
``reason``, ``older_than``, ``newer_than``) beside ``limit``; an unknown or
bad one is a 400 naming it (``bad_parameter``). The bulk replay takes the same
filter as a body's ``filter`` object, optionally narrowed to the ``refs`` a
preview listed, so a letter buried after the preview is not swept along. It
replays each matching letter through :func:`eventstore.actions.replay_dead_letter`:
one ``operator_acted`` per letter (tool ``dead_letter_replay``, transport
``act``), every one carrying the bulk call's request id. A bulk call refused
before any letter is tried is audited once, as tool ``dead_letter_replay_bulk``.
A bulk call that matches nothing replays nothing and publishes nothing.
"""
from __future__ import annotations

import logging
import re
import uuid
from typing import Any, Optional, Union

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from crewlet.engine import runtime
from crewlet.events.types import DEAD_LETTER_REASONS
from crewlet.queue.contract import DEAD_LETTER_REF_RULE
from crewlet.http.auth import actor_of
from crewlet.http.bodies import BadBody, ClosedSerializer, StrictCharField, bad_request_body, error_responses
from eventstore import actions as ops
from eventstore import here
from eventstore.api import BadParameter, check_params
from eventstore.console import operator_views as opv
from eventstore.console import replay as rp
from eventstore.questions.timefmt import DURATION_PATTERN

log = logging.getLogger("crewlet.eventstore.replay")

#: The tool a bulk call's own audit row names (only when it is refused before any letter is tried).
TOOL_BULK_REPLAY = "dead_letter_replay_bulk"
#: The most letters one bulk call replays; the answer says ``more`` when the filter matched more.
MAX_BULK = opv.MAX_LIMIT
#: How long a bulk call waits for the engine per letter it replays, on top of one read's wait.
PER_LETTER_TIMEOUT_S = 2.0

# JSON keys (the dashboard's script reads them).
K_FILTER = "filter"
K_REFS = "refs"
K_MATCHED = "matched"
K_SCANNED = "scanned"
K_REPLAYED = "replayed"
K_NOT_REPLAYED = "not_replayed"
K_MORE = "more"
K_ERROR = "error"
K_REASON = "reason"
BULK_KEYS = (K_FILTER, K_REFS, opv.K_REQUEST_ID)
READ_PARAMS = frozenset({*rp.FILTER_KEYS, opv.P_LIMIT})

_FILTER_PARAMETERS = [
    OpenApiParameter(
        rp.F_SOURCE, {"type": "string", "pattern": f"^{rp.SOURCE_PATTERN}$"}, OpenApiParameter.QUERY, required=False,
        description="the event's source (slack, jira, ...)",
    ),
    OpenApiParameter(
        rp.F_SEAT, {"type": "string", "pattern": f"^{rp.SEAT_PATTERN}$"}, OpenApiParameter.QUERY, required=False,
        description="the seat whose inbox it came from",
    ),
    OpenApiParameter(rp.F_REASON, str, OpenApiParameter.QUERY, required=False, enum=list(DEAD_LETTER_REASONS)),
    OpenApiParameter(
        rp.F_OLDER_THAN, {"type": "string", "pattern": DURATION_PATTERN}, OpenApiParameter.QUERY, required=False,
        description="dead-lettered at least this long ago: 15m, 1h, 7d (not longer than newer_than)",
    ),
    OpenApiParameter(
        rp.F_NEWER_THAN, {"type": "string", "pattern": DURATION_PATTERN}, OpenApiParameter.QUERY, required=False,
        description="dead-lettered at most this long ago: 15m, 1h, 7d",
    ),
    OpenApiParameter(
        opv.P_LIMIT, {"type": "integer", "minimum": 1, "maximum": opv.MAX_LIMIT, "default": opv.DEFAULT_LIMIT},
        OpenApiParameter.QUERY, required=False,
    ),
]


class FilterSerializer(ClosedSerializer):
    source = StrictCharField(required=False, pattern=rp.SOURCE_PATTERN, pattern_says="must be a source name")
    seat = StrictCharField(required=False, pattern=rp.SEAT_PATTERN, pattern_says="must be a seat handle")
    reason = serializers.ChoiceField(choices=list(DEAD_LETTER_REASONS), required=False)
    older_than = StrictCharField(required=False, pattern=DURATION_PATTERN.strip("^$"), pattern_says="a duration: 15m, 1h, 7d")
    newer_than = StrictCharField(required=False, pattern=DURATION_PATTERN.strip("^$"), pattern_says="a duration: 15m, 1h, 7d")


class BulkReplaySerializer(ClosedSerializer):
    filter = FilterSerializer(help_text="which letters; {} is every one")
    refs = serializers.ListField(
        child=StrictCharField(pattern=opv.REF_PATTERN, pattern_says="digits"), required=False, min_length=1, max_length=MAX_BULK
    )
    request_id = StrictCharField(required=False, allow_blank=True, max_length=opv.MAX_REQUEST_ID)


class ReplayTriggerSerializer(serializers.Serializer):
    trigger = serializers.CharField()
    worked_by = serializers.CharField(allow_blank=True, help_text="the turn that worked it, '' when none did")
    in_thread = serializers.BooleanField()
    will = serializers.ChoiceField(choices=[rp.WILL_RUN, rp.WILL_SKIP])


class PreviewRowSerializer(opv.DeadLetterSerializer):
    reason = serializers.CharField()
    source = serializers.CharField(allow_blank=True)
    age_s = serializers.FloatField(allow_null=True)
    triggers = ReplayTriggerSerializer(many=True)
    will = serializers.ChoiceField(choices=[rp.WILL_RUN, rp.WILL_SKIP, rp.WILL_BURY_AGAIN])


class PreviewSerializer(serializers.Serializer):
    dead_letters = PreviewRowSerializer(many=True)
    matched = serializers.IntegerField()
    scanned = serializers.IntegerField()


class BulkResultSerializer(serializers.Serializer):
    request_id = serializers.CharField()
    matched = serializers.IntegerField()
    replayed = serializers.ListField(child=serializers.DictField())
    not_replayed = serializers.ListField(child=serializers.DictField())
    more = serializers.BooleanField()


def _filter_from_query(request: Request) -> rp.LetterFilter:
    check_params(request.query_params, READ_PARAMS)
    try:
        return rp.parse_filter({k: v for k, v in request.query_params.items() if k in rp.FILTER_KEYS})
    except rp.BadFilter as exc:
        raise BadParameter(exc.param, exc.reason) from None


def _scan(limit: int = rp.SCAN_MAX) -> Any:
    """The first ``limit`` dead letters, oldest first; None (logged) when the broker could not be asked."""
    try:
        return runtime.on_engine(lambda queue: queue.dead_letters(limit), opv.QUEUE_TIMEOUT_S)
    except runtime.EngineAway:
        raise
    except Exception as exc:  # Unavailable from the broker, or NotLive while stopping
        log.warning("dead_letters_read_failed", extra={"error": repr(exc)})
        return None


_UNREADABLE = "the broker could not be reached to list the dead letters; try again"


def _read(request: Request, *, preview: bool) -> Union[Response, tuple[list[rp.Facts], int, int]]:
    """A read's letters: (the first ``limit`` matching, how many matched, how many were scanned), or its 503.

    An unfiltered list reads only ``limit`` letters, as it always did; a filter or a preview scans them all.
    """
    wanted = _filter_from_query(request)
    limit = opv._limit(request)
    letters = _scan(limit if wanted.empty and not preview else rp.SCAN_MAX)
    if letters is None:
        return opv._unavailable(_UNREADABLE)
    found, matched = rp.matching(letters, wanted, here.clock(), limit)
    return found, matched, len(letters)


class FilteredDeadLettersView(APIView):
    @extend_schema(
        operation_id="dead_letters_list",
        summary="What sits on CREWLET_DLQ, oldest first, filtered by source, seat, reason and age",
        parameters=_FILTER_PARAMETERS,
        responses={200: opv.DeadLetterListSerializer, **error_responses(400, 401, 503)},
    )
    def get(self, request: Request) -> Response:
        read = _read(request, preview=False)
        if isinstance(read, Response):
            return read
        return Response({opv.K_DEAD_LETTERS: [f.answer(preview=False) for f in read[0]]})


class DeadLetterPreviewView(APIView):
    @extend_schema(
        operation_id="dead_letters_preview",
        summary="What a bulk replay of the filtered dead letters would do, from the completion ledger",
        parameters=_FILTER_PARAMETERS,
        responses={200: PreviewSerializer, **error_responses(400, 401, 503)},
    )
    def get(self, request: Request) -> Response:
        read = _read(request, preview=True)
        if isinstance(read, Response):
            return read
        found, matched, scanned = read
        rp.preview(found)
        return Response(
            {opv.K_DEAD_LETTERS: [f.answer(preview=True) for f in found], K_MATCHED: matched, K_SCANNED: scanned}
        )


class BulkReplayView(APIView):
    @extend_schema(
        operation_id="dead_letters_replay",
        summary="Replay the dead letters a filter matches (and, given refs, only those of them); one operator_acted per letter",
        request=BulkReplaySerializer,
        responses={200: BulkResultSerializer, **error_responses(400, 401, 503)},
    )
    def post(self, request: Request) -> Response:
        actor = actor_of(request)
        try:
            body = request.data
        except BadBody:
            opv.OperatorActView._audit_refusal(TOOL_BULK_REPLAY, ops.REFUSAL_BAD_ARGS, actor, "")
            raise
        request_id = body.get(opv.K_REQUEST_ID, "")
        audited_id = request_id if isinstance(request_id, str) else ""
        try:
            wanted, refs = self._parse(body)
        except rp.BadFilter as exc:
            opv.OperatorActView._audit_refusal(TOOL_BULK_REPLAY, ops.REFUSAL_BAD_ARGS, actor, audited_id[: opv.MAX_REQUEST_ID])
            return Response(bad_request_body(ops.REFUSAL_BAD_ARGS, exc.param, exc.reason), status=status.HTTP_400_BAD_REQUEST)
        request_id = audited_id or f"bulk-{uuid.uuid4()}"
        letters = _scan()
        if letters is None:
            return opv._unavailable(_UNREADABLE)
        found, matched = rp.matching(letters, wanted, here.clock(), len(letters))
        if refs is not None:
            found = [f for f in found if f.letter.ref in refs]
        more = len(found) > MAX_BULK
        found = found[:MAX_BULK]
        rp.preview(found)
        caller = ops.Caller(actor, request_id=request_id)
        refs_in_order = [f.letter.ref for f in found]
        try:
            results = runtime.on_engine(
                lambda queue: rp.replay_each(queue, refs_in_order, caller),
                opv.QUEUE_TIMEOUT_S + PER_LETTER_TIMEOUT_S * len(refs_in_order),
            )
        except runtime.EngineAway as exc:
            log.warning("operator_bulk_replay_unreachable", extra={"actor": actor, "error": str(exc)})
            raise
        replayed: list[dict[str, Any]] = []
        refused: list[dict[str, Any]] = []
        for facts, result in zip(found, results):
            if result.ok:
                replayed.append(
                    {opv.K_REF: facts.letter.ref, opv.K_TOPIC: result.topic, opv.K_EVENT_ID: result.event_id, rp.K_WILL: facts.will}
                )
            else:
                refused.append({opv.K_REF: facts.letter.ref, K_ERROR: result.refusal, K_REASON: result.detail})
        log.info(
            "operator_bulk_replay",
            extra={"actor": actor, "request_id": request_id, "replayed": len(replayed), "refused": len(refused), "matched": matched},
        )
        return Response(
            {
                opv.K_REQUEST_ID: request_id,
                K_MATCHED: len(found),
                K_REPLAYED: replayed,
                K_NOT_REPLAYED: refused,
                K_MORE: more,
            }
        )

    @staticmethod
    def _parse(body: dict[str, Any]) -> tuple[rp.LetterFilter, Optional[set[str]]]:
        """The body's filter and refs (None when not given); :class:`~eventstore.console.replay.BadFilter` naming the bad key."""
        unknown = sorted(str(key) for key in body if key not in BULK_KEYS)
        if unknown:
            raise rp.BadFilter(unknown[0][:40], f"unknown field; this takes: {', '.join(BULK_KEYS)}")
        request_id = body.get(opv.K_REQUEST_ID, "")
        if not isinstance(request_id, str) or len(request_id) > opv.MAX_REQUEST_ID:
            raise rp.BadFilter(opv.K_REQUEST_ID, f"must be a string of at most {opv.MAX_REQUEST_ID} characters")
        if K_FILTER not in body:
            raise rp.BadFilter(K_FILTER, "required: the letters to replay ({} for every one), as the preview was asked")
        given = body[K_FILTER]
        if not isinstance(given, dict):
            raise rp.BadFilter(K_FILTER, "must be an object of filters: " + ", ".join(rp.FILTER_KEYS))
        wanted = rp.parse_filter(given, where=f"{K_FILTER}.")
        if K_REFS not in body:
            return wanted, None
        refs = body[K_REFS]
        if not isinstance(refs, list) or not refs or len(refs) > MAX_BULK:
            raise rp.BadFilter(K_REFS, f"must be a list of 1 to {MAX_BULK} dead-letter refs (from the preview)")
        for i, ref in enumerate(refs):
            if not isinstance(ref, str) or not re.fullmatch(opv.REF_PATTERN, ref):
                raise rp.BadFilter(f"{K_REFS}[{i}]", f"{str(ref)[:40]!r}: {DEAD_LETTER_REF_RULE}")
        return wanted, {ref.strip() for ref in refs}  # digits naming no letter (0, replayed) narrow to nothing


__all__ = ["BulkReplayView", "DeadLetterPreviewView", "FilteredDeadLettersView", "TOOL_BULK_REPLAY"]
