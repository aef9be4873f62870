"""Learning bodies: what a seat's turn leaves behind (episodes, profiles, reflections), its skills' life, the knowledge it read, compaction."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from crewlet.events.registry import LEARNING, register
from crewlet.events.types.base import _PhaseBody, _plural, _s, _SeatBody, _tail, _TurnBody
from crewlet.events.types.phrases import VIA_GET_PAGE, VIA_SEARCH

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.events.envelope import Event



@register("turn_completed", category=LEARNING)
class TurnCompleted(_TurnBody):
    """A finished turn handed to reflection on the node holding the seat."""

    work_item: Optional[dict[str, Any]] = None

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} handed a finished turn to reflection"


@register("episode_written", category=LEARNING)
class EpisodeWritten(_TurnBody):
    episode_id: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} recorded an episode" + _tail(self.conversation_key, " for ")


@register("persist_decider_completed", category=LEARNING)
class PersistDeciderCompleted(_TurnBody):
    persisted: bool = False
    reason: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        verdict = "kept" if self.persisted else "did not keep"
        return f"{self.actor(event)} {verdict} what it learned" + _tail(self.reason)


@register("counterparty_profile_updated", category=LEARNING)
class CounterpartyProfileUpdated(_TurnBody):
    counterparty: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} updated what it knows about {_s(self.counterparty) or 'someone'}"


@register("reflection_completed", category=LEARNING)
class ReflectionCompleted(_TurnBody):
    """A reflection on one finished turn ended; ``rows`` names each memory row it wrote (``{table, key}``)."""

    insights: int = 0
    duration_ms: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} reflected on a turn ({_plural(self.insights, 'insight')})"


@register(
    "memory_row",
    category=LEARNING,
    stored=False,
    extension=(
        "a seat's memory is one message per row on CREWLET_MEMORY (crewlet.memory.{handle}.{table}.{key-digest}); "
        "this is that message, the row's current value or its tombstone, which a node acquiring the seat replays"
    ),
)
@dataclass
class MemoryRow(_TurnBody):
    """One memory row as its subject holds it: ``value`` (JSON), or ``deleted`` (a tombstone the replay honours).

    Never a row of the event store (state replicated through the broker, not
    a record); ``written_by`` is ``turn``, ``reflection`` or ``operator``.
    """

    table: str = ""
    key: str = ""
    value: Any = None
    deleted: bool = False
    written_by: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        verb = "forgot" if self.deleted else "remembered"
        return f"{self.actor(event)} {verb} {_s(self.table)}/{_s(self.key)}"


@dataclass
class _SkillBody(_SeatBody):
    skill_id: str = ""
    skill_name: str = ""
    version: int = 0
    turn_id: str = ""
    reason: str = ""

    def _skill(self) -> str:
        return _s(self.skill_name) or _s(self.skill_id) or "a skill"

    _verb = "changed"

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} {self._verb} skill {self._skill()}" + _tail(self.reason)


def _skill_type(type_name: str, class_name: str, verb: str) -> type[_SkillBody]:
    """A step of a skill's life that carries nothing beyond the skill: its own wire type, told apart by the verb."""
    body = type(class_name, (_SkillBody,), {"_verb": verb, "__module__": __name__, "__qualname__": class_name})
    return register(type_name, category=LEARNING)(body)


SkillSynthesized = _skill_type("skill_synthesized", "SkillSynthesized", "wrote")
SkillRefined = _skill_type("skill_refined", "SkillRefined", "refined")
SkillPromoted = _skill_type("skill_promoted", "SkillPromoted", "promoted")


@register("skill_used", category=LEARNING)
class SkillUsed(_SkillBody):
    """A seat loaded a skill; a company-published one names the page it was read from.

    ``source_page_id`` / ``source_container`` are absent (empty) on a skill the
    seat synthesized for itself.
    """

    phase: str = ""
    source_page_id: str = ""
    source_container: str = ""
    _verb = "used"


SkillStaled = _skill_type("skill_staled", "SkillStaled", "marked stale")
SkillArchived = _skill_type("skill_archived", "SkillArchived", "archived")
SkillRevived = _skill_type("skill_revived", "SkillRevived", "revived")


@register("prefetch_summary", category=LEARNING)
class PrefetchSummary(_TurnBody):
    """The turn-start knowledge block: how much was put in front of the seat."""

    pages: int = 0
    bytes: int = 0
    duration_ms: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} started its turn with {_plural(self.pages, 'page')} of context"


@register("knowledge_read", category=LEARNING)
class KnowledgeRead(_PhaseBody):
    """One act of reading the knowledge base, listing the pages it reached.

    ``pages`` is ``[{id, container, title, rank}]`` (rank on a ranked answer
    only), ``backend`` the store their ids address, ``via`` one of
    KNOWLEDGE_VIAS, ``query`` a search's text clipped to QUERY_MAX_BYTES (use
    ``clip_query``). A read reaching no page, or with no seat, publishes nothing.
    """

    pages: list[dict[str, Any]] = field(default_factory=list)
    backend: str = ""
    via: str = ""
    query: str = ""

    def summary(self, event: Optional[Event] = None) -> str:
        how = {VIA_SEARCH: "searched and read", VIA_GET_PAGE: "read"}.get(_s(self.via), "read")
        q = f' for "{_s(self.query)}"' if _s(self.query) else ""
        return f"{self.actor(event)} {how} {_plural(len(self.pages), 'page')}{q}"


@register("compaction_requested", category=LEARNING)
class CompactionRequested(_PhaseBody):
    reason: str = ""
    tokens: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} asked to compact its context" + _tail(self.reason)


@register("compaction_completed", category=LEARNING)
class CompactionCompleted(_PhaseBody):
    tokens_before: int = 0
    tokens_after: int = 0

    def summary(self, event: Optional[Event] = None) -> str:
        return f"{self.actor(event)} compacted its context from {self.tokens_before} to {self.tokens_after} tokens"
