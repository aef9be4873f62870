"""A fleet read on the wire: the request every node receives, the reply each sends, and the reasons coverage names.

Request ``{version, asker, question, params, at}``: the asker's protocol
version, its node id, the question's kind, the rest of the question
(:meth:`~eventstore.questions.Question.to_dict` without kind, instant and
version) and the asker's instant in microseconds since the epoch — the store's
own resolution, so every node floors its history at exactly the same point.
Reply ``{version, node, answer}`` or ``{version, node, error}``. An answer
names, under :data:`~eventstore.questions.K_UNSETTLED` and only when there
are any, the rows of unsettled custody batches its read could reach; a
question's ``only`` restricts it to exactly those rows (:mod:`.kept`).

A reply over the transport's limit is cut rather than lost (:func:`fit`): a
node gives up rows from the least important end and says it holds more —
the oldest rows of a page (its cursor then stops above them), a long trace's
or turn's middle before its ending (``truncated``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import orjson

from crewlet.events import parse_timestamp
from crewlet.queue.errors import NoAnswer
from eventstore import questions as qs
from eventstore.questions import Question

K_VERSION = "version"
K_ASKER = "asker"
K_QUESTION = "question"
K_PARAMS = "params"
K_AT = "at"
#: The nodes the asker is asking: a node serving the subject that is not among them stays silent, so it never
#: takes the place of one that is (a gather stops at as many answers as it asked for).
K_TO = "to"
K_NODE = "node"
K_ANSWER = "answer"
K_ERROR = "error"
#: The asker's own server sees its own question: it says so at once and reads nothing.
K_OWN = "own"

# -- what coverage names, for a node that did not answer (each followed by ": " and the particulars) --
# A node refusing the question itself (no instant, a bad field) names the refusal's own reason instead.
REASONS: tuple[str, ...] = ("timed out", "protocol version", "unreadable reply", "read failed", "not asked")
TIMED_OUT, OTHER_VERSION, UNREADABLE, READ_FAILED, NOT_ASKED = REASONS


class UnreadableRequest(ValueError):
    """A request that is not a question this build can read."""


class NotAsked(NoAnswer):
    """This node serves the subject but is not among the nodes the asker asked: it stays silent."""


def reason(kind: str, detail: str) -> str:
    return f"{kind}: {detail}"


def encode_request(question: Question, asker: str, to: Optional[list[str]] = None) -> bytes:
    params = question.to_dict()
    for key in ("kind", "at", "version"):
        params.pop(key, None)
    at = qs.to_us(question.at) if question.at is not None else None
    body = {K_VERSION: question.version, K_ASKER: asker, K_QUESTION: question.kind, K_PARAMS: params, K_AT: at}
    if to is not None:
        body[K_TO] = to
    return orjson.dumps(body)


@dataclass(frozen=True)
class Request:
    version: Any
    asker: str
    raw: dict[str, Any]

    def asks(self, node: str) -> bool:
        """Whether ``node`` is one of the nodes asked (a request naming none asks every node)."""
        to = self.raw.get(K_TO)
        return not isinstance(to, list) or node in to

    def question(self) -> Question:
        """The question; one that carries no instant keeps ``at`` None (the node refuses it, it never guesses)."""
        params = self.raw.get(K_PARAMS)
        if not isinstance(params, dict):
            raise UnreadableRequest("params must be an object")
        try:
            question = Question.from_dict({**params, "kind": self.raw.get(K_QUESTION), "version": self.version, "at": None})
        except (TypeError, ValueError) as exc:
            raise UnreadableRequest(f"params: {exc}") from None
        at = self.raw.get(K_AT)
        if isinstance(at, bool) or (at is not None and not isinstance(at, int)):
            raise UnreadableRequest("at must be whole microseconds since the epoch")
        return dataclasses.replace(question, at=qs.from_us(at)) if at is not None else question


def decode_request(raw: bytes) -> Request:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UnreadableRequest(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UnreadableRequest("not a JSON object")
    asker = data.get(K_ASKER)
    return Request(version=data.get(K_VERSION), asker=asker if isinstance(asker, str) else "", raw=data)


class Reply(NamedTuple):
    """A node's reply as the asker reads it: an answer, or the error that stands for one, or its own server's nod."""

    node: str
    version: Any
    answer: Optional[dict[str, Any]]
    error: str
    own: bool


def encode_reply(version: int, node: str, *, answer: Optional[dict[str, Any]] = None, error: str = "", own: bool = False) -> bytes:
    body: dict[str, Any] = {K_VERSION: version, K_NODE: node}
    if own:
        body[K_OWN] = True
    elif error:
        body[K_ERROR] = error
    else:
        body[K_ANSWER] = answer
    return orjson.dumps(body)




def decode_reply(raw: bytes) -> Optional[Reply]:
    """The reply, or None when not even its node can be read."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get(K_NODE), str):
        return None
    answer = data.get(K_ANSWER)
    error = data.get(K_ERROR)
    return Reply(
        node=data[K_NODE],
        version=data.get(K_VERSION),
        answer=answer if isinstance(answer, dict) else None,
        error=error if isinstance(error, str) else ("" if answer is not None or data.get(K_OWN) else "no answer in the reply"),
        own=data.get(K_OWN) is True,
    )


