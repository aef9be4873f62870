"""``/operator/mcp``: the operator's MCP server, so a person's own assistant can read and operate the company.

A streamable-HTTP endpoint of the official ``mcp`` SDK's ``MCPServer``,
mounted in front of Django by :mod:`crewlet.asgi` (the app ``manage.py up``
serves). It takes the credentials ``/api/`` and ``/operator/act`` take, as
``Authorization: Bearer <operator token>`` on every request: no token, a
malformed header or an unknown token is a 401 with a reason and the Bearer
challenge; ``CREWLET_METRICS_TOKEN`` is a 403 (it reads ``/metrics`` and
nothing else). The SDK's DNS-rebinding check is off: that protects a cookie or
a local trust, and this endpoint trusts neither — every request carries its token.

The tools run the code the HTTP routes run, never a copy of it:

* reads (``readOnlyHint``) are answered by the ``/api/`` route itself — the
  request goes in process, through Django's own ASGI handler with the caller's
  Authorization header, and the tool returns that route's JSON (a refusal is a
  tool error carrying the route's reason);
* ``seat_pause`` / ``seat_resume`` go through ``POST /api/seats/{handle}/pause``
  and ``/resume`` the same way (:func:`seats.actions.pause_seat`), and
  ``seat_steer`` through ``POST /api/seats/{handle}/steer``
  (:func:`seats.steering.steer`: the note crosses to the node running the turn);
* ``dead_letter_replay`` is :func:`eventstore.actions.replay_dead_letter`, as
  ``/operator/act`` calls it; ``revision_activate`` is
  :func:`crewlet.engine.activation.activate`, as the admin calls it.

Every acting call — done, refused or failed — is audited as exactly one
``operator_acted`` (:func:`eventstore.actions.audit`): transport ``mcp``, the
token's name as the actor, the JSON-RPC request's id, the outcome or the
refusal; never the arguments.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import quote, urlencode

import httpx
from asgiref.sync import sync_to_async
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations

from crewlet.engine import activation, runtime
from crewlet.http.auth import REALM, operator_for
from crewlet.http.bodies import K_ERROR, K_REASON
from crewlet.http.scrape import bearer_token, is_scrape_token
from crewlet.models import ConfigRevision
from eventstore import actions as ops

log = logging.getLogger("crewlet.eventstore.operator_mcp")

#: Where the endpoint is served.
MCP_PATH = "/operator/mcp"
#: The server's name, as ``initialize`` reports it.
SERVER_NAME = "crewlet-operator"
#: Where the verified token's name rides in the ASGI scope, from the gate to the tools.
SCOPE_ACTOR = "crewlet.operator_actor"
#: The caller's headers a route's answer may depend on besides its credential (TLS behind a proxy).
FORWARDED_HEADERS = ("x-forwarded-proto", "x-forwarded-for")
#: How long one tool call waits for the route or the engine it runs on.
CALL_TIMEOUT_S = 10.0

#: The acting tools (the audit's ``tool``); ``dead_letter_replay`` is the name ``/operator/act`` uses.
TOOL_SEAT_PAUSE = "seat_pause"
TOOL_SEAT_RESUME = "seat_resume"
TOOL_DEAD_LETTER_REPLAY = ops.TOOL_DEAD_LETTER_REPLAY
TOOL_REVISION_ACTIVATE = "revision_activate"
TOOL_SEAT_STEER = "seat_steer"
TOOL_SANDBOX_ANSWER = "sandbox_answer"
ACTING_TOOLS = frozenset(
    {TOOL_SEAT_PAUSE, TOOL_SEAT_RESUME, TOOL_SEAT_STEER, TOOL_DEAD_LETTER_REPLAY, TOOL_REVISION_ACTIVATE, TOOL_SANDBOX_ANSWER}
)

#: Outcomes of the acting tools besides ``/operator/act``'s: the call changed something; it was already so.
OUTCOME_CHANGED = "changed"
OUTCOME_UNCHANGED = "unchanged"
#: A steer's outcome: the node running the turn holds the note (``agent_turn_steered`` says whether a round read it).
OUTCOME_ACCEPTED = "accepted"
#: The largest revision number (the key is a 64-bit integer).
MAX_REVISION = 2**63 - 1
#: Refusal of an activation naming no stored revision.
REFUSAL_NO_REVISION = "no_revision"

#: Why a request is refused at the gate (the 401/403's ``detail``).
METRICS_ONLY = "the metrics token reads /metrics and nothing else: /operator/mcp takes an operator token"
UNKNOWN_TOKEN = "unknown operator token"

READS = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
#: Pause, resume, activate: a second identical call changes nothing more.
SETS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
#: Replay, steer: each call acts again (a replay puts the letter back to be worked, a steer sends one more note).
EACH_CALL_ACTS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)

Api = Callable[[str, str, Optional[dict[str, Any]], Context], Awaitable[Any]]


# -- calling the app's own routes -------------------------------------------------------------


class RouteRefused(Exception):
    """A route answered with an error: its status, its ``error`` code and its reason."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


