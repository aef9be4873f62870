"""Helpers the seat delivery tests share: companies, wakes, a recorder of what was published, brokers."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Sequence

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from rest_framework.test import APIClient

from crewlet import events
from crewlet.events import Event
from crewlet.events.types import ExternalNotification
from crewlet.engine.interfaces import SEAT_RUNTIME
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import parse_company
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue, Timings
from crewlet.queue.memory import MemoryBroker
from crewlet.events.tracing import Trace
from seats.episodes import BLOCK_CLOSE
from seats.ledger import in_store, screen
from seats.mailboxes import ensure_mailboxes
from seats.runtime import SeatRuntime
from engine_support import engine_here
from waiting_support import eventually

#: Shrunk delivery timings: the real paths, in milliseconds.
FAST = Timings(backoff_base_s=0.001, backoff_cap_s=0.005, ack_wait_s=30.0)


def company(
    *,
    providers: Optional[list[dict[str, Any]]] = None,
    max_concurrent: int = 4,
    window_s: float = 0,
    max_batch: int = 20,
    seats: Optional[list[dict[str, Any]]] = None,
    schedules: Optional[list[dict[str, Any]]] = None,
) -> Organization:
    """The test company: agents ada and linus, human grace, the echo model unless told otherwise."""
    return parse_company(
        {
            "org": "acme",
            "providers": {"llm": [{"kind": "echo"}] if providers is None else providers},
            "node": {"max_concurrent": max_concurrent},
            "notification_coalesce_window_seconds": window_s,
            "notification_coalesce_max_batch": max_batch,
            "seats": seats
            if seats is not None
            else [
                {"handle": "ada", "kind": "agent", "role": "engineer"},
                {"handle": "linus", "kind": "agent", "role": "reviewer"},
                {"handle": "grace", "kind": "human", "role": "lead"},
            ],
            "schedules": schedules or [],
        }
    )


def wake(
    handle: str,
    body: str,
    *,
    partition_key: str = "",
    conversation: str = "",
    delivery_id: str = "",
    sender: str = "sam",
    trace: Optional[Trace] = None,
    event_id: Optional[str] = None,
) -> Event:
    """An inbox wake as the notification service publishes one."""
    extras: dict[str, Any] = {"sender": sender, "body": body}
    if partition_key:
        extras["partition_key"] = partition_key
    if conversation:
        extras["conversation_identity"] = conversation
    if delivery_id:
        extras["delivery_id"] = delivery_id
    return events.new(
        ExternalNotification(seat=handle, sender=sender, body=body),
        trace or Trace.root(),
        source="slack",
        extras=extras,
        event_id=event_id,
    )


async def send(queue: EventQueue, handle: str, event: Event) -> Event:
    await queue.publish(topics.agent_inbox(handle), event)
    return event


@dataclass
class Recorder:
    """Every event a queue client published, in order, as its publish listener saw it."""

    seen: list[tuple[str, Event]] = field(default_factory=list)

    async def __call__(self, topic: str, event: Event) -> None:
        self.seen.append((topic, event))

    def attach(self, *queues: EventQueue) -> "Recorder":
        for q in queues:
            q.add_publish_listener(self)
        return self

    def of(self, etype: str, **fields: Any) -> list[Event]:
        out = []
        for _, ev in self.seen:
            if ev.type != etype:
                continue
            if all(getattr(ev.data, k, ev.payload.get(k)) == v for k, v in fields.items()):
                out.append(ev)
        return out

    def types(self) -> list[str]:
        return [ev.type for _, ev in self.seen]


async def recording_with_mailboxes(q: EventQueue) -> tuple[Recorder, Organization]:
    """A :class:`Recorder` on ``q``, and the example company with its seats' mailboxes already on ``q``."""
    rec = Recorder().attach(q)
    org = company()
    await ensure_mailboxes(q, org)
    return rec, org


@contextlib.asynccontextmanager
async def memory_queues(*nodes: str) -> AsyncIterator[tuple[MemoryBroker, list[EventQueue]]]:
    broker = MemoryBroker(FAST)
    clients = [broker.client(node=n) for n in (nodes or ("n1",))]
    try:
        yield broker, clients
    finally:
        for c in clients:
            await c.close()


