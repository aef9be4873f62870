"""Reading the company file: its text, validated section by section into an :class:`~crewlet.company.org.Organization`.

A bad company file is refused at load with the field, the value and what is
allowed, exactly like a bad engine setting, in one bounded line: the file is
read by the settings' guarded YAML loader (:func:`crewlet.company.yamlfile.load_yaml`:
size, encoding, depth, alias expansion and duplicate keys), every number is
finite and inside its range, and every interval has a floor. Each top-level
section of the file is read by a step of its own: the section's pydantic
model checks its shape (:mod:`crewlet.company.shape`, :mod:`crewlet.company.sections`),
and the step builds the :mod:`crewlet.company.org` dataclasses from it and
checks what involves another section or another entry.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Optional

from crewlet.company.chat_identity import check_seat_identities, seat_mattermost, seat_slack, seat_socket_kinds
from crewlet.company.fields import CompanyError
from crewlet.company.org import (
    DEFAULT_TIMEZONE,
    MODE_SOCKET,
    MODE_WEBHOOK,
    SURFACE_SECRET_KEYS,
    SURFACE_SERVER_KEYS,
    SURFACE_SERVER_REQUIRED,
    SURFACE_SOCKET_TOKEN_KEYS,
    SURFACES,
    McpServer,
    Organization,
    Placement,
    Seat,
    Surface,
    agent_id_for,
)
from crewlet.company.grants import _seat_tools
from crewlet.company.instructions import (
    INSTRUCTIONS_FILE_KEY,
    INSTRUCTIONS_KEY,
    FilesOnDisk,
    IncludedFiles,
    StoredFiles,
    seat_instructions,
)
from crewlet.company.budget import BUDGET_KEY, parse_budget, seat_budgets
from crewlet.company.episodes import EPISODES_KEY, parse_episodes
from crewlet.company.sandbox import SANDBOX_KEY, SANDBOX_TOOL, SandboxConfig, parse_sandbox
from crewlet.company.schedules import parse_schedules
from crewlet.company.thread_bounds import THREAD_BLOCK_KEY, parse_thread_bounds
from crewlet.company.mcp_servers import parse_mcp_servers
from crewlet.company.providers import parse_providers, provider_entries
from crewlet.company.sections import CompanyFile, PlacementFile, SeatFile, SurfacesFile
from crewlet.company.shape import NON_EMPTY, read_section
from crewlet.company.yamlfile import load_yaml, read_yaml_text

EXAMPLE_COMPANY = Path(__file__).resolve().parent.parent / "companies" / "example.yaml"



def _placement(value: Any, body: Optional[PlacementFile], name: str, kind: str, source: Optional[str]) -> Placement:
    """``seats[].placement`` (its shape checked by :class:`PlacementFile`); only an agent has one, labels kept once each."""
    if body is None:
        return Placement()
    if value and kind != "agent":
        raise CompanyError(name, dict(value), "applies only to an agent seat (a person runs on no node)", source)
    return Placement(node=body.node or "", labels=tuple(dict.fromkeys(body.labels or ())))


def _surface_socket(name: str, shape: Any, seat_sockets: frozenset[str], source: Optional[str]) -> dict[str, str]:
    """A surface's mode and server (read in either mode), and in ``socket`` mode the token variable (its keys' shape checked).

    The server is read in either mode: a socket dials it, the shipped chat
    tools call it. ``seat_sockets``: the kinds a seat names its own socket
    token for; those sockets dial the surface's server too, and the
    company-level token may then be left out.
    """
    given = shape.model_fields_set if shape is not None else set()
    mode = shape.mode if shape is not None and "mode" in given else MODE_WEBHOOK
    token_key, server_key = SURFACE_SOCKET_TOKEN_KEYS.get(name), SURFACE_SERVER_KEYS.get(name)
    server = (getattr(shape, server_key) or "") if shape is not None and server_key else ""
    if server_key and not server and mode == MODE_SOCKET and name in SURFACE_SERVER_REQUIRED:
        raise CompanyError(f"surfaces.{name}.{server_key}", None, NON_EMPTY, source)
    if mode != MODE_SOCKET:
        if token_key and token_key in given:
            raise CompanyError(f"surfaces.{name}.{token_key}", getattr(shape, token_key), "is read only with mode: socket", source)
        return {"mode": mode, "server": server.rstrip("/")}
    assert token_key is not None  # the socket modes' surfaces are SURFACE_SOCKET_TOKEN_KEYS'
    if token_key not in given and name not in seat_sockets:
        raise CompanyError(f"surfaces.{name}.{token_key}", None, "is required with mode: socket (the variable holding its token)", source)
    token_env = getattr(shape, token_key) if token_key in given else ""
    return {"mode": mode, "token_env": token_env, "server": server.rstrip("/")}


def _surfaces(value: Any, source: Optional[str], seat_sockets: frozenset[str] = frozenset()) -> dict[str, Surface]:
    """``surfaces``: every surface kind, configured or not, with its secret variable, verification and mode."""
    checked = read_section(SurfacesFile, value, "surfaces", source)
    surfaces_body = value or {}
    surfaces: dict[str, Surface] = {}
    for name in SURFACES:
        shape = getattr(checked, name)
        surfaces[name] = Surface(
            name=name, secret_env=getattr(shape, SURFACE_SECRET_KEYS[name], "") or "" if shape else "",
            verify=shape.verify if shape else True, configured=name in surfaces_body,
            **_surface_socket(name, shape, seat_sockets, source),
        )
    return surfaces


def _seats(seats_raw: Any, org: str, mcp_servers: Mapping[str, McpServer], source: Optional[str]) -> list[Seat]:
    """``seats``: each seat's handle (unique), kind, role, identities, tools, limits and placement; no identity twice."""
    if not isinstance(seats_raw, list):
        raise CompanyError("seats", seats_raw, "must be a list of seats", source)
    seats: list[Seat] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(seats_raw):
        name = f"seats[{i}]"
        shape = read_section(SeatFile, entry, name, source)
        entry = entry or {}
        handle, kind = shape.handle, shape.kind
        if handle in seen:
            raise CompanyError(f"{name}.handle", handle, "must be unique; already used by another seat", source)
        seen[handle] = name
        role, display = shape.role or "", shape.display_name or handle.capitalize()
        identities = {surface: getattr(shape.identities, surface) for surface in entry.get("identities") or {}}
        tools, grants = _seat_tools(entry.get("tools"), f"{name}.tools", mcp_servers, source)
        seats.append(
            Seat(
                handle=handle,
                kind=kind,
                role=role,
                display_name=display,
                identities=identities,
                agent_id=agent_id_for(org, handle),
                tools=tools,
                grants=grants,
                max_rounds=shape.max_rounds,
                turn_token_budget=shape.turn_token_budget,
                reflection=shape.reflection,
                placement=_placement(entry.get("placement"), shape.placement, f"{name}.placement", kind, source),
                slack=seat_slack(entry.get("slack"), f"{name}.slack", kind, source),
                mattermost=seat_mattermost(entry.get("mattermost"), f"{name}.mattermost", kind, source),
            )
        )
    check_seat_identities(seats, source)
    for surface in SURFACES:
        owners: dict[str, str] = {}
        for seat in seats:
            ident = seat.identities.get(surface)
            if ident is None:
                continue
            if ident in owners:
                raise CompanyError(
                    f"seats.{seat.handle}.identities.{surface}", ident, f"already belongs to seat {owners[ident]}", source
                )
            owners[ident] = seat.handle
    return seats