def _request_of(ctx: Context) -> Any:
    request = ctx.request_context.request
    if request is None or not hasattr(request, "scope"):
        raise ToolError("this server answers over streamable HTTP only")
    return request


def actor_of(ctx: Context) -> str:
    """The operator token's name the gate verified for this request."""
    return str(_request_of(ctx).scope.get(SCOPE_ACTOR, ""))


def _client_of(request: Any) -> tuple[str, int]:
    """The caller's address, so a route's per-client limits count the caller, not this server."""
    client = request.client
    return (str(client.host), int(client.port)) if client is not None else ("127.0.0.1", 0)


def route_caller(django_app: Any) -> Api:
    """A call of the app's own route ``path`` with the caller's credentials: its JSON, or :class:`RouteRefused`."""

    async def call(method: str, path: str, body: Optional[dict[str, Any]], ctx: Context) -> Any:
        request = _request_of(ctx)
        # The caller's own credential, host and scheme (and the proxy's word on it): the route judges them as it
        # would the caller's direct request (ALLOWED_HOSTS, CREWLET_SSL_REDIRECT behind TLS).
        headers = {"Authorization": request.headers.get("authorization", ""), "Accept": "application/json"}
        headers.update({name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers})
        base = f"{request.url.scheme}://{request.headers.get('host', 'localhost')}"
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=django_app, client=_client_of(request)), base_url=base, timeout=CALL_TIMEOUT_S
        ) as client:
            response = await client.request(method, path, headers=headers, json=body)
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        if response.status_code >= 400:
            answer = answer if isinstance(answer, dict) else {}
            reason = str(answer.get(K_REASON) or answer.get("detail") or response.reason_phrase)
            raise RouteRefused(response.status_code, str(answer.get(K_ERROR) or ""), reason)
        return answer

    return call


def _query(path: str, **params: Any) -> str:
    given = {k: v for k, v in params.items() if v not in ("", None)}
    return path + (f"?{urlencode(given)}" if given else "")


def _segment(value: str, field: str) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not text or len(text) > 200:
        raise ToolError(f"{field} must be a non-empty string of at most 200 characters")
    return quote(text, safe="")


async def _read(api: Api, path: str, ctx: Context) -> str:
    try:
        return json.dumps(await api("GET", path, None, ctx), sort_keys=True)
    except RouteRefused as exc:
        raise ToolError(f"{exc.status} {exc.error}: {exc.reason}") from None


# -- auditing the acting tools ---------------------------------------------------------------


async def _on_engine(make: Callable[[Any], Awaitable[Any]]) -> Any:
    """``make(queue)`` on the engine's loop, from a worker thread, as the request views reach it."""
    return await sync_to_async(runtime.on_engine, thread_sensitive=False)(make, CALL_TIMEOUT_S)


def _caller(ctx: Context) -> ops.Caller:
    return ops.Caller(actor_of(ctx), transport=ops.TRANSPORT_MCP, request_id=str(ctx.request_id))


