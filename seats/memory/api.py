"""``/api/seats/{handle}/memory``: a seat's memory as CREWLET_MEMORY holds it, and an operator forgetting a row.

Read from the stream itself (one replay of the seat's subjects on the
engine's loop), so any node answers the same, whichever holds the seat. A
delete publishes the row's tombstone (``written_by: operator``) — the holding
node applies it as it follows the stream — and is audited as one
``operator_acted`` naming the caller, whatever became of it.
"""
from __future__ import annotations

import logging
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from crewlet.engine import runtime
from crewlet.events.tracing import trace_of
from crewlet.events.types import OperatorActed
from crewlet.http.auth import actor_of
from crewlet.http.bodies import error_response, error_responses
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from seats.api import _seat_or_error
from seats.memory.rows import BY_OPERATOR, RowRefused, checked_key, checked_table, from_event, written

log = logging.getLogger("crewlet.seats.memory")

#: How long a read or a forget waits for the engine's loop.
MEMORY_TIMEOUT_S = 10.0
#: Rows one listing answers with, at most.
LIST_LIMIT_MAX = 1000
#: The audited operator action's name, and what became of it.
FORGET_ACTION = "seat_memory_forget"
OUTCOME_FORGOTTEN = "forgotten"
OUTCOME_ABSENT = "absent"
TRANSPORT_API = "api"


class MemoryRowSerializer(serializers.Serializer):
    table = serializers.CharField()
    key = serializers.CharField()
    value = serializers.JSONField()
    written_at = serializers.CharField()
    written_by = serializers.CharField(allow_blank=True)
    turn_id = serializers.CharField(allow_blank=True)


class MemoryListSerializer(serializers.Serializer):
    seat = serializers.CharField()
    rows = MemoryRowSerializer(many=True)


class ForgetSerializer(serializers.Serializer):
    forgotten = serializers.BooleanField(help_text="false when the row was not there (a tombstone is written either way)")
    table = serializers.CharField()
    key = serializers.CharField()


async def read_rows(queue: EventQueue, handle: str, table: str = "") -> list[dict[str, Any]]:
    """The seat's live rows on the stream, newest first (of one table when ``table`` is given)."""
    rows = []
    for _, event in await queue.read_last(topics.memory_pattern(handle)):
        write = from_event(event)
        if write is None or write.deleted or (table and write.table != table):
            continue
        rows.append(
            {
                "table": write.table, "key": write.key, "value": write.data,
                "written_at": write.written_at.isoformat().replace("+00:00", "Z"),
                "written_by": write.written_by, "turn_id": write.turn_id,
            }
        )
    rows.sort(key=lambda r: r["written_at"], reverse=True)
    return rows


async def forget(queue: EventQueue, handle: str, table: str, key: str, actor: str) -> bool:
    """Write the row's tombstone and audit it; whether the row was there."""
    was_there = any(r["key"] == key for r in await read_rows(queue, handle, table))
    await written(queue, handle, table, key, deleted=True, written_by=BY_OPERATOR)
    body = OperatorActed(
        token=actor, tool=FORGET_ACTION, transport=TRANSPORT_API,
        outcome=OUTCOME_FORGOTTEN if was_there else OUTCOME_ABSENT, position=topics.memory(handle, table, key),
    )
    await runtime.emitter_for(queue).emit(
        body, trace_of(), source="operator", log_event="operator_acted_publish_failed", level=logging.ERROR,
        tool=FORGET_ACTION, actor=actor, outcome=body.outcome,
    )
    log.info("seat_memory_forgotten", extra={"seat": handle, "table": table, "actor": actor, "was_there": was_there})
    return was_there


def _param(request: Request, name: str, required: bool) -> str:
    value = request.query_params.get(name, "")
    if required or value:
        (checked_table if name == "table" else checked_key)(value)
    return value


class SeatMemoryView(APIView):
    @extend_schema(
        operation_id="seats_memory_list",
        summary="A seat's memory rows, newest first (optionally of one table)",
        parameters=[
            OpenApiParameter("table", str, description="only this table's rows"),
            OpenApiParameter("limit", int, description=f"at most this many rows (1-{LIST_LIMIT_MAX}, default 100)"),
        ],
        responses={200: MemoryListSerializer, **error_responses(400, 401, 404, 409, 503)},
    )
    def get(self, request: Request, handle: str) -> Response:
        _, error = _seat_or_error(handle)
        if error is not None:
            return error
        try:
            table = _param(request, "table", False)
        except RowRefused as exc:
            return error_response(status.HTTP_400_BAD_REQUEST, str(exc), param="table")
        raw = request.query_params.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= LIST_LIMIT_MAX:
            return error_response(
                status.HTTP_400_BAD_REQUEST, f"limit={raw[:20]!r}: must be a whole number from 1 to {LIST_LIMIT_MAX}", param="limit"
            )
        rows = runtime.on_engine(lambda q: read_rows(q, handle, table), MEMORY_TIMEOUT_S)
        return Response({"seat": handle, "rows": rows[: int(raw)]})

    @extend_schema(
        operation_id="seats_memory_forget",
        summary="Forget one row of a seat's memory (an audited operator action)",
        parameters=[OpenApiParameter("table", str, required=True), OpenApiParameter("key", str, required=True)],
        responses={200: ForgetSerializer, **error_responses(400, 401, 404, 409, 503)},
    )
    def delete(self, request: Request, handle: str) -> Response:
        _, error = _seat_or_error(handle)
        if error is not None:
            return error
        for name in ("table", "key"):
            try:
                _param(request, name, True)
            except RowRefused as exc:
                return error_response(status.HTTP_400_BAD_REQUEST, str(exc), param=name)
        table, key = request.query_params["table"], request.query_params["key"]
        actor = actor_of(request)
        forgotten = runtime.on_engine(lambda q: forget(q, handle, table, key, actor), MEMORY_TIMEOUT_S)
        return Response({"forgotten": forgotten, "table": table, "key": key})


__all__ = ["FORGET_ACTION", "SeatMemoryView", "forget", "read_rows"]
