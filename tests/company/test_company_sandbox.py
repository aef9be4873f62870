"""The company file's ``sandbox`` key: what a coding run's job is and what its jail allows, refused at load when bad."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from crewlet.company.fields import CompanyError
from crewlet.company.org import BUILTIN_TOOLS
from crewlet.company.parse import parse_company
from crewlet.company.sandbox import SANDBOX_TOOL, SandboxConfig

BASE: dict[str, Any] = {"org": "acme", "seats": [{"handle": "ada"}]}
JOB = {"command": ["/usr/local/bin/claude", "-p"]}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "company-file.md"


def refused(**overrides: Any) -> str:
    with pytest.raises(CompanyError) as info:
        parse_company({**BASE, **overrides}, source="acme.yaml")
    return str(info.value)


def test_a_company_without_a_sandbox_section_has_none_and_the_tool_is_a_builtin() -> None:
    assert parse_company(BASE).sandbox is None
    assert SANDBOX_TOOL in BUILTIN_TOOLS


def test_a_sandbox_section_with_only_its_command_takes_every_default() -> None:
    assert parse_company({**BASE, "sandbox": JOB}).sandbox == SandboxConfig(
        command=("/usr/local/bin/claude", "-p"), workdir_from="", time_limit_s=3600.0, env=(), network=False,
        memory_mb=2048, read_only_paths=(), max_attempts=2,
    )


def test_every_key_is_read_and_a_seat_may_then_be_granted_sandbox_run() -> None:
    org = parse_company({
        "org": "acme", "seats": [{"handle": "ada", "tools": ["sandbox_run", "memory"]}],
        "sandbox": {
            "command": ["/opt/agent/bin/agent", "--max-turns", 30], "workdir_from": "/srv/checkout/", "time_limit_s": 90,
            "env": ["AGENT_API_KEY", "AGENT_API_KEY", "OTHER"], "network": True, "memory_mb": 4096,
            "read_only_paths": ["/opt/agent/", "/opt/node"], "max_attempts": 3,
        },
    })
    assert org.sandbox == SandboxConfig(
        command=("/opt/agent/bin/agent", "--max-turns", "30"), workdir_from="/srv/checkout", time_limit_s=90.0,
        env=("AGENT_API_KEY", "OTHER"), network=True, memory_mb=4096, read_only_paths=("/opt/agent", "/opt/node"),
        max_attempts=3,
    )
    assert org.seats[0].tools == ("sandbox_run", "memory")


def test_a_seat_granted_sandbox_run_without_a_sandbox_section_is_refused_naming_the_seat() -> None:
    text = refused(seats=[{"handle": "ada"}, {"handle": "bob", "tools": ["sandbox_run"]}])
    assert text == (
        "seats.bob.tools='sandbox_run': needs the company's sandbox section "
        "(the job it starts: sandbox: {command: [...]}) (in acme.yaml)"
    )


@pytest.mark.parametrize(
    "section, message",
    [
        ({}, "sandbox.command=None: is required: must be a non-empty list: [/absolute/path/of/program, args...]"),
        ({"command": []}, "sandbox.command=[]: must be a non-empty list: [/absolute/path/of/program, args...]"),
        ({"command": ["claude", "-p"]}, "sandbox.command=['claude', '-p']: must be a non-empty list: [/absolute/path/of/program, args...]"),
        ({**JOB, "command": ["/bin/agent", ""]}, "sandbox.command[1]='': must be a non-empty string"),
        ({**JOB, "workdir_from": "src"}, "sandbox.workdir_from='src': must be an absolute path of a directory other than /, or \"\" for an empty workdir"),
        ({**JOB, "workdir_from": "/"}, "sandbox.workdir_from='/': must be an absolute path of a directory other than /, or \"\" for an empty workdir"),
        ({**JOB, "time_limit_s": 0.5}, "sandbox.time_limit_s=0.5: must be between 1 and 86400"),
        ({**JOB, "time_limit_s": 86401}, "sandbox.time_limit_s=86401: must be between 1 and 86400"),
        ({**JOB, "env": ["A B"]}, "sandbox.env[0]='A B': must be an environment variable name"),
        ({**JOB, "env": ["HOME"]},
         "sandbox.env[0]='HOME': must be a list of environment variable names (not PATH, HOME, CREWLET_TASK, CREWLET_RUN_ID, which the sandbox sets)"),
        ({**JOB, "env": "KEY"},
         "sandbox.env='KEY': must be a list of environment variable names (not PATH, HOME, CREWLET_TASK, CREWLET_RUN_ID, which the sandbox sets)"),
        ({**JOB, "network": "no"}, "sandbox.network='no': must be true or false"),
        ({**JOB, "memory_mb": 63}, "sandbox.memory_mb=63: must be between 64 and 65536"),
        ({**JOB, "memory_mb": 512.5}, "sandbox.memory_mb=512.5: must be a whole number between 64 and 65536"),
        ({**JOB, "read_only_paths": ["/opt", "/"]},
         "sandbox.read_only_paths[1]='/': must be an absolute path other than / and outside /work, /proc and /dev (the sandbox's own mounts)"),
        ({**JOB, "read_only_paths": ["/work/tools"]},
         "sandbox.read_only_paths[0]='/work/tools': must be an absolute path other than / and outside /work, /proc and /dev (the sandbox's own mounts)"),
        ({**JOB, "read_only_paths": ["/opt/../root"]},
         "sandbox.read_only_paths[0]='/opt/../root': must be an absolute path other than / and outside /work, /proc and /dev (the sandbox's own mounts)"),
        ({**JOB, "max_attempts": 0}, "sandbox.max_attempts=0: must be between 1 and 10"),
        ({**JOB, "max_attempts": 11}, "sandbox.max_attempts=11: must be between 1 and 10"),
        ({**JOB, "image": "x"}, "sandbox.image='x': unknown key; allowed: command, workdir_from, time_limit_s, env, network, memory_mb, read_only_paths, max_attempts"),
        ("claude", "sandbox='claude': must be a mapping"),
    ],
)
def test_a_bad_sandbox_value_is_refused_naming_the_field_the_value_and_what_is_allowed(section: Any, message: str) -> None:
    assert refused(sandbox=section) == f"{message} (in acme.yaml)"


def test_a_credential_written_into_the_command_is_refused_without_being_echoed() -> None:
    token = "sk-ant-api03-" + "a" * 40
    text = refused(sandbox={"command": ["/bin/agent", "--key", token]})
    assert token not in text
    assert text.startswith("sandbox.command[2]=")
    assert "pass it through env: [ENV_VAR]" in text


def test_the_documented_example_loads_and_every_key_is_documented_with_its_default() -> None:
    page = DOCS.read_text()
    section = page.split("## Coding runs: `sandbox`", 1)[1].split("\n## ", 1)[0]
    example = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert example is not None
    org = parse_company({"org": "acme", **yaml.safe_load(example.group(1))})
    assert org.sandbox is not None and org.sandbox.network and org.seats[0].tools == ("sandbox_run",)
    for key in SandboxConfig.__dataclass_fields__:
        assert f"| `sandbox.{key}` |" in section
