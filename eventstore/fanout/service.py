"""The fleet read: this node's answers served to every asker, and every live node asked for each history read.

Design (Reading the fleet's history). Each node's store holds only what that
node published, so a history read is answered by every live node at query
time. The question travels, not the data: the asker reads its own store
directly and scatters the same question over the broker's ephemeral
request/reply (``ask`` on :data:`~crewlet.queue.topics.HISTORY_READS`: no
stream, no stored record); every engine ``serve``s that subject from its own
store. The roster is the fleet's live node leases.

Every answer carries ``coverage`` — ``{nodes: [{id, answered, error}], complete}``
over every live node and this one — and ``complete`` is true only when every
one answered inside the budget (``history.fleet_read_budget_s``). A node that
did not is named with the reason (:mod:`.wire`'s phrases): it timed out,
speaks another protocol version (its rows are never mixed in), sent a reply
that cannot be read, or its own read failed. A read that came back without
every node is logged and published as ``history_partial`` (live only).

A request thread (a DRF view) asks with :meth:`FleetReads.ask`: the scatter
starts on the engine's loop while one of this service's read threads reads
its own store (and, before, the roster: a read thread keeps its database
connections, a request thread under ASGI opens new ones every request), and
the request thread then waits for the gather. A coroutine (the projection's seed) asks
with :meth:`FleetReads.arun`. Serving runs each node's read on this
service's own threads, so an asker never waits behind the engine's store
thread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterable, Optional

from django.db import DatabaseError, connections

from crewlet.engine import runtime
from crewlet.base.db import in_transaction, read_again_if_dropped
from crewlet.events import format_timestamp
from crewlet.events.types import HistoryPartial
from crewlet.engine.interfaces import FLEET_READS, FleetHistory
from crewlet.queue import topics
from crewlet.queue.contract import MAX_PAYLOAD_BYTES, Closable, EventQueue
from crewlet.queue.errors import QueueError
from crewlet.events.tracing import trace_of
from eventstore import here
from eventstore import questions as qs
from eventstore.custody import claimed_by
from eventstore.fanout import wire
from eventstore.fanout.kept import Ask, Exchange, NodeReply, kept_round
from eventstore.fanout.merge import Parts, Plan, plan_for

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.eventstore.fanout")

#: The live node ids (this node's own lease among them, or not yet).
Roster = Callable[[], Iterable[str]]
#: Publishes a partial read's record (the engine's emitter).
Report = Callable[[HistoryPartial], Coroutine[Any, Any, Any]]

#: How many of this node's reads for other askers run at once.
READ_WORKERS = 4
#: How much longer than the budget a request thread waits for the loop's gather, which itself stops at the budget.
GATHER_GRACE_S = 1.0


def live_roster() -> list[str]:
    """The live nodes that keep an event store, by id (read from the coordination store on every call).

    A node whose presence names no store (a stateless node: its events are in
    a data node's store) holds no part of any answer, so it is never asked.
    """
    from crewlet.fleet.roster import live_node_ids

    return live_node_ids(stores_only=True)


# -- one node's part ------------------------------------------------------------------------------


def _turns_part(question: qs.Question, at: Any, scope: qs.NodeScope) -> dict[str, Any]:
    listed, more = qs.turn_page(question, at, scope)
    return {"turns": [list(entry) for entry in listed], "more": more}


#: What a node answers each question the fleet scatters with: JSON-ready, merged by :mod:`.merge`.
NODE_PARTS: dict[str, Callable[[qs.Question, Any, qs.NodeScope], dict[str, Any]]] = {
    qs.EVENTS: qs.answer_events,
    qs.EVENT: qs.answer_event,
    qs.EVENT_SERIES: qs.answer_series,
    qs.TRACE: qs.trace_rows,
    qs.TURNS: _turns_part,
    qs.TURN_ROWS: qs.answer_turn_rows,
    qs.LAST_TURNS: qs.answer_last_turns,
    qs.COUNTS: qs.answer_counts,
    qs.MODEL_SPEND: qs.answer_model_spend,
    qs.DELIVERY: qs.answer_delivery,
    qs.KEPT: qs.answer_kept,
}


def node_part(question: qs.Question, scope: qs.NodeScope) -> dict[str, Any]:
    """This node's part of ``question``; QuestionRefused rather than a guess (no instant, another version).

    The part counts and lists the rows this store keeps settled and names
    (:data:`~eventstore.questions.K_UNSETTLED`) the unsettled rows of custody
    batches the question could reach; a question of ``only`` these ids reads
    exactly them and names nothing (:mod:`.kept`). Of those it names, the rows
    whose batch's claim names this node (:data:`~eventstore.questions.K_UNSETTLED_OWN`)
    are the ones it keeps for good, so the asker asks it for them rather than
    a store whose settle pass may drop its copy between the two questions.
    """
    at = qs.check(question)
    part = NODE_PARTS.get(question.kind)
    if part is None:
        raise qs.BadQuestion(f"question kind {question.kind!r} is not one the fleet scatters")
    reading = dataclasses.replace(scope, custody=qs.Custody(question.only))
    answer = part(question, at, reading)
    named = qs.unsettled_rows(reading)
    if named:
        answer[qs.K_UNSETTLED] = [row_id for row_id, _ in named]
        own = _claimed_here(scope.node_id, {batch for _, batch in named})
        if own:
            answer[qs.K_UNSETTLED_OWN] = [row_id for row_id, batch in named if batch in own]
    return answer


def _claimed_here(node: str, batches: set[str]) -> set[str]:
    """Which of ``batches`` the coordination store says ``node`` keeps; none when it cannot be read (the asker then picks)."""
    try:
        return claimed_by(node, batches)
    except DatabaseError as exc:
        log.warning("fleet_read_claims_unread", extra={"node": node, "error": type(exc).__name__})
        return set()


# -- the coverage of one read -------------------------------------------------------------------


@dataclass
class Coverage:
    """Who answered every round of one read: node id -> "" (answered) or the first reason it did not."""

    nodes: dict[str, str] = field(default_factory=dict)

    def note(self, node: str, error: str) -> None:
        if not self.nodes.get(node):
            self.nodes[node] = error

    @property
    def complete(self) -> bool:
        return not any(self.nodes.values())

    def as_dict(self) -> dict[str, Any]:
        nodes = [{"id": node, "answered": not error, "error": error} for node, error in sorted(self.nodes.items())]
        return {"nodes": nodes, "complete": self.complete}

    def missing(self) -> list[dict[str, str]]:
        return [{"id": node, "error": error} for node, error in sorted(self.nodes.items()) if error]


@dataclass
class Gathered:
    """What the loop's scatter brought back within the budget: replies by node, or why the broker could not be asked."""

    replies: dict[str, wire.Reply] = field(default_factory=dict)
    failure: str = ""


#: The shapes a part must have before it is merged: a reply that lacks them is unreadable, never half-merged.
_SHAPES: dict[str, dict[str, type | tuple[type, ...]]] = {
    qs.EVENTS: {"events": list},
    qs.EVENT: {"event": (dict, type(None))},
    qs.EVENT_SERIES: {"bars": list},
    qs.TRACE: {"rows": list, "truncated": bool},
    qs.TURNS: {"turns": list, "more": bool},
    qs.TURN_ROWS: {"turns": dict},
    qs.LAST_TURNS: {"seats": dict},
    qs.COUNTS: {"counters": dict, "per_seat": dict},
    qs.MODEL_SPEND: {"models": dict, "rounds": int},
    qs.DELIVERY: {"rows": list},
    qs.KEPT: {qs.K_KEPT: list},
}


def _readable(kind: str, answer: Optional[dict[str, Any]]) -> bool:
    if answer is None or not all(isinstance(answer.get(key, []), list) for key in (qs.K_UNSETTLED, qs.K_UNSETTLED_OWN)):
        return False
    return all(isinstance(answer.get(key), kinds) for key, kinds in _SHAPES.get(kind, {}).items())


class FleetReads:
    """One node's side of the fleet read: serving its store, and asking every live node.

    ``scope`` is this node (its id, retention and store). ``queue`` is its
    broker connection and ``loop`` the loop that owns it; without a queue only
    this node is read, and any other live node is named as not asked.
    ``roster`` lists the live nodes (the node leases). ``version`` is the
    protocol this node speaks: it answers only questions in it, and merges
    only replies in it. ``keeps_store`` False is a node without an event
    store (``node.data`` false): it answers no part, neither its own reads nor
    another node's, and asks the nodes that keep one.

    Every round of every plan is asked through :func:`.kept.kept_round`, so a
    row a custody batch holds on two stores counts once; ``kept_asked``
    counts the rounds that had to ask ``kept`` (only while a batch is in flight).
    """

    def __init__(
        self,
        scope: qs.NodeScope,
        *,
        roster: Roster,
        queue: Optional[EventQueue] = None,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        budget_s: float = 2.0,
        version: int = qs.PROTOCOL_VERSION,
        max_reply_bytes: int = MAX_PAYLOAD_BYTES,
        report: Optional[Report] = None,
        workers: int = READ_WORKERS,
        keeps_store: bool = True,
    ) -> None:
        self.scope = scope
        self.node = scope.node_id
        self.roster = roster
        self.queue, self.loop = queue, loop
        self.budget_s = float(budget_s)
        self.version = int(version)
        self.max_reply_bytes = int(max_reply_bytes)
        self.report = report
        self._workers = max(1, int(workers))
        self._executor = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix=f"fleet-read-{self.node}")
        self._server: Optional[Closable] = None
        self._reports: set[asyncio.Task[Any]] = set()
        #: History reads asked from here, and how many came back without every node (the history_partial alarm's ratio).
        self.reads = 0
        self.partial = 0
        self.keeps_store = bool(keeps_store)
        #: Rounds that asked ``kept`` (some node named a row of an unsettled custody batch).
        self.kept_asked = 0

    # -- serving ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve this node's answers (once the queue is connected)."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if self.queue is not None and self.keeps_store:
            self._server = await self.queue.serve(topics.HISTORY_READS, self.serve)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.close()
        for task in list(self._reports):
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._close_threads)

    def _close_threads(self) -> None:
        """Every read thread closes its database connections, then the pool ends."""
        barrier = threading.Barrier(self._workers, timeout=10)

        def close() -> None:
            try:
                barrier.wait()  # one job per thread: each waits until every thread holds one
            except threading.BrokenBarrierError:
                pass
            connections.close_all()

        for _ in range(self._workers):
            self._executor.submit(close)
        self._executor.shutdown(wait=True)

    async def serve(self, raw: bytes) -> bytes:
        """Answer one asker from this node's store; every refusal is a reply naming it, never silence."""
        try:
            request = wire.decode_request(raw)
        except wire.UnreadableRequest as exc:
            return self._unreadable(exc)
        if request.asker == self.node:
            return wire.encode_reply(self.version, self.node, own=True)
        if not request.asks(self.node):
            # Silence, by the serve contract's one way to give none: a reply would stand in for an asked node's.
            raise wire.NotAsked(f"{request.asker} did not ask {self.node} (its roster does not list this node)")
        if request.version != self.version:
            return wire.encode_reply(
                self.version, self.node,
                error=wire.reason(wire.OTHER_VERSION, f"asked in {request.version!r}; this node speaks {self.version}"),
            )
        try:
            question = request.question()
        except wire.UnreadableRequest as exc:
            return self._unreadable(exc)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._answer_for, question)

    def _unreadable(self, exc: wire.UnreadableRequest) -> bytes:
        return wire.encode_reply(self.version, self.node, error=wire.reason(qs.QuestionRefused.reason, f"unreadable question: {exc}"))

    def _answer_for(self, question: qs.Question) -> bytes:
        """This node's reply to another node's question (on a read thread), cut to the transport's limit."""
        answer, error = self._part(question)
        if answer is None:
            return wire.encode_reply(self.version, self.node, error=error)
        try:
            return wire.fit(question.kind, self.version, self.node, answer, self.max_reply_bytes)
        except wire.ReplyTooLarge as exc:
            return wire.encode_reply(self.version, self.node, error=wire.reason(wire.READ_FAILED, str(exc)))

    def _part(self, question: qs.Question, *, own: bool = False) -> tuple[Optional[dict[str, Any]], str]:
        """(this node's part, "") or (None, why not): a refusal names its reason, a store failure reads as one.

        ``own``: the asker's own read, where a question that cannot be asked
        at all (a bad field) is the caller's 400 rather than a node's refusal.
        """
        try:
            return read_again_if_dropped(node_part, question, self.scope), ""
        except qs.QuestionRefused as exc:
            if own and isinstance(exc, qs.BadQuestion):
                raise
            return None, wire.reason(exc.reason, str(exc))
        except DatabaseError as exc:
            log.warning("fleet_read_failed", extra={"node": self.node, "question": question.kind, "error": repr(exc)})
            return None, wire.reason(wire.READ_FAILED, type(exc).__name__)

    # -- asking ------------------------------------------------------------------------------------

    def _others(self) -> list[str]:
        return sorted({str(node) for node in read_again_if_dropped(self.roster)} - {self.node})

    async def _gather(self, request: bytes, others: list[str]) -> Gathered:
        """Scatter ``request`` and gather the replies of ``others`` until each answered or the budget ran out."""
        assert self.queue is not None
        # This node's own server answers too (at once, reading nothing): count it, so it never stands in for another.
        want = len(others) + (1 if self._server is not None else 0)
        try:
            raws = await self.queue.ask(topics.HISTORY_READS, request, want, self.budget_s)
        except QueueError as exc:
            return Gathered(failure=wire.reason(wire.TIMED_OUT, f"the broker could not be asked ({type(exc).__name__})"))
        gathered = Gathered()
        wanted = set(others)
        for raw in raws:
            reply = wire.decode_reply(raw)
            if reply is None:
                log.warning("fleet_read_unreadable_reply", extra={"bytes": len(raw)})
                continue
            if reply.node in wanted and not reply.own:
                gathered.replies[reply.node] = reply
        return gathered

    def _reply_of(self, question: qs.Question, node: str, gathered: Gathered) -> NodeReply:
        """``node``'s part of ``question`` as the scatter brought it back, or why there is none."""
        reply = gathered.replies.get(node)
        if reply is None:
            return None, gathered.failure or (
                wire.reason(wire.TIMED_OUT, f"no answer within {self.budget_s:g}s")
                if self.queue is not None
                else wire.reason(wire.NOT_ASKED, "this process has no broker connection")
            )
        if reply.version != self.version:
            return None, wire.reason(wire.OTHER_VERSION, f"speaks {reply.version!r}; this node speaks {self.version}")
        if reply.error:
            return None, reply.error
        if not _readable(question.kind, reply.answer):
            return None, wire.reason(wire.UNREADABLE, f"not the shape of a {question.kind} answer")
        return reply.answer, ""

    def _replies(self, asks: list[Ask], own: dict[int, NodeReply], gathered: list[Gathered]) -> list[dict[str, NodeReply]]:
        return [
            {node: own[i] if node == self.node else self._reply_of(question, node, gathered[i]) for node in nodes}
            for i, (question, nodes) in enumerate(asks)
        ]

    def _own_parts(self, asks: list[Ask]) -> dict[int, NodeReply]:
        """This node's own part of every ask put to it (on whichever thread calls it)."""
        return {i: self._own(question) for i, (question, nodes) in enumerate(asks) if self.node in nodes}

    def _targets(self, nodes: Iterable[str]) -> list[str]:
        return [node for node in nodes if node != self.node]

    def _own(self, question: qs.Question) -> tuple[Optional[dict[str, Any]], str]:
        """This node's own part (on whichever thread calls it)."""
        return self._part(question, own=True)

    def _on_read_thread(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` run on one of this service's read threads; the request thread waits for it.

        Under ASGI every request runs in a context of its own, so Django opens a
        new database connection on a request thread each time it is used (the
        roster and this node's store: two connections a read, several
        milliseconds each on PostgreSQL). The read threads keep theirs for the
        engine's life (:meth:`_close_threads` closes them).

        The call runs here instead when this thread is inside a transaction
        (only its own connection sees what that transaction wrote) or once the
        threads are stopped (the engine stopping).
        """
        if in_transaction():
            return call(*args)
        try:
            job = self._executor.submit(call, *args)
        except RuntimeError:
            return call(*args)
        return job.result()

    def _scatters(self, others: list[str]) -> bool:
        return bool(others) and self.queue is not None

    def _first_look(self, question: qs.Question) -> tuple[list[str], Optional[NodeReply]]:
        """The roster; and this node's own part of ``question`` with it when there is nobody to scatter it to.

        One trip to a read thread for a fleet of one. With other nodes the own
        read waits until the scatter has started, so both run side by side.
        """
        others = self._others()
        return others, (None if self._scatters(others) or not self.keeps_store else self._own(question))

    def _nodes(self, others: list[str]) -> list[str]:
        """The nodes a round is put to, in the order their parts reach a plan: this node's own first."""
        return ([self.node] if self.keeps_store else []) + others

    def _round(self, question: qs.Question, nodes: list[str], coverage: Coverage) -> Exchange:
        return kept_round(question, nodes, coverage.note, self._asked_kept)

    def _asked_kept(self, named: int) -> None:
        self.kept_asked += 1
        log.info("fleet_read_kept_asked", extra={"node": self.node, "named": named})

    def _exchange(self, asks: list[Ask], own: Optional[dict[int, NodeReply]] = None) -> list[dict[str, NodeReply]]:
        """Every ask put at once from a request thread: the loop gathers while a read thread reads this node's store."""
        futures: list[Optional[concurrent.futures.Future[Gathered]]] = []
        gathered = [Gathered() for _ in asks]
        for i, (question, nodes) in enumerate(asks):
            targets = self._targets(nodes)
            future = None
            if self._scatters(targets):
                request = wire.encode_request(question, self.node, targets)
                try:
                    future = runtime.start_on_loop(functools.partial(self._gather, request, targets), self.loop)
                except runtime.EngineAway as exc:
                    gathered[i] = Gathered(failure=wire.reason(wire.NOT_ASKED, str(exc)))
            futures.append(future)
        if own is None:
            own = self._on_read_thread(self._own_parts, asks) if any(self.node in nodes for _, nodes in asks) else {}
        for i, future in enumerate(futures):
            if future is not None:
                try:
                    gathered[i] = future.result(timeout=self.budget_s + GATHER_GRACE_S)
                except concurrent.futures.TimeoutError:
                    future.cancel()
        return self._replies(asks, own, gathered)

    async def _aexchange(self, asks: list[Ask]) -> list[dict[str, NodeReply]]:
        """Every ask put at once from a coroutine: the gathers and this node's own reads (on a read thread) side by side."""
        loop = asyncio.get_running_loop()
        own_read = loop.run_in_executor(self._executor, self._own_parts, asks)

        async def scatter(question: qs.Question, nodes: tuple[str, ...]) -> Gathered:
            targets = self._targets(nodes)
            if targets and self.queue is not None:
                return await self._gather(wire.encode_request(question, self.node, targets), targets)
            return Gathered()

        gathered = await asyncio.gather(*(scatter(question, nodes) for question, nodes in asks))
        return self._replies(asks, await own_read, list(gathered))

    def _drive(self, exchange: Exchange, own: Optional[NodeReply] = None) -> Parts:
        """One round's exchanges from a request thread (``own``: this node's part of the first, read already)."""
        try:
            asks = next(exchange)
            mine = {0: own} if own is not None else None
            while True:
                asks = exchange.send(self._exchange(asks, mine))
                mine = None
        except StopIteration as done:
            parts: Parts = done.value
            return parts

    async def _adrive(self, exchange: Exchange) -> Parts:
        try:
            asks = next(exchange)
            while True:
                asks = exchange.send(await self._aexchange(asks))
        except StopIteration as done:
            parts: Parts = done.value
            return parts

    def _coverage(self) -> Coverage:
        return Coverage({self.node: ""} if self.keeps_store else {})

    def run(self, plan: Plan, at: Any, label: str) -> dict[str, Any]:
        """Drive ``plan`` from a request thread; the merged answer with its coverage and instant.

        The roster and this node's own reads run on the read threads (:meth:`_on_read_thread`):
        for a fleet of one, both in one trip.
        """
        coverage = self._coverage()
        others: list[str] = []
        try:
            question = next(plan)
            others, own = self._on_read_thread(self._first_look, question)
            nodes = self._nodes(others)
            while True:
                question = plan.send(self._drive(self._round(question, nodes, coverage), own))
                own = None
        except StopIteration as done:
            merged: dict[str, Any] = done.value
        return self._finish(merged, at, coverage, others, label)

    async def arun(self, plan: Plan, at: Any, label: str) -> dict[str, Any]:
        """Drive ``plan`` from a coroutine on this node's loop."""
        loop = asyncio.get_running_loop()
        others = await loop.run_in_executor(self._executor, self._others)
        nodes = self._nodes(others)
        coverage = self._coverage()
        try:
            question = next(plan)
            while True:
                question = plan.send(await self._adrive(self._round(question, nodes, coverage)))
        except StopIteration as done:
            merged: dict[str, Any] = done.value
        return self._finish(merged, at, coverage, others, label)

    def ask(self, question: qs.Question) -> dict[str, Any]:
        """The fleet's answer to one API question (from a request thread)."""
        qs.check(question)
        return self.run(plan_for(question), question.at, question.kind)

    async def aask(self, question: qs.Question) -> dict[str, Any]:
        qs.check(question)
        return await self.arun(plan_for(question), question.at, question.kind)

    def _finish(self, merged: dict[str, Any], at: Any, coverage: Coverage, others: list[str], label: str) -> dict[str, Any]:
        for node in others:
            coverage.nodes.setdefault(node, "")
        merged["coverage"] = coverage.as_dict()
        merged["at"] = format_timestamp(at)
        self.reads += 1
        if not coverage.complete:
            self.partial += 1
            self._partial(label, len(self._nodes(others)), coverage)
        return merged

    def _partial(self, question: str, asked: int, coverage: Coverage) -> None:
        """Log and publish that a read came back without every node (live only: a look must not grow the log)."""
        missing = coverage.missing()
        log.warning("history_partial", extra={"node": self.node, "question": question, "asked": asked, "missing": missing})
        if self.report is None or self.loop is None or self.loop.is_closed():
            return
        body = HistoryPartial(question=question, asked=asked, missing=missing)
        report = self.report
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            task = self.loop.create_task(report(body))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)
        else:
            try:
                runtime.start_on_loop(lambda: report(body), self.loop)
            except runtime.EngineAway:
                pass


# -- on the engine --------------------------------------------------------------------------------


def for_engine(engine: "Engine", *, roster: Optional[Roster] = None) -> FleetReads:
    """The engine's fleet reads: its node, its retention, its queue and loop, the budget its settings give."""
    settings = engine.settings

    async def report(body: HistoryPartial) -> Any:
        emitter = engine.emitter
        if emitter is not None:
            await emitter.emit(body, trace_of(), log_event="history_partial_publish_failed")

    return FleetReads(
        here.scope_of(settings),
        roster=roster or live_roster,
        queue=engine.queue,
        loop=engine.loop,
        budget_s=settings.history.fleet_read_budget_s,
        report=report,
        keeps_store=settings.node.data,
    )


def reader() -> FleetHistory:
    """The running engine's fleet reads; ``EngineAway(MISSING_FLEET)`` in a process without them (a web-only process).

    The read is refused there, never answered from one store's rows.
    """
    return runtime.service(FLEET_READS, missing=runtime.MISSING_FLEET)


__all__ = ["FleetReads", "NODE_PARTS", "for_engine", "live_roster", "node_part", "reader"]
