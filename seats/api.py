"""``/api/seats/``: the company's seats, a person pausing or resuming one, and a person's note to its running turn (``steer``: :mod:`seats.steering`).

Same credentials as the rest of ``/api/`` (an operator token or a staff
session; 401 otherwise). The views are thin: the change itself is
:func:`seats.actions.pause_seat` / :func:`seats.actions.resume_seat`, the
compare-and-set whose winner alone publishes ``seat_paused`` /
``seat_resumed`` — so ``changed`` is false for a second click and nothing is
announced twice.

Which company: the one the engine running in this process serves
(:func:`crewlet.engine.runtime.company`, read per request); a process with no
engine answers 503 saying so rather than show some other company (its
``EngineAway``, which the API's exception handler answers). A
mailbox's depth is read through the engine's queue on its loop; when that
cannot be asked (or does not answer in time) it is ``null``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Optional

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from crewlet.engine import runtime
from crewlet.http.auth import actor_of
from crewlet.http.bodies import (
    ClosedSerializer,
    StrictBooleanField,
    StrictCharField,
    error_response,
    error_responses,
)
from crewlet.fleet import leases
from crewlet.fleet.leases import SEAT
from crewlet.company.org import Organization, Seat
from crewlet.queue import topics
from seats import actions, steering
from seats.actions import SeatNotFound
from seats.delivery_models import SeatPause

log = logging.getLogger("crewlet.seats.api")

#: How long a list waits for the engine's loop to answer the mailbox depths.
DEPTH_TIMEOUT_S = 2.0
#: The path parameter a 400 about the seat names.
P_HANDLE = "handle"
#: Why a pause or resume is answered 503 where no seat runtime runs to apply and announce it.
NO_SEAT_RUNTIME = "no seat runtime runs in this process to announce the change on"


# -- serializers (the schema; the answers are plain dicts) -------------------------------


class PauseFieldsSerializer(serializers.Serializer):
    """A seat's pause state as both the pause answers and the seat listing carry it."""

    paused = serializers.BooleanField()
    paused_by = serializers.CharField(allow_blank=True)
    paused_by_seat = serializers.CharField(allow_blank=True)
    reason = serializers.CharField(allow_blank=True)
    stop_running = serializers.BooleanField()
    paused_at = serializers.DateTimeField(allow_null=True)


class PauseStateSerializer(PauseFieldsSerializer):
    version = serializers.IntegerField()


class SeatSerializer(PauseFieldsSerializer):
    handle = serializers.CharField()
    kind = serializers.CharField()
    role = serializers.CharField(allow_blank=True)
    display_name = serializers.CharField(allow_blank=True)
    agent_id = serializers.CharField()
    depth = serializers.IntegerField(allow_null=True, help_text="mail waiting in the seat's inbox; null when unknown")
    node = serializers.CharField(
        allow_null=True, allow_blank=True,
        help_text="the node whose seat lease runs the seat now; empty when none does, null for a person",
    )


class SeatListSerializer(serializers.Serializer):
    org = serializers.CharField()
    seats = SeatSerializer(many=True)


class PauseRequestSerializer(ClosedSerializer):
    reason = StrictCharField(required=False, allow_blank=True, default="", max_length=2000)
    stop_running = StrictBooleanField(required=False, default=False)


class ChangeSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="true only for the call whose compare-and-set made the change")
    state = PauseStateSerializer()


class SteerRequestSerializer(ClosedSerializer):
    note = StrictCharField(allow_blank=False, max_length=steering.NOTE_MAX_CHARS)


class SteerAcceptedSerializer(serializers.Serializer):
    seat = serializers.CharField()
    note_id = serializers.CharField(help_text="the request's id: agent_turn_steered carries it as note_id")
    node = serializers.CharField(help_text="the node running the seat's turn, which records what became of the note")
    turn_id = serializers.CharField(help_text="the running turn the note waits in, for its next round")


_ERRORS = error_responses(400, 401, 404, 409, 503)


# -- helpers ------------------------------------------------------------------------------


def company() -> Organization:
    """The company the running engine serves; :class:`~crewlet.engine.runtime.EngineAway` in a process without one."""
    return runtime.company()


def depths(handles: list[str]) -> dict[str, Optional[int]]:
    """Each agent seat's inbox depth read on the engine's loop; None for all when it cannot be asked."""
    if not handles:
        return {}

    async def ask(queue: Any) -> list[Any]:
        return await asyncio.gather(
            *(queue.backlog(topics.agent_inbox(h), topics.agent_inbox_group(h)) for h in handles),
            return_exceptions=True,
        )

    try:
        answers = runtime.on_engine(ask, DEPTH_TIMEOUT_S)
    except Exception:
        log.warning("seat_depth_unavailable", exc_info=True)
        return {h: None for h in handles}
    return {h: (a if isinstance(a, int) else None) for h, a in zip(handles, answers)}


def state(row: Optional[SeatPause]) -> dict[str, Any]:
    if row is None:
        return {
            "paused": False,
            "paused_by": "",
            "paused_by_seat": "",
            "reason": "",
            "stop_running": False,
            "paused_at": None,
            "version": 0,
        }
    return {
        "paused": row.paused,
        "paused_by": row.paused_by,
        "paused_by_seat": row.paused_by_seat,
        "reason": row.reason,
        "stop_running": row.stop_running,
        "paused_at": row.paused_at.isoformat().replace("+00:00", "Z") if row.paused_at else None,
        "version": row.version,
    }