async def _audit(ctx: Context, result: ops.ActResult) -> None:
    caller = _caller(ctx)
    try:
        await _on_engine(lambda queue: ops.audit(queue, result, caller))
    except Exception as exc:
        log.warning("operator_mcp_unaudited", extra={"tool": result.tool, "outcome": result.outcome, "error": repr(exc)})


def _refusal_of(status: int, error: str) -> tuple[str, str]:
    """(outcome, refusal) of a route's error answer: a 5xx is a failure, anything else a refusal."""
    if status >= 500:
        return ops.OUTCOME_FAILED, ops.REFUSAL_UNAVAILABLE
    return ops.OUTCOME_REFUSED, error or ("not_found" if status == 404 else ops.REFUSAL_BAD_ARGS)


async def _act_through_route(
    api: Api, ctx: Context, tool: str, path: str, body: dict[str, Any], *, done: Optional[str] = None
) -> str:
    """Run an acting route, audit it once, and answer its JSON (or a tool error with its reason).

    The audited outcome is ``done`` when given (a route whose answer has no
    ``changed``), else whether the route changed something.
    """
    try:
        answer = await api("POST", path, body, ctx)
    except RouteRefused as exc:
        outcome, refusal = _refusal_of(exc.status, exc.error)
        await _audit(ctx, ops.ActResult(tool, outcome, refusal, detail=exc.reason))
        raise ToolError(f"{exc.status} {refusal}: {exc.reason}") from None
    except Exception as exc:
        log.warning("operator_mcp_call_failed", extra={"tool": tool, "error": repr(exc)})
        await _audit(ctx, ops.ActResult(tool, ops.OUTCOME_FAILED, ops.REFUSAL_UNAVAILABLE))
        raise ToolError(f"{tool} could not be run: the route did not answer; try again") from None
    changed = bool(answer.get("changed")) if isinstance(answer, dict) else False
    await _audit(ctx, ops.ActResult(tool, done or (OUTCOME_CHANGED if changed else OUTCOME_UNCHANGED)))
    return json.dumps(answer, sort_keys=True)


# -- the server ------------------------------------------------------------------------------


