"""A node's backup and its restore: the broker's streams (JetStream's own snapshots) and the node's stores.

A backup directory holds ``manifest.json`` (what was copied, and how to put
it back), ``streams/<stream>.snapshot`` (each stream's messages and its
consumers with their delivery state, in the server's own archive format) and
``stores/``: each SQLite database copied with SQLite's online backup API (a
consistent copy while the node writes), or each PostgreSQL database as a
``pg_dump`` custom-format archive.

Each stream's snapshot is consistent in itself; the streams and the stores are
copied one after another while the node runs, so mail that arrives during the
copy may be in one and not the other. The design's delivery rules cover that:
a message whose work the store already records is settled, not redone.

A restore is offline: the node is stopped and its data directory empty (or
holding only what Django writes on start). It puts the stores back, starts a
broker of its own on the store directory, restores every stream through
``$JS.API.STREAM.RESTORE``, and stops the broker; ``up`` then finds the mail
where it was. The backup's own events are in the copy: the
``backup_requested`` of a copy is published once it finished, so it is not.
"""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from django.conf import settings

from crewlet.engine import runtime
from crewlet.events import format_timestamp
from crewlet.events.tracing import trace_of
from crewlet.events.types import BackupRequested
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import QueueError
from crewlet.queue.jetstream.snapshots import SnapshotsPart, restore_streams

log = logging.getLogger("crewlet.eventstore.backups")

MANIFEST = "manifest.json"
STREAMS_DIR = "streams"
STORES_DIR = "stores"
#: The manifest's format: a restore refuses one it does not know.
FORMAT = 1
# The manifest's keys.
K_FORMAT = "format"
K_CREATED_AT = "created_at"
K_STREAMS = "streams"
K_STORES = "stores"
K_NAME = "name"
K_FILE = "file"
K_META = "meta"
K_ALIAS = "alias"
K_ENGINE = "engine"
ENGINE_SQLITE = "sqlite"
ENGINE_POSTGRES = "postgres"
#: The field a refusal names for the directory.
FIELD_DIR = "dir"
#: The most characters of a caller's value a refusal repeats.
_VALUE_MAX = 120


class BackupRefused(ValueError):
    """The request cannot be carried out as asked: the field, the (bounded) value and what is allowed."""

    def __init__(self, field_name: str, value: object, allowed: str) -> None:
        shown = str(value)
        shown = shown if len(shown) <= _VALUE_MAX else shown[: _VALUE_MAX - 1] + "…"
        super().__init__(f"{field_name}={shown!r}: {allowed}")
        self.field = field_name


class BackupFailed(RuntimeError):
    """The copy began and could not finish; the message is for the operator (no credential in it)."""


@dataclass
class BackupResult:
    """What a backup wrote: the directory, the streams and the stores."""

    dir: Path
    streams: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)


# -- the directory ------------------------------------------------------------------------------


def backup_target(value: object) -> Path:
    """The directory a backup may write: an absolute path that does not exist yet or is an empty directory."""
    if not isinstance(value, str) or not value.strip():
        raise BackupRefused(FIELD_DIR, value if isinstance(value, str) else type(value).__name__, "must be an absolute directory path")
    path = Path(value.strip())
    if not path.is_absolute():
        raise BackupRefused(FIELD_DIR, value, "must be an absolute path (on the node's own disk)")
    if ".." in path.parts:
        raise BackupRefused(FIELD_DIR, value, "must not contain '..'")
    if path.exists():
        if not path.is_dir():
            raise BackupRefused(FIELD_DIR, value, "exists and is not a directory: name a new or empty directory")
        if any(path.iterdir()):
            raise BackupRefused(FIELD_DIR, value, "exists and is not empty: name a new or empty directory")
    elif not path.parent.is_dir():
        raise BackupRefused(FIELD_DIR, value, "its parent directory does not exist")
    return path


