"""The jail runs a job in a real bubblewrap sandbox: what it can see and reach, its limits, its questions and its end.

Every job here is a short /bin/sh (or the system python3) script: no mocks,
each test starts one or two real sandboxes.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import pytest

from crewlet.company.sandbox import SandboxConfig
from seats.sandbox.errors import SandboxError, SandboxUnavailable
from seats.sandbox.jail import QUESTION_PREFIX, Job, JobEnd, bwrap_argv, check_available, prepare_workdir
from tests.waiting_support import eventually

PYTHON = "/usr/bin/python3"


def shell(script: str, **settings: Any) -> SandboxConfig:
    return SandboxConfig(command=("/bin/sh", "-c", script), **settings)


async def no_question(text: str) -> None:
    raise AssertionError(f"the job asked {text!r}")


async def run(
    config: SandboxConfig, tmp_path: Path, *, task: str = "the task", environ: Mapping[str, str] | None = None,
    on_question: Callable[[str], Awaitable[None]] = no_question, run_id: str = "run-1",
) -> JobEnd:
    workdir = prepare_workdir(config, tmp_path / "runs", run_id)
    job = await Job.start(config, run_id=run_id, task=task, workdir=workdir, on_question=on_question, environ=environ or {})
    return await job.wait()


async def test_without_network_the_job_cannot_reach_a_listener_on_the_nodes_loopback_and_with_it_it_can(tmp_path: Path) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=5).close(); print('reached')\n"
        "except OSError as exc:\n"
        "    print('unreachable', type(exc).__name__)\n"
    )
    async with server:
        closed = await run(SandboxConfig(command=(PYTHON, "-c", probe)), tmp_path, run_id="closed")
        opened = await run(SandboxConfig(command=(PYTHON, "-c", probe), network=True), tmp_path, run_id="opened")
    assert "unreachable" in closed.output and "reached" not in closed.output
    assert opened.output.strip() == "reached"


async def test_the_job_sees_workdir_from_at_work_and_nothing_else_of_the_host(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "readme.txt").write_text("from the seed\n")
    secret = tmp_path / "outside.txt"
    secret.write_text("host secret\n")
    script = (
        f"cat /work/readme.txt; pwd; echo made > /work/result.txt; "
        f"for p in {secret} {tmp_path} /root /work/main {Path.cwd()}; do test -e \"$p\" && echo \"SEEN $p\"; done; "
        "cat /etc/shadow >/dev/null 2>&1 && echo 'READ /etc/shadow'; "
        "grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status || echo 'HAS CAPABILITIES'; "
        "echo checked"
    )
    config = shell(script, workdir_from=str(seed))
    end = await run(config, tmp_path)
    assert end.exit_code == 0 and end.output.splitlines() == ["from the seed", "/work", "checked"]
    assert (tmp_path / "runs" / "run-1" / "work" / "result.txt").read_text() == "made\n"
    assert not (seed / "result.txt").exists()


async def test_only_the_listed_variables_that_are_set_get_in_beside_the_sandboxs_own(tmp_path: Path) -> None:
    config = shell("env | sort", env=("AGENT_API_KEY", "NOT_SET_ON_NODE"))
    environ = {"AGENT_API_KEY": "k-123 with spaces", "NODE_ONLY": "kept out", "PATH": "/node/path"}
    end = await run(config, tmp_path, task="fix the build\0--bind\0/\0/host", environ=environ)
    names = {line.split("=", 1)[0] for line in end.output.splitlines() if "=" in line}
    assert names == {"AGENT_API_KEY", "CREWLET_RUN_ID", "CREWLET_TASK", "HOME", "PATH", "PWD"}
    assert "AGENT_API_KEY=k-123 with spaces" in end.output and "CREWLET_RUN_ID=run-1" in end.output
    assert "HOME=/work" in end.output and "/node/path" not in end.output
    assert "CREWLET_TASK=fix the build--bind//host\n" in end.output  # a NUL in the task cannot smuggle in an option
    argv = bwrap_argv(config, tmp_path, environ)
    assert "kept out" not in argv and "--share-net" not in argv and argv[-3:] == list(config.command)


async def test_the_task_and_the_secrets_stay_off_bwraps_command_line(tmp_path: Path) -> None:
    asked = asyncio.Event()

    async def on_question(text: str) -> None:
        asked.set()

    config = shell(f'echo "{QUESTION_PREFIX}ready?"; read a', env=("AGENT_API_KEY",))
    workdir = prepare_workdir(config, tmp_path, "run-1")
    job = await Job.start(
        config, run_id="run-1", task="secret task text", workdir=workdir, on_question=on_question,
        environ={"AGENT_API_KEY": "key-value-42"},
    )
    await asyncio.wait_for(asked.wait(), 30)
    cmdline = Path(f"/proc/{job.pid}/cmdline").read_bytes()
    assert b"secret task text" not in cmdline and b"key-value-42" not in cmdline and b"--args" in cmdline
    await job.kill()


async def test_the_time_limit_kills_a_job_that_runs_past_it(tmp_path: Path) -> None:
    end = await run(shell("echo begun; sleep 60", time_limit_s=0.3), tmp_path)
    assert end.timed_out and not end.killed and end.exit_code == -9
    assert end.output == "begun\n"


async def test_a_question_round_trip_parks_the_clock_until_the_answer(tmp_path: Path) -> None:
    asked: list[str] = []

    async def on_question(text: str) -> None:
        asked.append(text)

    config = shell(f'echo working; echo "{QUESTION_PREFIX}which branch?"; read answer; echo "using $answer"', time_limit_s=1.5)
    workdir = prepare_workdir(config, tmp_path, "run-1")
    job = await Job.start(config, run_id="run-1", task="t", workdir=workdir, on_question=on_question, environ={})
    assert await job.answer("too early") is False
    await eventually(lambda: job.asking, 30.0, "the job to ask")
    assert asked == ["which branch?"]
    # Parked for longer than the whole time limit: a job started now with the same limit is killed by it first.
    witness = await run(shell("sleep 60", time_limit_s=1.5), tmp_path, run_id="witness")
    assert witness.timed_out and job.asking
    assert await job.answer("main\nplease")
    end = await job.wait()
    assert not end.timed_out and end.exit_code == 0 and end.duration_s < 1.5
    assert end.output == "working\nusing main please\n"
    assert await job.answer("late") is False


async def test_memory_mb_stops_a_job_that_allocates_more(tmp_path: Path) -> None:
    grab = "b = bytearray(400 * 1024 * 1024); print('allocated', len(b) >> 20)"
    small = await run(SandboxConfig(command=(PYTHON, "-c", grab), memory_mb=128), tmp_path, run_id="small")
    large = await run(SandboxConfig(command=(PYTHON, "-c", grab), memory_mb=2048), tmp_path, run_id="large")
    assert small.exit_code == 1 and "MemoryError" in small.output and "allocated" not in small.output
    assert large.exit_code == 0 and large.output == "allocated 400\n"


async def test_kill_ends_the_whole_sandbox_and_wait_says_killed(tmp_path: Path) -> None:
    config = shell("sleep 60 & echo started; wait")
    workdir = prepare_workdir(config, tmp_path, "run-1")
    job = await Job.start(config, run_id="run-1", task="t", workdir=workdir, on_question=no_question, environ={})
    waiters = [asyncio.create_task(job.wait()) for _ in range(2)]
    await job.kill()
    ends = await asyncio.gather(*waiters)
    assert ends[0] == ends[1] and ends[0].killed and not ends[0].timed_out and ends[0].exit_code == -9


async def test_an_exit_code_and_a_signal_inside_are_reported_as_the_process_had_them(tmp_path: Path) -> None:
    assert (await run(shell("echo out; echo err >&2; exit 7"), tmp_path, run_id="a")).exit_code == 7
    assert (await run(shell("kill -TERM $$"), tmp_path, run_id="b")).exit_code == -15


async def test_a_question_that_cannot_be_handed_on_ends_the_job_and_a_task_too_long_is_refused(tmp_path: Path) -> None:
    async def failing(text: str) -> None:
        raise RuntimeError("the store is away")

    end = await run(shell(f'echo "{QUESTION_PREFIX}anyone?"; read a; echo "answered $a"'), tmp_path, on_question=failing)
    assert end.killed and "answered" not in end.output
    with pytest.raises(SandboxError, match=r"^the task is 131072 bytes; at most \d+ fit in CREWLET_TASK$"):
        await Job.start(shell("true"), run_id="r", task="x" * 131072, workdir=tmp_path, on_question=no_question)


def test_a_fresh_workdir_replaces_what_a_previous_attempt_left(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    (seed / "src").mkdir(parents=True)
    (seed / "src" / "main.c").write_text("int main;\n")
    os.symlink("/root", seed / "link")
    config = shell("true", workdir_from=str(seed))
    first = prepare_workdir(config, tmp_path / "runs", "run-7")
    (first / "half-done.o").write_text("x")
    second = prepare_workdir(config, tmp_path / "runs", "run-7")
    assert second == tmp_path / "runs" / "run-7" / "work"
    assert sorted(p.name for p in second.iterdir()) == ["link", "src"] and (second / "link").is_symlink()
    assert prepare_workdir(shell("true"), tmp_path / "runs", "run-8").is_dir()


async def test_a_missing_bwrap_is_refused_with_its_reason(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match=r"^bwrap is not installed: '/nonexistent/bwrap' was not found"):
        check_available("/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="not installed"):
        await Job.start(shell("true"), run_id="r", task="t", workdir=tmp_path, on_question=no_question, bwrap="/nonexistent/bwrap")
    check_available()