def build_server(django_app: Any) -> MCPServer:
    """The operator's tools on one ``MCPServer``; reads and pause/resume answered by ``django_app``'s own routes."""
    server = MCPServer(SERVER_NAME, instructions="Read and operate a Crewlet company: seats, events, turns, dead letters.")
    api = route_caller(django_app)

    @server.tool(annotations=READS)
    async def seats_list(ctx: Context) -> str:
        """Every seat with its pause state and mailbox (GET /api/seats/)."""
        return await _read(api, "/api/seats/", ctx)

    @server.tool(annotations=READS)
    async def events_list(
        ctx: Context, type: str = "", seat: str = "", trace_id: str = "", since: str = "", limit: int = 50, cursor: str = ""
    ) -> str:
        """Stored events, newest first, filtered (GET /api/events); ``cursor`` pages on."""
        path = _query("/api/events", type=type, seat=seat, trace_id=trace_id, since=since, limit=limit, cursor=cursor)
        return await _read(api, path, ctx)

    @server.tool(annotations=READS)
    async def event_get(ctx: Context, event_id: str) -> str:
        """One stored event with its payload (GET /api/events/{event_id})."""
        return await _read(api, f"/api/events/{_segment(event_id, 'event_id')}", ctx)

    @server.tool(annotations=READS)
    async def trace_get(ctx: Context, trace_id: str) -> str:
        """Every event of one trace, as a tree (GET /api/traces/{trace_id})."""
        return await _read(api, f"/api/traces/{_segment(trace_id, 'trace_id')}", ctx)

    @server.tool(annotations=READS)
    async def turns_list(ctx: Context, seat: str = "", trace_id: str = "", limit: int = 50, cursor: str = "") -> str:
        """Turns, newest first (GET /api/turns)."""
        return await _read(api, _query("/api/turns", seat=seat, trace_id=trace_id, limit=limit, cursor=cursor), ctx)

    @server.tool(annotations=READS)
    async def turn_get(ctx: Context, turn_id: str) -> str:
        """One turn: its triggers, rounds, tool calls and outcome (GET /api/turns/{turn_id})."""
        return await _read(api, f"/api/turns/{_segment(turn_id, 'turn_id')}", ctx)

    @server.tool(annotations=READS)
    async def dead_letters_list(ctx: Context, limit: int = 100) -> str:
        """What sits on CREWLET_DLQ, oldest first, each with the ``ref`` dead_letter_replay takes (GET /api/dead-letters)."""
        return await _read(api, _query("/api/dead-letters", limit=limit), ctx)

    @server.tool(annotations=READS)
    async def seat_memory(ctx: Context, handle: str) -> str:
        """A seat's memory files (GET /api/seats/{handle}/memory)."""
        return await _read(api, f"/api/seats/{_segment(handle, 'handle')}/memory", ctx)

    @server.tool(annotations=READS)
    async def sandbox_runs(ctx: Context, seat: str = "", limit: int = 50) -> str:
        """Coding runs, newest first: status, whether each holds its seat, its question and outcome (GET /api/sandbox/runs)."""
        return await _read(api, _query("/api/sandbox/runs", seat=seat, limit=limit), ctx)

    @server.tool(name=TOOL_SEAT_PAUSE, annotations=SETS)
    async def seat_pause(ctx: Context, handle: str, reason: str = "", stop_running: bool = False) -> str:
        """Pause a seat: its inbox is held; ``stop_running`` also stops the turn it is running. Audited."""
        path = f"/api/seats/{_segment(handle, 'handle')}/pause"
        return await _act_through_route(api, ctx, TOOL_SEAT_PAUSE, path, {"reason": reason, "stop_running": stop_running})

    @server.tool(name=TOOL_SEAT_RESUME, annotations=SETS)
    async def seat_resume(ctx: Context, handle: str) -> str:
        """Resume a paused seat. Audited."""
        return await _act_through_route(api, ctx, TOOL_SEAT_RESUME, f"/api/seats/{_segment(handle, 'handle')}/resume", {})

    @server.tool(name=TOOL_SEAT_STEER, annotations=EACH_CALL_ACTS)
    async def seat_steer(ctx: Context, handle: str, note: str) -> str:
        """Send ``note`` to the seat's running turn, read at its next round (agent_turn_steered: delivered or expired). Audited, never the note."""
        path = f"/api/seats/{_segment(handle, 'handle')}/steer"
        return await _act_through_route(api, ctx, TOOL_SEAT_STEER, path, {"note": note}, done=OUTCOME_ACCEPTED)

    @server.tool(name=TOOL_SANDBOX_ANSWER, annotations=EACH_CALL_ACTS)
    async def sandbox_answer(ctx: Context, run_id: str, answer: str) -> str:
        """Answer a coding run's question (sandbox_run_answered says what it became: resumed, not_awaiting, gone). Audited, never the answer."""
        path = f"/api/sandbox/runs/{_segment(run_id, 'run_id')}/answer"
        return await _act_through_route(api, ctx, TOOL_SANDBOX_ANSWER, path, {"answer": answer}, done=OUTCOME_ACCEPTED)

    @server.tool(name=TOOL_DEAD_LETTER_REPLAY, annotations=EACH_CALL_ACTS)
    async def dead_letter_replay(ctx: Context, ref: str) -> str:
        """Put dead letter ``ref`` (from dead_letters_list) back on its topic. Audited."""
        caller = _caller(ctx)
        ref = ref.strip() if isinstance(ref, str) else ""
        try:
            result = await _on_engine(lambda queue: ops.replay_dead_letter(queue, ref, caller))
        except Exception as exc:  # the engine went: the replay was not tried
            log.warning("operator_mcp_call_failed", extra={"tool": TOOL_DEAD_LETTER_REPLAY, "error": repr(exc)})
            await _audit(ctx, ops.ActResult(TOOL_DEAD_LETTER_REPLAY, ops.OUTCOME_FAILED, ops.REFUSAL_UNAVAILABLE))
            raise ToolError(ops.DETAIL_UNAVAILABLE) from None
        if not result.ok:
            raise ToolError(f"{result.refusal}: {result.detail}")
        return json.dumps({"outcome": result.outcome, "topic": result.topic, "event_id": result.event_id}, sort_keys=True)

    @server.tool(name=TOOL_REVISION_ACTIVATE, annotations=SETS)
    async def revision_activate(ctx: Context, revision: int) -> str:
        """Make stored company-config revision ``revision`` the one every node serves. Audited."""
        tool = TOOL_REVISION_ACTIVATE
        if not 1 <= revision <= MAX_REVISION:
            detail = f"revision={str(revision)[:40]} is out of range: a stored revision's number, 1 to {MAX_REVISION}"
            await _audit(ctx, ops.ActResult(tool, ops.OUTCOME_REFUSED, ops.REFUSAL_BAD_ARGS, detail=detail))
            raise ToolError(f"{ops.REFUSAL_BAD_ARGS}: {detail}")
        exists = await sync_to_async(lambda: ConfigRevision.objects.filter(pk=revision).exists())()
        if not exists:
            detail = f"revision={revision} names no stored revision: see the admin's config revisions"
            await _audit(ctx, ops.ActResult(tool, ops.OUTCOME_REFUSED, REFUSAL_NO_REVISION, detail=detail))
            raise ToolError(f"{REFUSAL_NO_REVISION}: {detail}")
        try:
            won = await sync_to_async(activation.activate, thread_sensitive=False)(revision, actor_of(ctx))
        except RuntimeError as exc:
            log.warning("operator_mcp_call_failed", extra={"tool": tool, "error": str(exc)})
            await _audit(ctx, ops.ActResult(tool, ops.OUTCOME_FAILED, ops.REFUSAL_UNAVAILABLE))
            raise ToolError(f"nothing changed: {exc}") from None
        await _audit(ctx, ops.ActResult(tool, OUTCOME_CHANGED if won else OUTCOME_UNCHANGED))
        return json.dumps({"changed": won, "revision": revision})

    return server


