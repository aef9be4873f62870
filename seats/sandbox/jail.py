"""The jail: one coding-run job in a real bubblewrap (``bwrap``) sandbox, its time limit, its questions and its end.

What the job sees is built from nothing: read-only binds of the system
directories (/usr, /bin, /lib, /lib64 where present, /etc), of its program's
own directory and of ``sandbox.read_only_paths``; the run's workdir
read-write at /work (its cwd and HOME); a fresh tmpfs /tmp, its own /proc and
/dev. Nothing else of the host exists inside (not /root, not the node's data
directory, not the project's checkout; /etc's secrets — shadow, sudoers,
ssh host keys, private TLS keys — are masked). ``--unshare-all`` gives it its
own user, pid, ipc, uts, cgroup and network namespaces, ``--cap-drop ALL`` no
capability in them; ``network: true`` keeps only the node's network
(``--share-net``). ``--clearenv`` drops the node's
environment: the job gets PATH, HOME=/work, CREWLET_TASK, CREWLET_RUN_ID and
the variables ``sandbox.env`` names that are set, nothing more.

Secrets stay off command lines. Every option (the ``--setenv`` values among
them: the task text, an API key) is handed to bwrap through a memfd read with
``--args FD``, so ``/proc/<pid>/cmdline`` of the bwrap process, which any user
of the host may read, shows only ``bwrap --args N -- <command>``; the command
itself was refused at load if a word of it looked like a credential.

Ending: bwrap is started in a session of its own (its process group is the
whole host-side tree), with ``--die-with-parent`` (the sandbox dies with the
node process; the kernel signals it when the thread that started the job
ends, so jobs are started from the long-lived event loop's thread) and a pid
namespace whose init is bwrap's (when it goes, the kernel kills every process
inside). :meth:`Job.kill` and the time limit
SIGKILL that process group. ``--new-session`` keeps the job off the node's
terminal.

Questions: a job asks a person by printing ``CREWLET-QUESTION: <text>`` as one
stdout line and then reading one line (the answer) from stdin. From that line
until :meth:`Job.answer` the job is parked: its time-limit clock stops.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Mapping, Optional

from crewlet.company.sandbox import SandboxConfig
from seats.sandbox.errors import SandboxError, SandboxUnavailable

log = logging.getLogger("crewlet.seats.sandbox")

#: A job asks a person by printing this and the question on one stdout line, then reads ONE line from stdin.
QUESTION_PREFIX = "CREWLET-QUESTION: "
#: Where the run's workdir is inside the sandbox: the job's cwd and HOME.
SANDBOX_WORKDIR = "/work"
#: The variables the jail sets itself (``sandbox.env`` may not name them: :data:`crewlet.company.sandbox.SANDBOX_OWN_ENV`).
TASK_VAR = "CREWLET_TASK"
RUN_ID_VAR = "CREWLET_RUN_ID"
#: The system directories every job sees read-only (each only where it exists on the node).
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/etc")
#: The node's secrets under /etc, masked where present: a node run as root maps the job's uid to root, the owner of them.
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/sudoers.d", "/etc/ssl/private")
_BASE_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
DEFAULT_OUTPUT_MAX_CHARS = 4000
#: The longest task in bytes: one environment string may hold 128 KiB (Linux's MAX_ARG_STRLEN), its name included.
MAX_TASK_BYTES = 128 * 1024 - len(TASK_VAR + "=") - 1
#: A line longer than this (a job printing without newlines) is kept as output in pieces, never as a question.
_LINE_MAX_BYTES = 65536
#: After the sandbox ends, how long its pipes may take to report end-of-file (every writer inside is dead by then).
_DRAIN_S = 5.0
#: How long check_available's trial sandbox may take.
_PROBE_S = 15.0
#: bwrap reports a job killed by signal N as exit code 128+N.
_SIGNAL_BASE = 128
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class JobEnd:
    """How a job ended."""

    #: The process's code; a negative signal number when a signal killed it (bwrap's 128+N is reported as -N).
    exit_code: int
    #: Killed for passing ``time_limit_s`` of running time.
    timed_out: bool
    #: Ended by :meth:`Job.kill` (or because its question could not be handed on: ``on_question`` raised).
    killed: bool
    #: The tail (the last ``output_max_chars``) of stdout and stderr, question lines excluded.
    output: str
    #: Running time in seconds; time parked on a question is not counted.
    duration_s: float


def _binds(config: SandboxConfig) -> list[str]:
    """The host directories the job sees read-only: the system's, its program's own, ``read_only_paths``; each once."""
    wanted = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    wanted.append(os.path.dirname(config.command[0]) or "/")
    wanted.extend(config.read_only_paths)
    kept: list[str] = []
    for path in wanted:
        if path not in kept and path != "/":
            kept.append(path)
    return kept


def _sandbox_path(config: SandboxConfig) -> str:
    program_dir = os.path.dirname(config.command[0])
    dirs = [program_dir] if program_dir and program_dir not in _BASE_PATH else []
    return ":".join([*dirs, *_BASE_PATH])


def bwrap_argv(config: SandboxConfig, workdir: Path, env: Mapping[str, str], *, bwrap: str = "bwrap") -> list[str]:
    """bwrap's whole argv for one job: ``[bwrap, options..., "--", *config.command]``.

    ``env``: the node's environment; only the names ``config.env`` lists that
    are set in it get in. The options carry values (the task, secrets): run
    it as :meth:`Job.start` does, the options through ``--args``.
    """
    argv = [bwrap, "--unshare-all"]
    if config.network:
        argv.append("--share-net")
    # No capability inside, even where the node runs as root (bwrap then keeps them unless told).
    argv += ["--cap-drop", "ALL", "--die-with-parent", "--new-session"]
    # /tmp, /proc and /dev first: a read-only path under /tmp is then bound over the fresh tmpfs, not hidden by it.
    argv += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
    for path in _binds(config):
        argv += ["--ro-bind", path, path]
    for path in MASKED_FILES:
        if os.path.isfile(path):
            argv += ["--ro-bind", "/dev/null", path]
    for path in MASKED_DIRS:
        if os.path.isdir(path):
            argv += ["--tmpfs", path, "--remount-ro", path]
    argv += ["--bind", str(workdir), SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR]
    argv += ["--clearenv", "--setenv", "PATH", _sandbox_path(config), "--setenv", "HOME", SANDBOX_WORKDIR]
    for name in config.env:
        if name in env:
            argv += ["--setenv", name, env[name]]
    return [*argv, "--", *config.command]


def prepare_workdir(config: SandboxConfig, root: Path, run_id: str) -> Path:
    """``root/run_id/work``, fresh: a copy of ``workdir_from`` (symlinks kept as links) or empty.

    What a previous attempt of the run left there is removed first, so a
    restarted run starts from the configured state, not a half-done one.
    """
    if not _RUN_ID.fullmatch(run_id):
        raise SandboxError(f"run id {run_id[:80]!r} is not a directory name (letters, digits, '.', '_', '-')")
    work = root / run_id / "work"
    if work.exists() or work.is_symlink():
        shutil.rmtree(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    if not config.workdir_from:
        work.mkdir()
        return work
    source = Path(config.workdir_from)
    if not source.is_dir():
        raise SandboxUnavailable(f"sandbox.workdir_from {config.workdir_from[:200]!r} is not a directory on this node")
    shutil.copytree(source, work, symlinks=True)
    return work


def check_available(bwrap: str = "bwrap") -> str:
    """``bwrap``'s path once it ran a trial sandbox on this node; :class:`SandboxUnavailable` (a one-line reason) if not."""
    path = shutil.which(bwrap)
    if path is None:
        raise SandboxUnavailable(f"bwrap is not installed: {bwrap[:200]!r} was not found (Debian: apt-get install bubblewrap)")
    probe = [path, "--unshare-all", "--die-with-parent"]
    for d in SYSTEM_DIRS:
        if os.path.lexists(d):
            probe += ["--ro-bind", d, d]
    probe += ["--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, errors="replace", timeout=_PROBE_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"bwrap could not be run: {type(exc).__name__}: {str(exc)[:200]}") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise SandboxUnavailable(f"bwrap cannot create its namespaces here: {reason[:200]}")
    return path


def _memory_limit(limit_bytes: int) -> Callable[[], None]:
    """The child's preexec: RLIMIT_AS set between fork and the exec of bwrap.

    Why here rather than ``prlimit``: set before bwrap starts, the limit holds
    from the first instruction of everything in the sandbox (every process
    inherits it through bwrap's forks), with no window in which the job runs
    unlimited (``prlimit --pid`` after the start has one) and no extra program
    on the node or in the job's argv. bwrap itself needs a few MiB, far below
    the smallest allowed limit (64). The function only makes the one syscall,
    so it is safe in the forked child of a threaded process.
    """
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def _exit_code(returncode: int) -> int:
    if _SIGNAL_BASE < returncode <= _SIGNAL_BASE + 64:
        return _SIGNAL_BASE - returncode
    return returncode


class Job:
    """One job running in its sandbox: its questions, its answers, its time limit and its end."""

    def __init__(
        self, proc: asyncio.subprocess.Process, config: SandboxConfig, run_id: str,
        on_question: Callable[[str], Awaitable[None]], output_max_chars: int,
    ) -> None:
        self._proc = proc
        self._run_id = run_id
        self._limit_s = config.time_limit_s
        self._on_question = on_question
        self._output_max = output_max_chars
        self._loop = asyncio.get_running_loop()
        self._used_s = 0.0
        self._since: Optional[float] = self._loop.time()  # start of the current running stretch; None while parked
        self._asking = False
        self._calling = False
        self._timed_out = False
        self._killed = False
        self._tail = ""
        self._changed = asyncio.Event()
        self._end: asyncio.Task[JobEnd] = asyncio.create_task(self._run(), name=f"sandbox-job-{run_id}")

    @classmethod
    async def start(
        cls, config: SandboxConfig, *, run_id: str, task: str, workdir: Path,
        on_question: Callable[[str], Awaitable[None]], environ: Mapping[str, str] = os.environ,
        bwrap: str = "bwrap", output_max_chars: int = DEFAULT_OUTPUT_MAX_CHARS, checked: bool = False,
    ) -> "Job":
        """Start the job in its sandbox; :class:`SandboxUnavailable` if this node cannot (bwrap, a path, the spawn).

        ``checked``: the caller already ran :func:`check_available` for ``bwrap``
        (a coordinator does once per node), so the trial sandbox is not run again.
        """
        path = shutil.which(bwrap) if checked else await asyncio.to_thread(check_available, bwrap)
        if path is None:
            raise SandboxUnavailable(f"bwrap is not installed: {bwrap[:200]!r} was not found")
        if not _RUN_ID.fullmatch(run_id):
            raise SandboxError(f"run id {run_id[:80]!r} is not a directory name (letters, digits, '.', '_', '-')")
        # The options travel NUL-separated: a NUL in the task would end its value and start an option of its own.
        task = task.replace("\0", "")
        size = len(task.encode("utf-8", "surrogateescape"))
        if size > MAX_TASK_BYTES:
            raise SandboxError(f"the task is {size} bytes; at most {MAX_TASK_BYTES} fit in {TASK_VAR}")
        if not workdir.is_dir():
            raise SandboxUnavailable(f"the run's workdir {str(workdir)[:200]!r} is not a directory")
        for needed in (config.command[0], *config.read_only_paths):
            if not os.path.exists(needed):
                raise SandboxUnavailable(f"{needed[:200]!r} does not exist on this node (sandbox.command, sandbox.read_only_paths)")
        own = {TASK_VAR: task, RUN_ID_VAR: run_id}
        argv = bwrap_argv(config, workdir, environ, bwrap=path)
        tail = len(config.command) + 1  # "--" and the command: on the real argv; the options go through --args
        options, command = argv[1:-tail], argv[-tail:]
        for name, value in own.items():
            options += ["--setenv", name, value]
        args_fd = os.memfd_create("crewlet-sandbox-args", os.MFD_CLOEXEC)
        try:
            os.write(args_fd, b"".join(o.encode("utf-8", "surrogateescape") + b"\0" for o in options))
            os.lseek(args_fd, 0, os.SEEK_SET)
            proc = await asyncio.create_subprocess_exec(
                path, "--args", str(args_fd), *command,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(args_fd,), start_new_session=True, preexec_fn=_memory_limit(config.memory_mb << 20),
            )
        except OSError as exc:
            raise SandboxUnavailable(f"bwrap could not be started: {type(exc).__name__}: {str(exc)[:200]}") from None
        finally:
            os.close(args_fd)
        log.info("sandbox_job_started", extra={
            "run_id": run_id, "pid": proc.pid, "network": config.network, "memory_mb": config.memory_mb,
            "time_limit_s": config.time_limit_s, "env_names": [n for n in config.env if n in environ],
        })
        return cls(proc, config, run_id, on_question, output_max_chars)

    @property
    def pid(self) -> int:
        """The host pid of the job's bwrap (its process group's id): what a log line or an operator can name."""
        return self._proc.pid

    @property
    def asking(self) -> bool:
        """A question is outstanding (the job is parked on stdin, its clock stopped)."""
        return self._asking

    async def answer(self, text: str) -> bool:
        """Hand the job the answer to its question as one line on its stdin and restart its clock.

        False, and nothing written, when no question is outstanding or the job
        is gone. A multi-line answer is joined into one line (the protocol's unit).
        """
        stdin = self._proc.stdin
        if not self._asking or self._end.done() or self._proc.returncode is not None or stdin is None:
            return False
        self._asking = False
        self._since = self._loop.time()
        self._changed.set()
        try:
            stdin.write((" ".join(text.splitlines()) + "\n").encode("utf-8", "replace"))
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return False
        log.info("sandbox_job_answered", extra={"run_id": self._run_id, "chars": len(text)})
        return True

    async def wait(self) -> JobEnd:
        """How the job ended (any number of callers; cancelling one leaves the job and the others alone)."""
        return await asyncio.shield(self._end)

    async def kill(self) -> None:
        """End the whole sandbox now; :meth:`wait` then reports ``killed=True``."""
        if not self._end.done():
            self._killed = True
            self._signal_kill()
        await self.wait()

    def _signal_kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _running_s(self) -> float:
        return self._used_s + (self._loop.time() - self._since if self._since is not None else 0.0)

    def _keep(self, text: str) -> None:
        self._tail = (self._tail + text)[-self._output_max:] if self._output_max > 0 else ""

    async def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        if text.startswith(QUESTION_PREFIX) and not self._asking and text[len(QUESTION_PREFIX):].strip():
            question = text[len(QUESTION_PREFIX):].strip()
            self._used_s, self._since, self._asking = self._running_s(), None, True
            self._changed.set()
            log.info("sandbox_job_asked", extra={"run_id": self._run_id, "chars": len(question)})
            self._calling = True
            try:
                await self._on_question(question)
            except Exception as exc:
                # Parked with no one told, the job would wait for an answer that cannot come, its clock stopped.
                log.error("sandbox_question_failed", extra={"run_id": self._run_id, "error": type(exc).__name__})
                self._killed = True
                self._signal_kill()
            finally:
                self._calling = False
            return
        self._keep(text + "\n")

    async def _read_stdout(self) -> None:
        stream = self._proc.stdout
        assert stream is not None
        pending = b""
        while chunk := await stream.read(_LINE_MAX_BYTES):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                await self._line(line)
            if len(pending) > _LINE_MAX_BYTES:
                self._keep(pending.decode("utf-8", "replace"))
                pending = b""
        if pending:
            self._keep(pending.decode("utf-8", "replace"))

    async def _read_stderr(self) -> None:
        stream = self._proc.stderr
        assert stream is not None
        while chunk := await stream.read(_LINE_MAX_BYTES):
            self._keep(chunk.decode("utf-8", "replace"))

    async def _run(self) -> JobEnd:
        readers = [asyncio.create_task(self._read_stdout()), asyncio.create_task(self._read_stderr())]
        exited = asyncio.create_task(self._proc.wait())
        try:
            while not exited.done():
                self._changed.clear()
                left_s = None if self._asking else self._limit_s - self._running_s()
                if left_s is not None and left_s <= 0:
                    self._timed_out = True
                    self._signal_kill()
                    await exited
                    break
                changed = asyncio.create_task(self._changed.wait())
                await asyncio.wait({exited, changed}, timeout=left_s, return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
            duration_s = self._running_s()
            self._since = None
            _, late = await asyncio.wait(readers, timeout=_DRAIN_S)
            for reader in late:
                if not self._calling:  # a reader inside on_question is the caller's code: it is let finish
                    reader.cancel()
            for failed in await asyncio.gather(*readers, return_exceptions=True):
                if isinstance(failed, Exception):
                    log.error("sandbox_output_unread", extra={"run_id": self._run_id, "error": type(failed).__name__})
        except asyncio.CancelledError:
            self._signal_kill()
            for reader in readers:
                reader.cancel()
            raise
        finally:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        self._asking = False
        returncode = exited.result()
        code = returncode if self._killed or self._timed_out else _exit_code(returncode)
        end = JobEnd(
            exit_code=code, timed_out=self._timed_out, killed=self._killed, output=self._tail, duration_s=duration_s,
        )
        log.info("sandbox_job_ended", extra={
            "run_id": self._run_id, "exit_code": end.exit_code, "timed_out": end.timed_out, "killed": end.killed,
            "duration_s": round(duration_s, 3),
        })
        return end


__all__ = ["JobEnd", "Job", "QUESTION_PREFIX", "bwrap_argv", "check_available", "prepare_workdir"]
