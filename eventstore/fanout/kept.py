"""Rows two stores hold for a moment: every round of a fleet read asked so that each row counts once.

Design (Reading the fleet's history: "A stateless node's row can sit on two
data nodes for a moment"). A stateless node hands its events to a data node in
custody batches, and a batch whose claim failed can be written by a second
keeper before the first has settled it: until then two stores hold the same
rows (same ids), unsettled on one or both, or settled on one and not yet
dropped by the other.

So every round of every plan (:mod:`.merge`) is asked through
:func:`kept_round`, and a plan receives parts in which each row is held once:

1. Every answering node counts and lists the rows it keeps settled, and names
   by id (:data:`~eventstore.questions.K_UNSETTLED`) the unsettled rows the
   question could reach. A fleet with no unsettled row names nothing, and the
   round ends here.
2. Otherwise every node that answered is asked ``kept``: which of the named
   ids it keeps settled. Those a node keeps and did not name it counted
   already; they are skipped.
3. Each remaining id is given to one node that named it (:func:`keepers`), and
   that node is asked the round's own question restricted to its ids
   (``only``): the part it sends is added to the round's parts, so every merge
   (pages by (timestamp, id), bars, counts, turns, spend) holds the row once.

A node that does not answer ``kept`` or its restricted question is named in
the coverage like any node that did not answer, and its part of the round is
left out whole: the answer is the fleet's without it, never one that counts a
row twice or drops one silently.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generator, Optional, Sequence

from eventstore import questions as qs
from eventstore.fanout.merge import Parts
from eventstore.questions import Question

#: One node's reply as the runner reads it: (its answer, "") or (None, why it has none).
NodeReply = tuple[Optional[dict[str, Any]], str]
#: A question and the nodes it is put to (this node among them when its own store answers).
Ask = tuple[Question, tuple[str, ...]]
#: A round's exchanges: it yields the asks to put at once, receives each ask's replies by node, returns the parts.
Exchange = Generator[list[Ask], list[dict[str, NodeReply]], Parts]


def named_of(answer: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The unsettled row ids a part names, and those of them its node's claims say it keeps (both popped from it:
    the plans never see the keys)."""
    named, own = answer.pop(qs.K_UNSETTLED, None), answer.pop(qs.K_UNSETTLED_OWN, None)
    return ([str(i) for i in named] if isinstance(named, list) else [], [str(i) for i in own] if isinstance(own, list) else [])


def keepers(
    wanted: Sequence[str], named: dict[str, set[str]], kept: dict[str, set[str]], own: Optional[dict[str, set[str]]] = None
) -> dict[str, tuple[str, ...]]:
    """Each named id no part counted, given to one node that named it: {node: its ids}.

    A node that keeps an id settled and did not name it counted it in its
    part: the id is skipped. One that named it and keeps it settled now has
    settled it since (it was its own batch): it did not count it, and it is
    the node to ask, as it will not drop the row. Next, a node whose claim
    names the row's batch (``own``): it will keep the row, where another
    holder's settle pass may drop its copy before it is asked. Otherwise the
    lowest node id that named it is asked.
    """
    own = own or {}
    given: dict[str, list[str]] = {}
    for row_id in wanted:
        if any(row_id in ids and row_id not in named.get(node, ()) for node, ids in kept.items()):
            continue
        namers = sorted(node for node, ids in named.items() if row_id in ids)
        if namers:
            holder = next(
                (node for node in namers if row_id in kept.get(node, ())),
                next((node for node in namers if row_id in own.get(node, ())), namers[0]),
            )
            given.setdefault(holder, []).append(row_id)
    return {node: tuple(ids) for node, ids in sorted(given.items())}


def kept_round(
    question: Question,
    nodes: Sequence[str],
    note: Callable[[str, str], None],
    asked_kept: Callable[[int], None],
) -> Exchange:
    """One round of a plan: ``question`` put to ``nodes`` (in part order), each row of the parts held once.

    ``note(node, error)`` records a node's coverage; ``asked_kept(n)`` that
    ``kept`` was asked about ``n`` named rows.
    """
    [first] = yield [(question, tuple(nodes))]
    parts: dict[str, dict[str, Any]] = {}
    for node in nodes:
        answer, error = first.get(node, (None, "no answer"))
        note(node, error)
        if answer is not None:
            parts[node] = answer
    naming = {node: named_of(answer) for node, answer in parts.items()}
    named = {node: set(ids) for node, (ids, _) in naming.items()}
    own = {node: set(ids) for node, (_, ids) in naming.items()}
    wanted = sorted(set().union(*named.values())) if named else []
    if not wanted:
        return [(node, parts[node]) for node in nodes if node in parts]
    asked_kept(len(wanted))
    answering = tuple(node for node in nodes if node in parts)
    kept = Question(kind=qs.KEPT, at=question.at, version=question.version, keys=tuple(wanted))
    [replies] = yield [(kept, answering)]
    kept_by: dict[str, set[str]] = {}
    for node in answering:
        answer, error = replies.get(node, (None, "no answer"))
        if answer is None:
            _leave_out(node, error, parts, named, note)
        else:
            kept_by[node] = {str(i) for i in answer[qs.K_KEPT]}
    given = keepers(wanted, named, kept_by, own)
    added: Parts = []
    if given:
        asks: list[Ask] = [(dataclasses.replace(question, only=ids), (node,)) for node, ids in given.items()]
        for (_, (node, *_)), got in zip(asks, (yield asks)):
            answer, error = got.get(node, (None, "no answer"))
            if answer is None:
                _leave_out(node, error, parts, named, note)
            else:
                named_of(answer)
                added.append((node, answer))
    return [(node, parts[node]) for node in nodes if node in parts] + [(node, a) for node, a in added if node in parts]


def _leave_out(node: str, error: str, parts: dict[str, Any], named: dict[str, set[str]], note: Callable[[str, str], None]) -> None:
    note(node, error)
    parts.pop(node, None)
    named.pop(node, None)


__all__ = ["Ask", "Exchange", "NodeReply", "keepers", "kept_round", "named_of"]