def _seat_or_error(handle: str) -> tuple[Optional[Seat], Optional[Response]]:
    seat = company().seat_by_handle(handle)
    if seat is None:
        return None, error_response(status.HTTP_404_NOT_FOUND, f"no seat {handle!r} in the company", param=P_HANDLE)
    if not seat.is_agent:
        # The handle is well formed and names a seat, whose kind has no inbox to hold: a conflict with its state.
        return None, error_response(
            status.HTTP_409_CONFLICT, f"seat {handle!r} is a human seat: it has no inbox to hold", param=P_HANDLE
        )
    return seat, None


# -- views ----------------------------------------------------------------------------------


class SeatsView(APIView):
    """The company's seats with their pause, their mailbox depth and the node running each."""

    @extend_schema(
        operation_id="seats_list",
        summary="Every seat of the company, its pause and its mailbox depth",
        responses={200: SeatListSerializer, **error_responses(401, 503)},
    )
    def get(self, request: Request) -> Response:
        org = company()
        rows = actions.pause_states([s.handle for s in org.seats])
        depth = depths([s.handle for s in org.agent_seats()])
        running_on = leases.holders(SEAT, names=[s.handle for s in org.agent_seats()])
        seats = []
        for seat in org.seats:
            pause = state(rows.get(seat.handle))
            pause.pop("version")
            seats.append(
                {
                    "handle": seat.handle,
                    "kind": seat.kind,
                    "role": seat.role,
                    "display_name": seat.display_name,
                    "agent_id": seat.agent_id,
                    **pause,
                    "depth": depth.get(seat.handle) if seat.is_agent else None,
                    "node": running_on.get(seat.handle, "") if seat.is_agent else None,
                }
            )
        return Response({"org": org.org, "seats": seats})


def _change_schema(operation_id: str, summary: str, request: Any) -> Callable[[Any], Any]:
    """The OpenAPI description every pause/resume route shares: a change answered with the state now."""
    return extend_schema(
        operation_id=operation_id, summary=summary, request=request, responses={200: ChangeSerializer, **_ERRORS}
    )


def _change(handle: str, verb: str, change: Callable[[], bool]) -> Response:
    """Run a pause/resume compare-and-set for a request and answer with what it did and the state now.

    The seat is checked first (404 for an unknown handle, 409 for a human seat),
    then that a seat runtime runs here to apply the change (503 otherwise, as
    the ``EngineAway`` the API's exception handler answers).
    """
    _, error = _seat_or_error(handle)
    if error is not None:
        return error
    if not actions.seat_runtime_here():
        raise runtime.EngineAway(runtime.MISSING_SERVICE, NO_SEAT_RUNTIME)
    try:
        changed = change()
    except SeatNotFound as exc:
        return error_response(status.HTTP_404_NOT_FOUND, str(exc), param=P_HANDLE)
    except RuntimeError as exc:  # EngineAway among them: the runtime went, or this thread cannot wait for it
        log.warning(f"seat_{verb}_refused", extra={"seat": handle, "error": str(exc)})
        raise runtime.EngineAway(runtime.MISSING_SERVICE, NO_SEAT_RUNTIME) from exc
    return Response({"changed": changed, "state": state(actions.pause_states([handle]).get(handle))})


class SeatPauseView(APIView):
    @_change_schema(
        "seats_pause", "Pause a seat: hold its inbox (optionally stopping the running turn)", PauseRequestSerializer
    )
    def post(self, request: Request, handle: str) -> Response:
        body = PauseRequestSerializer(data=request.data)  # the parser let only a JSON object through
        body.is_valid(raise_exception=True)
        reason, stop_running = body.validated_data["reason"], body.validated_data["stop_running"]
        return _change(handle, "pause", lambda: actions.pause_seat(handle, actor_of(request), reason, stop_running))


class SeatResumeView(APIView):
    @_change_schema("seats_resume", "Resume a paused seat: release the hold on its inbox", None)
    def post(self, request: Request, handle: str) -> Response:
        _ = request.data  # no body is needed, but one that is sent must be a JSON object (the parser refuses it)
        return _change(handle, "resume", lambda: actions.resume_seat(handle, actor_of(request)))


class SeatSteerView(APIView):
    @extend_schema(
        operation_id="seats_steer",
        summary="Send a note to the seat's running turn, read at its next round (agent_turn_steered)",
        request=SteerRequestSerializer,
        responses={202: SteerAcceptedSerializer, **_ERRORS},
    )
    def post(self, request: Request, handle: str) -> Response:
        """202 once the node running the seat's turn holds the note; 409 when no turn of the seat runs (nothing recorded)."""
        body = SteerRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        _, error = _seat_or_error(handle)
        if error is not None:
            return error
        answer = steering.steer(handle, body.validated_data["note"], by=actor_of(request))
        if not answer.accepted:
            return error_response(status.HTTP_409_CONFLICT, answer.reason, param=P_HANDLE, note_id=answer.note_id)
        return Response(
            {"seat": handle, "note_id": answer.note_id, "node": answer.node, "turn_id": answer.turn_id},
            status=status.HTTP_202_ACCEPTED,
        )


__all__ = ["NO_SEAT_RUNTIME", "SeatSteerView", "SeatPauseView", "SeatResumeView", "SeatsView", "company", "depths"]