# -- a reply that fits ----------------------------------------------------------------------


def _row_us(row: dict[str, Any]) -> int:
    return qs.to_us(parse_timestamp(row["timestamp"]))


def _middle_out(rows: list[Any], keep: int) -> list[Any]:
    """The first and last rows kept, the middle given up: a long turn's ending matters more than its middle."""
    if keep >= len(rows):
        return rows
    head = keep // 2
    return rows[:head] + rows[len(rows) - (keep - head):] if keep > head else rows[:head]


def _cut_page(answer: dict[str, Any], keep: int) -> dict[str, Any]:
    rows = answer["events"][:keep]
    cursor = qs.encode_cursor(qs.EVENTS_CURSOR, _row_us(rows[-1]), rows[-1]["id"]) if rows else answer.get("next_cursor")
    return {**answer, "events": rows, "next_cursor": cursor}


def _cut_turns(answer: dict[str, Any], keep: int) -> dict[str, Any]:
    return {**answer, "turns": answer["turns"][:keep], "more": True}


def _cut_trace(answer: dict[str, Any], keep: int) -> dict[str, Any]:
    return {**answer, "rows": _middle_out(answer["rows"], keep), "truncated": True}


def _cut_turn_rows(answer: dict[str, Any], keep: int) -> dict[str, Any]:
    """The longest turn's middle first: its rows cut to ``keep``."""
    turns = dict(answer["turns"])
    if not turns:
        return answer
    longest = max(turns, key=lambda t: len(turns[t]["rows"]))
    turns[longest] = {**turns[longest], "rows": _middle_out(turns[longest]["rows"], keep), "truncated": True}
    return {**answer, "turns": turns}


def _rows_of(kind: str, answer: dict[str, Any]) -> int:
    if kind == qs.TURN_ROWS:
        return max((len(t["rows"]) for t in answer["turns"].values()), default=0)
    return len(answer[_ROWS_KEY[kind]])


_ROWS_KEY = {qs.EVENTS: "events", qs.TURNS: "turns", qs.TRACE: "rows"}
_CUTS: dict[str, Callable[[dict[str, Any], int], dict[str, Any]]] = {
    qs.EVENTS: _cut_page,
    qs.TURNS: _cut_turns,
    qs.TRACE: _cut_trace,
    qs.TURN_ROWS: _cut_turn_rows,
}


class ReplyTooLarge(ValueError):
    """An answer that cannot be cut to fit (one event whose body alone is over the limit)."""


def fit(kind: str, version: int, node: str, answer: dict[str, Any], limit: int) -> bytes:
    """The encoded reply, cut to ``limit`` bytes from the least important end when it is over."""
    data = encode_reply(version, node, answer=answer)
    cut = _CUTS.get(kind)
    while len(data) > limit:
        rows = _rows_of(kind, answer) if cut is not None else 0
        if cut is None or rows <= 1:
            raise ReplyTooLarge(f"the answer is {len(data)} bytes, over the transport's {limit}")
        keep = min(rows - 1, max(1, int(rows * limit / len(data) * 0.9)))
        answer = cut(answer, keep)
        data = encode_reply(version, node, answer=answer)
    return data


__all__ = [
    "NOT_ASKED",
    "NotAsked",
    "OTHER_VERSION",
    "READ_FAILED",
    "REASONS",
    "Reply",
    "ReplyTooLarge",
    "Request",
    "TIMED_OUT",
    "UNREADABLE",
    "UnreadableRequest",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
    "fit",
    "reason",
]