#: The keys of a seat read by :func:`_seats_own`: its instructions and its own model chain.
SEAT_OWN_KEYS = (INSTRUCTIONS_KEY, INSTRUCTIONS_FILE_KEY, "providers")


def _seats_own(seats_raw: Any, seats: list[Seat], included: IncludedFiles, source: Optional[str]) -> list[Seat]:
    """Each seat's own instructions (inline or from its file) and its own model chain, over what :func:`_seats` read."""
    own = []
    for i, (entry, seat) in enumerate(zip(seats_raw, seats)):
        name = f"seats[{i}]"
        for key in SEAT_OWN_KEYS:
            if entry.get(key) is not None and not seat.is_agent:
                raise CompanyError(f"{name}.{key}", entry[key], "applies only to an agent seat (a person runs no turns)", source)
        shape = read_section(SeatFile, entry, name, source)  # read by _seats already: this only hands back its values
        instructions, instructions_file = seat_instructions(shape.instructions, shape.instructions_file, name, included, source)
        providers = tuple(provider_entries(shape.providers, f"{name}.providers", source)) if shape.providers else ()
        own.append(replace(seat, instructions=instructions, instructions_file=instructions_file, providers=providers))
    return own


def parse_company(
    data: Any, *, source: Optional[str] = None, text: str = "", included: Optional[IncludedFiles] = None
) -> Organization:
    """Validate a decoded company document; raises :class:`CompanyError`.

    The sections are read in a fixed order, each by its own step, so a file
    with several bad values is refused for the same one every time: the seats
    after the MCP servers their ``tools`` grant, the schedules after the seats
    they wake, the MCP servers after the surfaces a builtin one calls.
    ``included`` is where the files the company includes are read from (a
    seat's ``instructions_file``): a stored revision's, none by default.
    """
    included = included if included is not None else StoredFiles()
    if not isinstance(data, Mapping):
        raise CompanyError("company", data, "must be a mapping with keys " + ", ".join(CompanyFile.model_fields), source)
    top = read_section(CompanyFile, data, "", source)
    org = top.org
    providers, reflection_providers = parse_providers(top.providers, source)
    surfaces = _surfaces(data.get("surfaces"), source, seat_socket_kinds(data.get("seats")))
    mcp_servers = parse_mcp_servers(top.mcp_servers, surfaces, source)
    seats = _seats(data.get("seats", []), org, mcp_servers, source)
    seats = _seats_own(data.get("seats", []), seats, included, source)
    seats = seat_budgets(data.get("seats", []), seats, source)
    timezone = top.timezone or DEFAULT_TIMEZONE
    schedules = parse_schedules(data.get("schedules", []), seats, timezone, source)
    sandbox = parse_sandbox(data.get(SANDBOX_KEY), source)
    _check_sandbox_grants(seats, sandbox, source)

    return Organization(
        org=org,
        providers=tuple(providers),
        reflection_providers=tuple(reflection_providers),
        max_concurrent=top.max_concurrent,
        coalesce_window_s=top.notification_coalesce_window_seconds,
        coalesce_max_batch=top.notification_coalesce_max_batch,
        rate_limit_per_s=top.notification_rate_limit,
        surfaces=surfaces,
        seats=tuple(seats),
        schedules=tuple(schedules),
        source_text=text,
        mcp_servers=mcp_servers,
        source_files=dict(sorted(included.files.items())),
        timezone=timezone,
        budget=parse_budget(data.get(BUDGET_KEY), BUDGET_KEY, source),
        thread_block=parse_thread_bounds(data.get(THREAD_BLOCK_KEY), source),
        episodes=parse_episodes(data.get(EPISODES_KEY), source),
        sandbox=sandbox,
    )