# -- the ASGI endpoint -----------------------------------------------------------------------


class OperatorMCP:
    """ASGI: the token gate, then the SDK's stateless streamable-HTTP app (its session manager started on first use)."""

    def __init__(self, django_app: Any) -> None:
        self.server = build_server(django_app)
        self.http = self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._running: Optional[asyncio.Task[None]] = None
        self._ready = asyncio.Event()

    @staticmethod
    def serves(path: str) -> bool:
        return path == MCP_PATH or path.startswith(MCP_PATH + "/")

    async def _hold_session_manager(self) -> None:
        async with self.server.session_manager.run():
            self._ready.set()
            await asyncio.Future()  # open until the loop ends

    async def _started(self) -> None:
        """The SDK's session manager running (started by the first request); raised when it could not start."""
        if self._ready.is_set():
            return
        if self._running is None:
            self._running = asyncio.get_running_loop().create_task(self._hold_session_manager())
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait([self._running, ready], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            raise RuntimeError("the MCP session manager stopped before it served a request")

    async def _refusal(self, scope: dict[str, Any]) -> tuple[int, str, str]:
        """(status, reason, "") for a caller refused at the gate, else (0, "", the token's name)."""
        header = next((v.decode("latin-1") for k, v in scope.get("headers") or [] if k.lower() == b"authorization"), "")
        token, why = bearer_token(header)
        if token is None:
            return 401, why, ""
        if is_scrape_token(token):
            return 403, METRICS_ONLY, ""
        row = await sync_to_async(operator_for)(token)
        if row is None:
            return 401, UNKNOWN_TOKEN, ""
        return 0, "", str(row.name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        status, reason, actor = await self._refusal(scope)
        if status:
            log.info("operator_mcp_refused", extra={"status": status, "reason": reason})
            body = json.dumps({"detail": reason}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            headers.append((b"www-authenticate", f'Bearer realm="{REALM}"'.encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self._started()
        await self.http(dict(scope, **{SCOPE_ACTOR: actor}), receive, send)


__all__ = ["ACTING_TOOLS", "MCP_PATH", "OperatorMCP", "build_server"]
