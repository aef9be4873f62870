"""``/api/sandbox/``: the company's coding runs, and an operator's answer to a run that asked a question.

Same credentials as the rest of ``/api/`` (an operator token or a staff
session). Runs are read from the coordination store, where every node keeps
them. An answer is not applied here: it travels to the seat's inbox as the
``sandbox_answer_given`` wake (never a turn), so it reaches the node holding
the seat and waits, like the seat's other mail, while another run holds it;
what it became is recorded as ``sandbox_run_answered``
(:mod:`seats.sandbox.answers`). 202 once the broker has it; 503 when it is
unreachable, so the caller tries again.
"""
from __future__ import annotations

import logging
import uuid
from typing import Optional

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from crewlet.company.org import HANDLE_PATTERN
from crewlet.engine import runtime
from crewlet.events import new
from crewlet.events.tracing import trace_of
from crewlet.events.types import SandboxAnswerGiven
from crewlet.http.auth import actor_of
from crewlet.http.bodies import ClosedSerializer, StrictCharField, Unavailable, error_response, error_responses
from crewlet.queue import topics
from crewlet.queue.errors import QueueError
from seats.sandbox import runs

log = logging.getLogger("crewlet.seats.sandbox")

P_RUN = "run_id"
P_SEAT = "seat"
P_LIMIT = "limit"
LIMIT_RANGE = (1, 500)
ANSWER_MAX_CHARS = 20000
#: The answer's publish waits this long for the engine's loop.
PUBLISH_TIMEOUT_S = 10.0


class RunsQuerySerializer(serializers.Serializer):
    seat = serializers.RegexField(f"^{HANDLE_PATTERN}$", required=False, help_text="only this seat's runs")
    limit = serializers.IntegerField(
        required=False, default=50, min_value=LIMIT_RANGE[0], max_value=LIMIT_RANGE[1], help_text="at most this many"
    )


class RunSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    seat = serializers.CharField()
    status = serializers.CharField(help_text="running | parked (asked a question; holds nothing) | answered | ended")
    holds = serializers.BooleanField(help_text="the run holds its seat's inbox: the seat's mail waits on the broker")
    task = serializers.CharField()
    work_key = serializers.CharField(help_text="the conversation the run was launched from")
    turn_id = serializers.CharField()
    node = serializers.CharField(help_text="the node its job runs on")
    attempt = serializers.IntegerField()
    question = serializers.CharField(allow_blank=True)
    asked_at = serializers.DateTimeField(allow_null=True)
    answered_by = serializers.CharField(allow_blank=True)
    answer_route = serializers.CharField(allow_blank=True)
    outcome = serializers.CharField(allow_blank=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    result = serializers.DictField()
    created_at = serializers.DateTimeField(allow_null=True)


class RunListSerializer(serializers.Serializer):
    runs = RunSerializer(many=True)


class AnswerRequestSerializer(ClosedSerializer):
    answer = StrictCharField(allow_blank=False, max_length=ANSWER_MAX_CHARS)


class AnswerAcceptedSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    seat = serializers.CharField()
    request_id = serializers.CharField(help_text="sandbox_run_answered names what became of it")


class RunsView(APIView):
    @extend_schema(
        operation_id="sandbox_runs",
        summary="The company's coding runs, newest first",
        parameters=[RunsQuerySerializer],
        responses={200: RunListSerializer, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        query = RunsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        found = runs.listing(query.validated_data.get(P_SEAT, ""), query.validated_data[P_LIMIT])
        return Response({"runs": [run.as_dict() for run in found]})


def _run(run_id: str) -> Optional[runs.Run]:
    """The run ``run_id`` names; None for none (a malformed id names none: no store read)."""
    return runs.get(run_id) if runs.RUN_ID.fullmatch(run_id) else None


def _no_run(run_id: str) -> Response:
    return error_response(status.HTTP_404_NOT_FOUND, f"no coding run {run_id[:80]!r}", param=P_RUN)


class RunView(APIView):
    @extend_schema(operation_id="sandbox_run", summary="One coding run", responses={200: RunSerializer, **error_responses(401, 404)})
    def get(self, request: Request, run_id: str) -> Response:
        run = _run(run_id)
        return Response(run.as_dict()) if run is not None else _no_run(run_id)


class RunAnswerView(APIView):
    @extend_schema(
        operation_id="sandbox_run_answer",
        summary="Answer a run's question (as the sandbox_answer_given inbox wake; never a turn)",
        request=AnswerRequestSerializer,
        responses={202: AnswerAcceptedSerializer, **error_responses(400, 401, 404, 503)},
    )
    def post(self, request: Request, run_id: str) -> Response:
        body = AnswerRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = _run(run_id)
        if run is None:
            return _no_run(run_id)
        request_id = str(uuid.uuid4())
        event = new(
            SandboxAnswerGiven(
                seat=run.seat, run_id=run.run_id, work_key=run.work_key, turn_id=run.turn_id,
                answer=body.validated_data["answer"], answered_by=actor_of(request), request_id=request_id,
            ),
            trace_of(),
        )
        try:
            runtime.on_engine(lambda queue: queue.publish(topics.agent_inbox(run.seat), event), PUBLISH_TIMEOUT_S)
        except QueueError as exc:
            raise Unavailable(f"the broker did not take the answer ({type(exc).__name__}); try again") from None
        log.info("sandbox_answer_sent", extra={"seat": run.seat, "run_id": run.run_id, "request_id": request_id})
        return Response({"run_id": run.run_id, "seat": run.seat, "request_id": request_id}, status=status.HTTP_202_ACCEPTED)


__all__ = ["RunAnswerView", "RunView", "RunsView"]