def _check_sandbox_grants(seats: list[Seat], sandbox: Optional[SandboxConfig], source: Optional[str]) -> None:
    """A seat granted ``sandbox_run`` needs the company's ``sandbox`` section: without it the tool has no job to start."""
    if sandbox is not None:
        return
    for seat in seats:
        if SANDBOX_TOOL in seat.tools:
            raise CompanyError(
                f"seats.{seat.handle}.tools", SANDBOX_TOOL,
                f"needs the company's {SANDBOX_KEY} section (the job it starts: {SANDBOX_KEY}: {{command: [...]}})", source,
            )


def parse_company_text(
    text: str, *, source: Optional[str] = None, files: Optional[Mapping[str, str]] = None,
    included: Optional[IncludedFiles] = None,
) -> Organization:
    """Validate the company file's text (a file's, or a revision's when ``source`` is None); raises :class:`CompanyError`.

    A revision's included files are ``files`` (path -> content, as stored);
    a file on disk reads its own through ``included`` (:func:`load_company`).
    """
    data = load_yaml(text, document="company", name=source, error=CompanyError)
    return parse_company(data, source=source, text=text, included=included or StoredFiles(files))


def read_company_text(path: str | Path) -> str:
    """The company file's text; unreadable, larger than the loader takes, or not UTF-8 is a :class:`CompanyError`."""
    return read_yaml_text(path, document="company", error=CompanyError)


def load_company(path: str | Path = EXAMPLE_COMPANY) -> Organization:
    """The company file at ``path``, its included files read from beside it (``Organization.source_files``)."""
    return parse_company_text(read_company_text(path), source=str(path), included=FilesOnDisk(Path(path).parent))
