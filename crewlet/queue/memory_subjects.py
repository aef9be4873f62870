"""The in-memory twin's replay and purge by subject pattern (``Transport.read_subjects`` / ``purge_subjects``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from crewlet.queue import topics

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.queue.memory import MemoryBroker


def read_subjects(broker: "MemoryBroker", spec: topics.StreamSpec, pattern: str) -> list[tuple[str, bytes]]:
    """The last message of each matching subject, in stream order (what ``last_per_subject`` serves)."""
    broker._reach()
    stream = broker._stream(spec)
    last: dict[str, int] = {}
    for seq in sorted(stream.messages):
        stored = stream.messages[seq]
        if topics.matches(pattern, stored.subject):
            last[stored.subject] = seq
    return [(subject, stream.messages[seq].data) for subject, seq in sorted(last.items(), key=lambda kv: kv[1])]


def purge_subjects(broker: "MemoryBroker", spec: topics.StreamSpec, pattern: str) -> int:
    broker._reach()
    stream = broker._stream(spec)
    gone = [seq for seq, stored in stream.messages.items() if topics.matches(pattern, stored.subject)]
    for seq in gone:
        broker._drop(stream, seq)
    return len(gone)
