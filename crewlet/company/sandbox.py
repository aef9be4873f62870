"""Coding runs: the company file's ``sandbox`` key, the job a seat's ``sandbox_run`` tool starts and the jail it runs in.

A seat granted :data:`SANDBOX_TOOL` starts a detached job (a coding agent's
CLI, a build) that may run for hours inside a bubblewrap sandbox
(:mod:`seats.sandbox.jail`). This section says what that job is and what it
may touch: ``command`` (its argv; the task reaches it in ``CREWLET_TASK``),
the directory copied as each run's working directory, its running-time and
memory limits, the node variables passed in (by name: their values stay in
the node's environment and out of the file), whether it has a network at all,
which more host paths it may read, and how often a run lost with its node is
started again. Absent, no seat may be granted the tool.

Paths are checked for their form only (absolute, and not one the sandbox
mounts itself): the file may be validated on a machine other than the node
that runs the job, which checks that they exist when it prepares a run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Optional

from pydantic import BeforeValidator, Field

from crewlet.company.refusal import Check
from crewlet.company.shape import EnvName, FileModel, read_section, secretless, text, words

#: The company-file key.
SANDBOX_KEY = "sandbox"
#: The built-in tool a seat is granted by name in ``seats[].tools`` to start a coding run.
SANDBOX_TOOL = "sandbox_run"
#: How long a job may run, in seconds of running time (time parked on a question is not counted): a day at most.
TIME_LIMIT_RANGE = (1.0, 86400.0)
#: The job's address-space limit in MiB: below 64 not even a shell's libraries map; 64 GiB is a large build's.
MEMORY_MB_RANGE = (64, 65536)
#: How often a run lost with its node is started before it is failed.
MAX_ATTEMPTS_RANGE = (1, 10)
DEFAULT_TIME_LIMIT_S = 3600.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_MAX_ATTEMPTS = 2
#: The variables the sandbox sets itself; ``env`` may not name them.
SANDBOX_OWN_ENV = ("PATH", "HOME", "CREWLET_TASK", "CREWLET_RUN_ID")
#: What the sandbox mounts itself (the run's workdir, its own /proc and /dev): a read-only path may not be or lie under one.
_SANDBOX_MOUNTS = ("/work", "/proc", "/dev")

_COMMAND_RULE = "must be a non-empty list: [/absolute/path/of/program, args...]"
_PATH_RULE = "must be an absolute path"
_RO_RULE = "must be an absolute path other than / and outside /work, /proc and /dev (the sandbox's own mounts)"
_ENV_RULE = "must be a list of environment variable names (not " + ", ".join(SANDBOX_OWN_ENV) + ", which the sandbox sets)"
_DOTS = re.compile(r"(^|/)\.\.?(/|$)")


def _number_as_text(value: Any) -> Any:
    """YAML reads ``--max-turns 30``'s ``30`` as a number; a command's word is its text."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _absolute(value: str) -> Optional[str]:
    """An absolute path with no ``.``/``..`` step and no NUL: what it names is what a bind mount gets."""
    return None if value.startswith("/") and not _DOTS.search(value) and "\0" not in value else _PATH_RULE


def _read_only(value: str) -> Optional[str]:
    if _absolute(value) is not None:
        return _RO_RULE
    clean = value.rstrip("/") or "/"
    if clean == "/" or any(clean == m or clean.startswith(m + "/") for m in _SANDBOX_MOUNTS):
        return _RO_RULE
    return None


def _program(value: list[str]) -> Optional[str]:
    return None if value and _absolute(value[0]) is None else _COMMAND_RULE


_CommandWord = Annotated[
    str, BeforeValidator(_number_as_text), text(),
    secretless("looks like a credential: pass it through env: [ENV_VAR]"),
]
_Command = Annotated[list[_CommandWord], Field(min_length=1), Check(_program)]
_WORKDIR_RULE = "must be an absolute path of a directory other than /, or \"\" for an empty workdir"
_WorkdirFrom = Annotated[str, Check(lambda v: None if not v else _WORKDIR_RULE if _absolute(v) or not v.strip("/") else None)]
_ReadOnlyPath = Annotated[str, Check(_read_only)]
_JobEnv = Annotated[EnvName, Check(lambda v: _ENV_RULE if v in SANDBOX_OWN_ENV else None)]


@dataclass(frozen=True)
class SandboxConfig:
    """``sandbox``: the job a coding run starts and what its jail allows (see the module docstring)."""

    #: The job's argv; the task is given in ``CREWLET_TASK``.
    command: tuple[str, ...]
    #: A directory copied as each run's working directory ("" = an empty one).
    workdir_from: str = ""
    #: Running time the job may take (parked time is not counted); past it the job is killed.
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    #: Names of node environment variables passed into the sandbox (those that are set).
    env: tuple[str, ...] = ()
    #: False: the job has its own empty network namespace (no network at all).
    network: bool = False
    #: The job's address-space limit (RLIMIT_AS), in MiB.
    memory_mb: int = DEFAULT_MEMORY_MB
    #: More host paths visible read-only inside (where the CLI is installed).
    read_only_paths: tuple[str, ...] = ()
    #: How often a run lost with its node is started again before it is failed.
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


class SandboxFile(FileModel):
    """The ``sandbox`` section's shape."""

    command: _Command = Field(json_schema_extra={"missing": f"is required: {_COMMAND_RULE}", "allowed": _COMMAND_RULE})
    workdir_from: _WorkdirFrom = words("", _WORKDIR_RULE)
    time_limit_s: float = Field(default=DEFAULT_TIME_LIMIT_S, ge=TIME_LIMIT_RANGE[0], le=TIME_LIMIT_RANGE[1])
    env: list[_JobEnv] = words([], _ENV_RULE)
    network: bool = False
    memory_mb: int = Field(default=DEFAULT_MEMORY_MB, ge=MEMORY_MB_RANGE[0], le=MEMORY_MB_RANGE[1])
    read_only_paths: list[_ReadOnlyPath] = words([], "must be a list of absolute paths")
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=MAX_ATTEMPTS_RANGE[0], le=MAX_ATTEMPTS_RANGE[1])


def parse_sandbox(value: Any, source: Optional[str]) -> Optional[SandboxConfig]:
    """``sandbox: {command: [...], ...}``; absent is None (no seat may then be granted :data:`SANDBOX_TOOL`)."""
    if value is None:
        return None
    body = read_section(SandboxFile, value, SANDBOX_KEY, source)
    return SandboxConfig(
        command=tuple(body.command),
        workdir_from=body.workdir_from.rstrip("/"),
        time_limit_s=float(body.time_limit_s),
        env=tuple(dict.fromkeys(body.env)),
        network=body.network,
        memory_mb=body.memory_mb,
        read_only_paths=tuple(dict.fromkeys(p.rstrip("/") for p in body.read_only_paths)),
        max_attempts=body.max_attempts,
    )


__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIME_LIMIT_S",
    "MAX_ATTEMPTS_RANGE",
    "MEMORY_MB_RANGE",
    "SANDBOX_KEY",
    "SANDBOX_OWN_ENV",
    "SANDBOX_TOOL",
    "SandboxConfig",
    "TIME_LIMIT_RANGE",
    "parse_sandbox",
]