@contextlib.asynccontextmanager
async def jetstream_queues(*nodes: str) -> AsyncIterator[list[EventQueue]]:
    """A real nats-server (the embedded broker) and one JetStream client per node."""
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue

    async with EmbeddedBroker(store_dir=None) as broker:
        clients = [
            await JetStreamQueue.connect(
                broker.url, node=n, timings=FAST, event_retention_hours=2.0, memory_storage=broker.memory_storage
            )
            for n in (nodes or ("n1",))
        ]
        try:
            yield clients
        finally:
            for c in clients:
                await c.close()


async def subscribed_on(url: str, topic: str) -> bool:
    """Whether a durable subscription reads ``topic`` on the broker at ``url`` (asked by a probe client of its own)."""
    from crewlet.queue.jetstream import JetStreamQueue

    q = await JetStreamQueue.connect(url, node="probe", timings=FAST)
    try:
        return bool(await q.list_subscriptions(topic))
    finally:
        await q.close()


async def publish_raw(url: str, topic: str, data: bytes) -> None:
    """``data`` on ``topic`` as they are: bytes no event decodes from, as another build could publish them."""
    from crewlet.queue.jetstream import JetStreamQueue

    q = await JetStreamQueue.connect(url, node="tester", timings=FAST)
    try:
        await q.transport.publish(topic, data)
    finally:
        await q.close()


def holder(org: Optional[Organization] = None) -> CompanyHolder:
    return CompanyHolder(org or company())


# -- a local model endpoint: OpenAI's chat completions and Anthropic's messages ---------


@dataclass(frozen=True)
class Reply:
    """One scripted model answer: text, tool calls ``(name, arguments)``, and how it stopped.

    ``stop`` is the vendor-neutral reason (``end``, ``tool_use``, ``refusal``,
    ``max_tokens``); by default ``tool_use`` when there are calls, else ``end``.
    A ``status`` other than 200 answers that request with that HTTP failure
    and ``headers`` (a ``Retry-After``) instead.
    """

    text: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    stop: str = ""
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def stop_reason(self) -> str:
        return self.stop or ("tool_use" if self.calls else "end")


_OPENAI_FINISH = {"end": "stop", "tool_use": "tool_calls", "refusal": "content_filter", "max_tokens": "length"}
_ANTHROPIC_STOP = {"end": "end_turn", "tool_use": "tool_use", "refusal": "refusal", "max_tokens": "max_tokens"}


def user_text(request: dict[str, Any]) -> str:
    """A recorded OpenAI request's user message: the trigger, opened by the conversation's earlier episodes if it had any."""
    return str(next(m["content"] for m in request["messages"] if m["role"] == "user"))


def trigger_of(request: dict[str, Any]) -> str:
    """What a recorded OpenAI request asked the model to answer: its user message past any block of earlier episodes."""
    return user_text(request).split(BLOCK_CLOSE)[-1]


