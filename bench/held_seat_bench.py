"""What a seat's mail costs while a coding run holds the seat: broker and client CPU, held vs an empty seat, same run.

    .venv/bin/python bench/held_seat_bench.py [--messages 2000] [--window 10]

One embedded nats-server (file-backed, as ``up`` runs it) and one
JetStreamQueue client with a seat's inbox attached the way a seat's loop
attaches it (``subscribe_batch``). The baseline is the same attachment with
no mail and no hold, measured first in the same run: CPU seconds per second
of the nats-server process and of this (client) process over ``--window``.
Then ``--messages`` wakes are published to the seat while its inbox is held
(the ``sandbox`` hold key, as a run takes it) and the same window is
measured again: the ratio held / empty is what the waiting mail costs (1.0x:
nothing). Deliveries and redeliveries while held are counted from the
handler and the broker's consumer info (0 and 0 expected). Last, the hold is
lifted and the time until every wake was handled once is printed.
Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from crewlet.events import Event  # noqa: E402
from crewlet.queue import BatchOptions, Timings, topics  # noqa: E402
from crewlet.queue.broker import EmbeddedBroker  # noqa: E402
from crewlet.queue.contract import Outcome, Partition  # noqa: E402
from crewlet.queue.jetstream import JetStreamQueue  # noqa: E402

SEAT = "benchseat"
HOLD = "sandbox"
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def window(pid: int, seconds: float) -> tuple[float, float]:
    """(broker, client) CPU seconds per second over ``seconds`` of the event loop idling as a node would."""
    broker0, client0, t0 = cpu_s(pid), time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - t0
    return (cpu_s(pid) - broker0) / elapsed, (time.process_time() - client0) / elapsed


async def main(messages: int, seconds: float) -> None:
    inbox, group = topics.agent_inbox(SEAT), topics.agent_inbox_group(SEAT)
    handled: list[str] = []

    async def handler(partition: Partition) -> Outcome:
        handled.extend(d.event.id for d in partition.deliveries if d.remaining == 24)
        return Outcome.ACK

    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedBroker(store_dir=Path(tmp) / "js") as broker:
            assert broker.pid is not None
            queue = await JetStreamQueue.connect(broker.url, node="bench", timings=Timings())
            try:
                await queue.ensure_subscription(inbox, group)
                await queue.subscribe_batch(inbox, group, BatchOptions(linger_s=0.0, max_batch=20), handler)
                empty = await window(broker.pid, seconds)

                await queue.hold(inbox, group, HOLD)
                for i in range(messages):
                    await queue.publish(inbox, Event(type="external_notification", payload={"seat": SEAT, "body": f"wake {i}"}))
                before = await queue.transport.consumer_info(inbox, group)  # type: ignore[attr-defined]
                held = await window(broker.pid, seconds)
                after = await queue.transport.consumer_info(inbox, group)  # type: ignore[attr-defined]
                during = len(handled)

                released = time.perf_counter()
                await queue.release(inbox, group, HOLD)
                while len(handled) < messages:
                    await asyncio.sleep(0.01)
                drain_s = time.perf_counter() - released
            finally:
                await queue.close()

    delivered = (after or {}).get("delivered", {}).get("consumer_seq", 0) - (before or {}).get("delivered", {}).get("consumer_seq", 0)
    print(f"held seat bench: {messages} wakes waiting on a held seat, {seconds:g} s windows, {os.cpu_count()} cores")
    for name, e, h in (("nats-server CPU", empty[0], held[0]), ("client CPU", empty[1], held[1])):
        ratio = h / e if e > 0 else float("inf") if h > 0 else 1.0
        print(f"{name:<18} held {h * 1e3:8.2f} ms/s   empty seat {e * 1e3:8.2f} ms/s   ratio {ratio:.2f}x (target 1.0x)")
    print(f"while held: handled {during}, broker deliveries {delivered}, pending {(after or {}).get('num_pending')}")
    print(f"after the hold lifted: {len(handled)} handled once each in {drain_s:.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.window))
