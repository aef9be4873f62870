"""The shapes of the company file's top level, ``node``, ``surfaces`` and each of ``seats``, as pydantic models.

Each is only what a key takes; :mod:`crewlet.company.parse` validates a
section with its model (:func:`crewlet.company.shape.read_section`) and builds
the engine's objects (:mod:`crewlet.company.org`) from the result. A key whose
section has a reader of its own (``schedules``, ``mcp_servers``, a seat's
``tools``, ``slack`` or ``budget``) is ``Any`` here and read by that reader.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Optional

from pydantic import BeforeValidator, Field, create_model

from crewlet.company.budget import BUDGET_KEY
from crewlet.company.conf import NODE_ID_PATTERN
from crewlet.company.episodes import EPISODES_KEY
from crewlet.company.fields import _ENV, RATE_LIMIT_RANGE
from crewlet.company.instructions import INSTRUCTIONS_FILE_KEY, INSTRUCTIONS_KEY, InlineInstructions, InstructionsPath
from crewlet.company.org import (
    DEFAULT_MAX_ROUNDS,
    HANDLE_PATTERN,
    MODE_WEBHOOK,
    REFLECTION_OFF,
    SEAT_KINDS,
    SURFACE_MODES,
    SURFACE_SECRET_KEYS,
    SURFACE_SERVER_KEYS,
    SURFACE_SOCKET_TOKEN_KEYS,
    SURFACES,
)
from crewlet.company.refusal import Check, one_of
from crewlet.company.reflection import REFLECTION_KEY, REFLECTION_RULE, ReflectionMode
from crewlet.company.sandbox import SANDBOX_KEY
from crewlet.company.schedules import Zone
from crewlet.company.shape import ENV_NAME, NON_EMPTY, FileModel, absent, text, words
from crewlet.company.thread_bounds import THREAD_BLOCK_KEY
from crewlet.queue.contract import MAX_LINGER_SECONDS

COALESCE_WINDOW_RANGE = (0.0, float(MAX_LINGER_SECONDS))
COALESCE_MAX_BATCH_RANGE = (1, 100)
MAX_CONCURRENT_RANGE = (1, 64)
#: The range a seat's ``max_rounds`` may name.
MAX_ROUNDS_RANGE = (1, 100)
#: What a pinned node id or a node label may be (the node id's own rule).
NODE_ID_RULE = "must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit"
ORG_RULE = "must be 1-63 letters, digits, '.', '_' or '-'"
HANDLE_RULE = "must be 1-63 lowercase letters, digits, '_' or '-'"
_ORG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_HANDLE = re.compile(HANDLE_PATTERN)
_RATE_RULE = f"must be 0 (off) or a number of wakes per second between {RATE_LIMIT_RANGE[0]:g} and {RATE_LIMIT_RANGE[1]:g}"
_NodeId = Annotated[str, text(NODE_ID_PATTERN, NODE_ID_RULE)]
#: A chat user id: YAML reads an all-digit one (a Mattermost id can be) as a number, which means its digits.
_IdentityText = Annotated[str, BeforeValidator(lambda v: str(v) if type(v) is int else v), text()]
#: A surface's server (empty: the vendor's own, where it has one).
_Server = Annotated[
    str, Check(lambda v: None if not v else NON_EMPTY if not v.strip() else None if _SERVER_URL.match(v) else "must be an http:// or https:// URL"),
]
_SERVER_URL = re.compile(r"^https?://[^/\s]+")
#: An environment variable's name where an empty string means none.
_OptionalEnv = Annotated[str, Check(lambda v: ENV_NAME if v and not _ENV.fullmatch(v) else None)]


class NodeFile(FileModel):
    """``node``: how many turns one node runs at once."""

    max_concurrent: int = Field(default=4, ge=MAX_CONCURRENT_RANGE[0], le=MAX_CONCURRENT_RANGE[1])


class CompanyFile(FileModel):
    """The top level: its keys (no other), the company's name, ``node`` and the three ``notification_*`` keys."""

    org: Annotated[str, text(_ORG, ORG_RULE)]
    providers: Any = None
    node: Optional[NodeFile] = None
    notification_coalesce_window_seconds: float = Field(default=0.0, ge=COALESCE_WINDOW_RANGE[0], le=COALESCE_WINDOW_RANGE[1])
    notification_coalesce_max_batch: int = Field(default=20, ge=COALESCE_MAX_BATCH_RANGE[0], le=COALESCE_MAX_BATCH_RANGE[1])
    notification_rate_limit: Annotated[
        float, Check(lambda v: None if v == 0 or RATE_LIMIT_RANGE[0] <= v <= RATE_LIMIT_RANGE[1] else _RATE_RULE)
    ] = words(0.0, _RATE_RULE)
    surfaces: Any = None
    seats: Any = None
    schedules: Any = None
    mcp_servers: Any = None
    timezone: Optional[Zone] = None
    budget: Any = None
    thread_block: Any = None
    episodes: Any = None
    sandbox: Any = None

    @property
    def max_concurrent(self) -> int:
        return (self.node or NodeFile()).max_concurrent