@dataclass
class FakeModelServer:
    """A model on loopback, both vendors' routes: answers, or fails with ``status``.

    ``POST /v1/chat/completions`` answers in OpenAI's shape, ``POST
    /v1/messages`` in Anthropic's. With ``replies`` the n-th request gets the
    n-th reply (the last one again once they run out: a model that never
    stops); without, every request gets ``reply`` as its text. ``scripts``
    does the same per seat (the OpenAI request's ``user``), counting that
    seat's requests only, so one server can play each seat's model.
    """

    status: int = 200
    reply: str = "hello from the model"
    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    scripts: dict[str, list[Reply]] = field(default_factory=dict)
    port: int = 0

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's ``base_url`` (with ``/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The Anthropic SDK's ``base_url`` (it adds ``/v1/messages`` itself)."""
        return f"http://127.0.0.1:{self.port}"

    def next_reply(self) -> Reply:
        if not self.replies:
            return Reply(text=self.reply)
        return self.replies[min(len(self.requests) - 1, len(self.replies) - 1)]

    def reply_for(self, body: dict[str, Any]) -> Reply:
        """The reply to the request just recorded: its seat's script when it has one, else :meth:`next_reply`."""
        seat = str(body.get("user") or "")
        script = self.scripts.get(seat)
        if not script:
            return self.next_reply()
        n = sum(1 for r in self.requests if str(r.get("user") or "") == seat)
        return script[min(n - 1, len(script) - 1)]

    def of_seat(self, seat: str) -> list[dict[str, Any]]:
        """The requests made for ``seat``, in order."""
        return [r for r in self.requests if r.get("user") == seat]

    def openai_answer(self, model: str, answer: Optional[Reply] = None) -> dict[str, Any]:
        n = len(self.requests)
        answer = answer or self.next_reply()
        message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
        if answer.calls:
            message["tool_calls"] = [
                {"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(answer.calls)
            ]
        return {
            "id": f"cmpl-{n}",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": _OPENAI_FINISH[answer.stop_reason]}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }

    def anthropic_answer(self, model: str, answer: Optional[Reply] = None) -> dict[str, Any]:
        n = len(self.requests)
        answer = answer or self.next_reply()
        content: list[dict[str, Any]] = [{"type": "text", "text": answer.text}] if answer.text else []
        content += [
            {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": args}
            for i, (name, args) in enumerate(answer.calls)
        ]
        return {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": _ANTHROPIC_STOP[answer.stop_reason],
            "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 5},
        }


def send_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    payload: Any,
    headers: Sequence[tuple[str, str]] = (),
    content_type: str = "application/json",
) -> None:
    """Answer an ``http.server`` request with ``payload`` as JSON (and ``headers``)."""
    data = json.dumps(payload).encode()
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def model_server(
    status: int = 200, reply: str = "hello from the model", replies: Sequence[Reply] = ()
) -> Iterator[FakeModelServer]:
    state = FakeModelServer(status=status, reply=reply, replies=list(replies))
    routes = {"/v1/chat/completions": state.openai_answer, "/v1/messages": state.anthropic_answer}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            state.requests.append(body)
            state.headers.append({k.lower(): v for k, v in self.headers.items()})
            route = routes.get(self.path)
            answer = state.reply_for(body)
            if route is None:
                self._send(404, {"error": {"message": f"no route {self.path}"}})
            elif state.status != 200:
                self._send(state.status, {"error": {"message": "the model is overloaded"}})
            elif answer.status != 200:
                self._send(answer.status, {"error": {"message": f"scripted HTTP {answer.status}"}}, answer.headers)
            else:
                self._send(200, route(str(body.get("model", "")), answer))

        def _send(self, status: int, payload: dict[str, Any], headers: Sequence[tuple[str, str]] = ()) -> None:
            send_json(self, status, payload, headers)

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        state.port = port
        yield state


class HeldModel(FakeModelServer):
    """A scripted model whose n-th request is answered only once ``gates[n]`` is set (the test's hand on the round)."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(replies=replies)
        self.gates = [threading.Event() for _ in replies]


@contextlib.contextmanager
def held_model(replies: list[Reply]) -> Iterator[HeldModel]:
    """An OpenAI-compatible model on loopback answering ``replies`` in order, each only once its gate is set
    (a reply whose ``status`` is not 200 is that HTTP failure)."""
    state = HeldModel(replies)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            state.requests.append(body)
            n = len(state.requests)
            state.gates[min(n, len(state.gates)) - 1].wait(120)
            reply = state.replies[min(n, len(state.replies)) - 1]
            if reply.status != 200:
                send_json(self, reply.status, {"error": {"message": f"scripted HTTP {reply.status}"}}, reply.headers)
            else:
                send_json(self, 200, state.openai_answer(str(body.get("model", "")), reply))

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        state.port = port
        try:
            yield state
        finally:
            for gate in state.gates:
                gate.set()


def store_away_for(outages: list[int]) -> Any:
    """The real screen, after ``outages[0]`` screenings the store fails as a database that cannot be reached does."""

    def flaky(seat: str, identities: Any) -> Any:
        if outages[0] > 0:
            outages[0] -= 1
            settings = {**connections["default"].settings_dict, "NAME": "crewlet_no_such_database"}
            type(connections["default"])(settings, alias="absent").ensure_connection()  # a real OperationalError
        return screen(seat, identities)

    return in_store(flaky)


@contextlib.contextmanager
def loopback_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` served on a free loopback port on a thread of its own; the port, until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def json_vendor(answer: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]) -> Iterator[str]:
    """A vendor on loopback whose every POST is answered ``answer(body)`` as JSON; the OpenAI SDK's ``base_url``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            send_json(self, *answer(body))

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        yield f"http://127.0.0.1:{port}/v1"


# -- shared by the seat, a2a, notifications and config tests -----------------------


@pytest.fixture
async def close_store_connections() -> AsyncIterator[None]:
    """After the test, close the database connections of the thread ``sync_to_async`` runs store calls on.

    Opt-in: a module whose tests run seats or the store from the event loop
    marks itself ``pytest.mark.usefixtures("close_store_connections")``, so
    no connection stays open into the next test or the test databases' teardown.
    """
    yield
    from django.db import connections

    await sync_to_async(connections.close_all)()


@contextlib.asynccontextmanager
async def running(queue: EventQueue, org: Optional[Organization] = None, **options: Any) -> AsyncIterator[SeatRuntime]:
    options.setdefault("run_scheduler", False)
    runtime = SeatRuntime(queue, holder(org), **options)
    await runtime.start()
    try:
        with engine_here(queue, company=runtime.holder, node=queue.node, services={SEAT_RUNTIME: runtime}):
            yield runtime
    finally:
        await runtime.stop()


@contextlib.asynccontextmanager
async def scheduling_nodes(
    queues: Sequence[EventQueue], schedules: list[dict[str, Any]], now: list[float]
) -> AsyncIterator[tuple[Recorder, list[SeatRuntime]]]:
    """One started runtime a client, each scheduling ``schedules`` every 20 ms on the clock ``now[0]``.

    Yields a recorder on every client and the runtimes; they are stopped when the block ends.
    """
    rec = Recorder().attach(*queues)
    runtimes = [
        SeatRuntime(q, holder(company(schedules=schedules)), scheduler_tick_s=0.02, clock=lambda: now[0])
        for q in queues
    ]
    await asyncio.gather(*(rt.start() for rt in runtimes))
    try:
        yield rec, runtimes
    finally:
        await asyncio.gather(*(rt.stop() for rt in runtimes))


def inbox(handle: str) -> tuple[str, str]:
    return topics.agent_inbox(handle), topics.agent_inbox_group(handle)


async def drained(q: EventQueue, handle: str) -> None:
    """Wait until the seat's mailbox retains nothing: the handler returned and its partition was acked."""

    async def empty() -> bool:
        return await q.backlog(*inbox(handle)) == 0

    await eventually(empty, what=f"{handle}'s mailbox drained")


def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` as a request's worker thread does (its own connection), closing that connection after."""
    from django.db import connections

    try:
        return fn(*args)
    finally:
        connections.close_all()


def bearer(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


@pytest.fixture
async def runtime_on_memory() -> AsyncIterator[tuple[SeatRuntime, Any, Recorder]]:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        rt = SeatRuntime(q, holder(), run_scheduler=False)
        await rt.start()
        try:
            with engine_here(q, company=rt.holder, node=q.node, services={SEAT_RUNTIME: rt}):
                yield rt, q, rec
        finally:
            await rt.stop()
            from django.db import connections

            await sync_to_async(connections.close_all)()


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """The node's environment with ``values`` set (an empty one unset) while the block runs: what ``env_from`` reads."""
    before = {k: os.environ.get(k) for k in values}
    for key, value in values.items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def openai_completion(message: dict[str, Any], finish: str, *, model: str = "gpt-test", completion_id: str = "cmpl-1") -> dict[str, Any]:
    """A Chat Completions answer as OpenAI's API returns one: ``message`` with its ``finish_reason`` and a small usage."""
    return {
        "id": completion_id, "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }
