"""The memory block of a turn's prompt: what the seat remembers about the people it is talking to, and about the message.

Put before the message in the turn's user prompt: the ``counterparty`` rows
of the trigger's senders (keyed by the identity the wake names them by), then
the top few search hits for the trigger's words, bounded in rows and bytes.
Its size is recorded in the turn's ``prompt.size`` (``memory_bytes``,
``memory_rows``). A seat with no ``memory`` grant and no reflection has no
block; a store that cannot be read costs the block, never the turn.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass

from crewlet.base.db import in_store
from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.base.logfmt import short_reason
from crewlet.company.org import MEMORY_TOOL, Seat
from crewlet.events.types import PromptSize
from seats.memory import store
from seats.memory.rows import COUNTERPARTY_TABLE
from seats.turn_types import Trigger

log = logging.getLogger("crewlet.seats.memory")

#: The people of one conversation looked up, at most.
BLOCK_PEOPLE_MAX = 8
#: Search hits for the trigger, at most.
BLOCK_HITS = 3
#: The block's size bound in UTF-8 bytes: a row that would pass it is left out.
BLOCK_MAX_BYTES = 2048
BLOCK_HEADING = "What you remember (your memory; update it with your memory tools):"
#: A row's value is shown clipped to this many characters.
_VALUE_CHARS = 400


@dataclass(frozen=True)
class MemoryBlock:
    text: str = ""
    rows: int = 0

    @property
    def bytes(self) -> int:
        return len(self.text.encode("utf-8"))


def remembers(seat: Seat) -> bool:
    """Whether the seat has a memory its turns are given: granted the tools, or reflecting."""
    return MEMORY_TOOL in seat.tools or seat.reflection != "off"


def senders(trigger: Trigger) -> list[str]:
    """The identities the trigger's wakes name their senders by, each once, in order."""
    seen: list[str] = []
    for event in trigger.events:
        sender = event.field("sender")
        if isinstance(sender, str) and sender.strip() and sender not in seen:
            seen.append(sender)
    return seen[:BLOCK_PEOPLE_MAX]


def _read(handle: str, people: list[str], query: str) -> list[store.Row]:
    rows = store.about(handle, COUNTERPARTY_TABLE, people) if people else []
    have = {(r.table, r.key) for r in rows}
    rows += [r for r in store.search(handle, query, BLOCK_HITS + len(rows)) if (r.table, r.key) not in have][:BLOCK_HITS]
    return rows


def render(rows: list[store.Row]) -> MemoryBlock:
    lines, size, used = [BLOCK_HEADING], len(BLOCK_HEADING.encode("utf-8")), 0
    for row in rows:
        value = row.value if isinstance(row.value, str) else json.dumps(row.value, ensure_ascii=False, sort_keys=True)
        line = f"- {row.table}/{row.key}: {value[:_VALUE_CHARS]}"
        if size + len(line.encode("utf-8")) + 1 > BLOCK_MAX_BYTES:
            continue
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
        used += 1
    return MemoryBlock("\n".join(lines) + "\n\n", used) if used else MemoryBlock()


async def memory_block(seat: Seat, trigger: Trigger) -> MemoryBlock:
    if not remembers(seat):
        return MemoryBlock()
    try:
        rows = await in_store(_read, alias=EVENTS_ALIAS)(seat.handle, senders(trigger), trigger.prompt())
    except Exception as exc:
        log.warning("seat_memory_block_unread", extra={"seat": seat.handle, "turn_id": trigger.turn_id, "error": short_reason(exc)})
        return MemoryBlock()
    return render(rows)


def sized(size: PromptSize, block: MemoryBlock) -> PromptSize:
    """``prompt.size`` with the memory block's share of the user prompt."""
    return dataclasses.replace(size, memory_bytes=block.bytes, memory_rows=block.rows)


__all__ = ["BLOCK_HITS", "BLOCK_MAX_BYTES", "MemoryBlock", "memory_block", "remembers", "render", "senders", "sized"]