class PlacementFile(FileModel):
    """``seats[].placement``: ``{node: n1}`` pins, ``{labels: [gpu]}`` needs every label."""

    node: Optional[_NodeId] = None
    labels: Optional[list[_NodeId]] = words(None, "must be a list of node labels")


def _surface_model(name: str) -> type[FileModel]:
    """One surface's keys: its secret's variable, ``verify``, and (where it has them) ``mode``, a token variable, a server."""
    fields: dict[str, Any] = {SURFACE_SECRET_KEYS[name]: (Optional[_OptionalEnv], ""), "verify": (bool, True)}
    if name in SURFACE_SOCKET_TOKEN_KEYS:
        fields["mode"] = (Annotated[str, one_of(*SURFACE_MODES)], words(MODE_WEBHOOK, "must be one of " + ", ".join(SURFACE_MODES)))
        fields[SURFACE_SOCKET_TOKEN_KEYS[name]] = (Annotated[str, text(_ENV, ENV_NAME)], absent())
    if name in SURFACE_SERVER_KEYS:
        fields[SURFACE_SERVER_KEYS[name]] = (Optional[_Server], None)
    return create_model(f"{name.capitalize()}SurfaceFile", __base__=FileModel, **fields)


#: ``surfaces``: a section per surface kind, each with its own keys.
SurfacesFile: type[FileModel] = create_model(
    "SurfacesFile", __base__=FileModel, **{name: (Optional[_surface_model(name)], None) for name in SURFACES},  # type: ignore[call-overload]
)
#: ``seats[].identities``: the seat's user id on each surface.
IdentitiesFile: type[FileModel] = create_model(
    "IdentitiesFile", __base__=FileModel, **{name: (_IdentityText, None) for name in SURFACES},  # type: ignore[call-overload]
)


class SeatFile(FileModel):
    """An entry of ``seats``: its handle, kind, role, identities, limits and placement; the rest is read by its own step."""

    handle: Annotated[str, text(_HANDLE, HANDLE_RULE)]
    kind: Annotated[str, one_of(*SEAT_KINDS)] = words("agent", "must be one of " + ", ".join(SEAT_KINDS))
    role: Optional[str] = words("", "must be a string")
    display_name: Optional[str] = words("", "must be a string")
    identities: Optional[IdentitiesFile] = None  # type: ignore[valid-type]
    tools: Any = None
    max_rounds: int = Field(default=DEFAULT_MAX_ROUNDS, ge=MAX_ROUNDS_RANGE[0], le=MAX_ROUNDS_RANGE[1])
    turn_token_budget: int = Field(default=0, ge=0)
    placement: Optional[PlacementFile] = None
    reflection: ReflectionMode = words(REFLECTION_OFF, REFLECTION_RULE)
    instructions: Optional[InlineInstructions] = None
    instructions_file: Optional[InstructionsPath] = None
    providers: Optional[Annotated[list[Any], Field(min_length=1)]] = words(
        None, "must be a non-empty list of providers.llm entries (leave it out for the company's providers.llm)",
    )
    slack: Any = None
    mattermost: Any = None
    budget: Any = None


def _named(model: type[FileModel], *keys: str) -> None:
    """The keys other modules name by constant are ``model``'s fields: a constant renamed alone fails at import, not in a file."""
    missing = [key for key in keys if key not in model.model_fields]
    if missing:
        raise RuntimeError(f"{model.__name__} has no field for the company-file keys {', '.join(missing)}")


_named(CompanyFile, BUDGET_KEY, THREAD_BLOCK_KEY, EPISODES_KEY, SANDBOX_KEY)
_named(SeatFile, REFLECTION_KEY, INSTRUCTIONS_KEY, INSTRUCTIONS_FILE_KEY, BUDGET_KEY)


__all__ = [
    "COALESCE_MAX_BATCH_RANGE",
    "COALESCE_WINDOW_RANGE",
    "CompanyFile",
    "HANDLE_RULE",
    "IdentitiesFile",
    "MAX_CONCURRENT_RANGE",
    "MAX_ROUNDS_RANGE",
    "NODE_ID_RULE",
    "NodeFile",
    "PlacementFile",
    "SeatFile",
    "SurfacesFile",
]