def read_manifest(value: object) -> tuple[Path, dict[str, Any]]:
    """A backup directory a restore may read, and its manifest."""
    if not isinstance(value, str) or not value.strip():
        raise BackupRefused(FIELD_DIR, value, "must be the absolute path of a backup directory")
    path = Path(value.strip())
    if not path.is_absolute():
        raise BackupRefused(FIELD_DIR, value, "must be an absolute path")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise BackupRefused(FIELD_DIR, value, f"holds no {MANIFEST}: not a finished backup")
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError:
        raise BackupRefused(FIELD_DIR, value, f"its {MANIFEST} is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get(K_FORMAT) != FORMAT:
        raise BackupRefused(FIELD_DIR, value, f"its {MANIFEST} is not a format-{FORMAT} backup")
    return path, manifest


# -- the stores ------------------------------------------------------------------------------------


def _engine(conf: Mapping[str, Any]) -> str:
    return ENGINE_SQLITE if str(conf.get("ENGINE", "")).endswith("sqlite3") else ENGINE_POSTGRES


def _pg_env(conf: Mapping[str, Any]) -> dict[str, str]:
    """libpq's environment for one database: the password rides here, never on a command line or in a log."""
    import os

    env = dict(os.environ)
    env.update(
        PGHOST=str(conf.get("HOST") or "localhost"), PGPORT=str(conf.get("PORT") or "5432"),
        PGUSER=str(conf.get("USER") or ""), PGPASSWORD=str(conf.get("PASSWORD") or ""), PGDATABASE=str(conf["NAME"]),
    )
    return env


def _pg_tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise BackupFailed(f"{name} is not on PATH: install the PostgreSQL client tools to copy a PostgreSQL store")
    return found


def copy_stores(target: Path, databases: Optional[Mapping[str, Mapping[str, Any]]] = None) -> list[dict[str, Any]]:
    """Copy each database the node uses into ``target/stores``; the manifest's entries."""
    databases = databases if databases is not None else settings.DATABASES
    stores = target / STORES_DIR
    stores.mkdir()
    entries: list[dict[str, Any]] = []
    for alias, conf in databases.items():
        engine = _engine(conf)
        if engine == ENGINE_SQLITE:
            name = f"{alias}.sqlite3"
            source = sqlite3.connect(str(conf["NAME"]))
            copy = sqlite3.connect(str(stores / name))
            try:
                source.backup(copy)  # SQLite's online backup: consistent while the node writes
            finally:
                copy.close()
                source.close()
        else:
            name = f"{alias}.pgdump"
            done = subprocess.run(
                [_pg_tool("pg_dump"), "--format=custom", "--no-owner", f"--file={stores / name}"],
                env=_pg_env(conf), capture_output=True, text=True,
            )
            if done.returncode != 0:
                raise BackupFailed(f"pg_dump of the {alias} database failed: {done.stderr.strip()[-300:]}")
        entries.append({K_ALIAS: alias, K_ENGINE: engine, K_FILE: f"{STORES_DIR}/{name}"})
    return entries


def restore_stores(source: Path, manifest: Mapping[str, Any], databases: Optional[Mapping[str, Mapping[str, Any]]] = None) -> list[str]:
    """Put each copied database back where this install's settings place it; refuses to overwrite data."""
    databases = databases if databases is not None else settings.DATABASES
    entries = list(manifest.get(K_STORES) or [])
    for entry in entries:  # every refusal before the first byte is written
        alias = str(entry[K_ALIAS])
        conf = databases.get(alias)
        if conf is None:
            raise BackupRefused("stores", alias, f"this install has no {alias!r} database")
        if _engine(conf) != entry[K_ENGINE]:
            raise BackupRefused("stores", alias, f"was copied from {entry[K_ENGINE]}, and this install's is {_engine(conf)}")
        if not (source / str(entry[K_FILE])).is_file():
            raise BackupRefused(FIELD_DIR, str(source), f"is missing {entry[K_FILE]}: the backup is incomplete")
        dest = Path(str(conf["NAME"]))
        if entry[K_ENGINE] == ENGINE_SQLITE and dest.exists() and dest.stat().st_size > 0:
            raise BackupRefused(
                "data dir", str(dest), "already holds this database: stop the node and restore into an empty data directory"
            )
    restored: list[str] = []
    for entry in entries:
        alias = str(entry[K_ALIAS])
        conf = databases[alias]
        copied = source / str(entry[K_FILE])
        if entry[K_ENGINE] == ENGINE_SQLITE:
            dest = Path(str(conf["NAME"]))
            dest.parent.mkdir(parents=True, exist_ok=True)
            back, into = sqlite3.connect(str(copied)), sqlite3.connect(str(dest))
            try:
                back.backup(into)
            finally:
                into.close()
                back.close()
        else:
            done = subprocess.run(
                [_pg_tool("pg_restore"), "--no-owner", "--exit-on-error", f"--dbname={conf['NAME']}", str(copied)],
                env=_pg_env(conf), capture_output=True, text=True,
            )
            if done.returncode != 0:
                raise BackupFailed(
                    f"pg_restore into the {alias} database failed (it must exist and be empty): {done.stderr.strip()[-300:]}"
                )
        restored.append(alias)
    return restored


# -- the streams -----------------------------------------------------------------------------------


def _snapshots(queue: EventQueue) -> SnapshotsPart:
    transport = getattr(queue, "transport", None)
    if not isinstance(transport, SnapshotsPart):
        raise BackupFailed("this node's queue is not JetStream: there are no streams to snapshot")
    return transport


async def snapshot_streams(queue: EventQueue, target: Path) -> list[dict[str, Any]]:
    """Snapshot every stream of the node's broker into ``target/streams``; the manifest's entries."""
    transport = _snapshots(queue)
    streams = target / STREAMS_DIR
    streams.mkdir()
    entries: list[dict[str, Any]] = []
    for name in await transport.stream_names():
        file_name = f"{name}.snapshot"
        meta = await transport.snapshot_stream(name, streams / file_name)
        entries.append({K_NAME: name, K_FILE: f"{STREAMS_DIR}/{file_name}", K_META: meta})
    return entries


async def publish_backup_requested(queue: EventQueue, target: Path, actor: str, finished: bool, streams: int, error: str = "") -> None:
    """The one ``backup_requested`` of a copy that began; a failed publish is logged, not raised."""
    body = BackupRequested(token=actor, dir=str(target), finished=finished, streams=streams, error=error[:300])
    await runtime.emitter_for(queue).emit(
        body, trace_of(), source="operator", log_event="backup_requested_publish_failed", level=logging.ERROR,
        dir=str(target), finished=finished, streams=streams,
    )


def run_backup(value: object, actor: str, timeout_s: float) -> BackupResult:
    """Back the node up into directory ``value`` (from a request thread): streams, then stores, then the manifest.

    Refused (:class:`BackupRefused`) before anything is written; once copying
    began, one ``backup_requested`` says whether it finished. A copy that did
    not finish leaves no manifest, so a restore refuses it.
    """
    target = backup_target(value)
    result = BackupResult(target)
    streams: list[dict[str, Any]] = []
    try:
        target.mkdir(exist_ok=True)
        streams = runtime.on_engine(lambda queue: snapshot_streams(queue, target), timeout_s)
        stores = copy_stores(target)
        manifest = {
            K_FORMAT: FORMAT,
            K_CREATED_AT: format_timestamp(_now()),
            K_STREAMS: streams,
            K_STORES: stores,
        }
        (target / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    except (QueueError, BackupFailed, OSError, sqlite3.Error, runtime.EngineAway, TimeoutError) as exc:
        error = _failure_text(exc)
        log.error("backup_failed", extra={"dir": str(target), "streams": len(streams), "error": error})
        _publish_quietly(target, actor, False, len(streams), error, timeout_s)
        raise BackupFailed(error) from exc
    result.streams = [str(entry[K_NAME]) for entry in streams]
    result.stores = [str(entry[K_ALIAS]) for entry in stores]
    log.info("backup_finished", extra={"dir": str(target), "streams": len(streams), "stores": len(stores)})
    _publish_quietly(target, actor, True, len(streams), "", timeout_s)
    return result


def _failure_text(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "the copy took longer than the backup's deadline"
    return str(exc) or type(exc).__name__


def _publish_quietly(target: Path, actor: str, finished: bool, streams: int, error: str, timeout_s: float) -> None:
    try:
        runtime.on_engine(lambda queue: publish_backup_requested(queue, target, actor, finished, streams, error), timeout_s)
    except Exception as exc:
        log.error("backup_requested_unpublished", extra={"dir": str(target), "error": repr(exc)})


def _now() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


# -- restore ---------------------------------------------------------------------------------------


def _store_dir_refusal(store_dir: Path) -> None:
    if store_dir.exists() and any(store_dir.iterdir()):
        raise BackupRefused(
            "store dir", str(store_dir),
            "already holds a broker's store: stop the node and restore into an empty data directory",
        )


async def restore_backup(
    value: object, store_dir: Path, broker_timeout_s: float = 30.0, nats_url: str = ""
) -> tuple[int, list[str]]:
    """Restore the backup in directory ``value`` into this install (stopped): (streams restored, stores restored).

    Everything is checked before anything is written; the stores go back
    first, then a broker of the restore's own on ``store_dir`` takes the
    streams and is stopped again — or, with ``nats_url``, the external
    broker there takes them (it must not hold them yet).
    """
    from crewlet.queue.broker import EmbeddedBroker

    source, manifest = read_manifest(value)
    if not nats_url:
        _store_dir_refusal(store_dir)
    snapshots: list[tuple[str, dict[str, Any], Path]] = []
    for entry in manifest.get(K_STREAMS) or []:
        path = source / str(entry[K_FILE])
        if not path.is_file():
            raise BackupRefused(FIELD_DIR, str(source), f"is missing {entry[K_FILE]}: the backup is incomplete")
        snapshots.append((str(entry[K_NAME]), dict(entry[K_META]), path))
    stores = await asyncio.to_thread(restore_stores, source, manifest)
    if nats_url:
        restored = await restore_streams(nats_url, snapshots, broker_timeout_s)
        log.info("backup_restored", extra={"dir": str(source), "streams": restored, "stores": len(stores)})
        return restored, stores
    broker = EmbeddedBroker(store_dir, supervise=False)
    await broker.start()
    try:
        restored = await restore_streams(broker.url, snapshots, broker_timeout_s)
    finally:
        await broker.stop()
    log.info("backup_restored", extra={"dir": str(source), "streams": restored, "stores": len(stores)})
    return restored, stores


__all__ = [
    "BackupFailed", "BackupRefused", "BackupResult", "MANIFEST", "backup_target", "copy_stores", "read_manifest",
    "restore_backup", "restore_stores", "run_backup", "snapshot_streams",
]
