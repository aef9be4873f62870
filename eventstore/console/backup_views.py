"""``POST /backup {dir}``: a consistent copy of this node's streams and stores into a directory on its disk.

Same credentials as ``/operator/act`` (an operator token, or a staff session
with its CSRF token; 401 otherwise). A bad body or directory is a 400 naming
the field, before anything is written; once copying began, one
``backup_requested`` (dir, finished, streams) records the outcome. The work is
:func:`eventstore.backups.run_backup`.
"""
from __future__ import annotations

import logging

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from crewlet.engine import runtime
from crewlet.http.auth import actor_of
from crewlet.http.bodies import bad_request_body, error_response, error_responses
from eventstore import backups

log = logging.getLogger("crewlet.eventstore.backups")

#: How long one backup may take before the request gives up on it (its copy still records what became of it).
BACKUP_TIMEOUT_S = 600.0
K_DIR = "dir"
K_STREAMS = "streams"
K_STORES = "stores"
K_FINISHED = "finished"
#: The ``error`` of a 400 about the body and of a 500 about a copy that did not finish.
ERROR_BAD_ARGS = "bad_args"
ERROR_BACKUP_FAILED = "backup_failed"


class BackupRequestSerializer(serializers.Serializer):
    dir = serializers.RegexField(r"^/", help_text="an absolute path on the node's disk: a new or empty directory")


class BackupResultSerializer(serializers.Serializer):
    dir = serializers.CharField()
    finished = serializers.BooleanField()
    streams = serializers.ListField(child=serializers.CharField())
    stores = serializers.ListField(child=serializers.CharField())


class BackupView(APIView):
    @extend_schema(
        operation_id="backup",
        summary="Copy this node's streams (JetStream snapshots) and stores into a directory; recorded as backup_requested",
        request=BackupRequestSerializer,
        responses={200: BackupResultSerializer, **error_responses(400, 401, 500, 503)},
    )
    def post(self, request: Request) -> Response:
        body = request.data  # the parser lets only a depth-limited JSON object through
        unknown = sorted(str(key) for key in body if key != K_DIR)
        if unknown:
            return Response(
                bad_request_body(ERROR_BAD_ARGS, unknown[0], f"unknown field; this takes: {K_DIR}"),
                status=status.HTTP_400_BAD_REQUEST,
            )
        try:
            result = backups.run_backup(body.get(K_DIR), actor_of(request), BACKUP_TIMEOUT_S)
        except backups.BackupRefused as exc:
            return Response(bad_request_body(ERROR_BAD_ARGS, exc.field, str(exc)), status=status.HTTP_400_BAD_REQUEST)
        except backups.BackupFailed as exc:
            if isinstance(exc.__cause__, runtime.EngineAway):
                return error_response(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc), param=K_DIR)
            return error_response(status.HTTP_500_INTERNAL_SERVER_ERROR, str(exc), error=ERROR_BACKUP_FAILED, param=K_DIR)
        return Response(
            {K_DIR: str(result.dir), K_FINISHED: True, K_STREAMS: result.streams, K_STORES: result.stores}
        )


__all__ = ["BackupView"]
