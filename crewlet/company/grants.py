"""``seats[].tools``: what a seat may call, and the credentials of its own it calls a shared MCP server with.

A grant is a name — an ``mcp_servers`` name or a built-in — or a mapping
``{server, env?, headers?}`` that gives the seat its own node variables for
what the server reads by name: ``env`` maps a variable the server declares
in ``env_from`` to the seat's own variable, ``headers`` a header it declares
in ``headers_from``. Like the server's, every value is a variable's name,
never the secret: a value that is not a variable name is refused without
echoing it. Only declared names may be mapped, so a grant can point the
server's credentials elsewhere but never hand a child a variable the
company's definition of the server does not read.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from pydantic import model_validator

from crewlet.base.logfmt import REDACTED, is_secret_name
from crewlet.company.fields import _ENV, CompanyError, _looks_secret, _refuse_inline_secret
from crewlet.company.org import BUILTIN_TOOLS, McpServer, ToolGrant
from crewlet.company.shape import FileModel, read_section, refuse_secret

#: The keys of a grant written as a mapping.
GRANT_KEYS = ("server", "env", "headers")
#: A grant's mappings, each with the server key that declares what it may map.
_DECLARED_BY = (("env", "env_from"), ("headers", "headers_from"))


class GrantFile(FileModel):
    """A grant written as a mapping: its keys (what they may name is the server's, checked by the step)."""

    server: Any = None
    env: Optional[dict[Any, Any]] = None
    headers: Optional[dict[Any, Any]] = None

    @model_validator(mode="before")
    @classmethod
    def _unknown_secret(cls, data: Any) -> Any:
        """An unknown key named like a credential, or holding one, is refused without quoting the value."""
        for key, value in data.items() if isinstance(data, Mapping) else ():
            if key not in cls.model_fields and (is_secret_name(str(key)) or _looks_secret(str(value))):
                raise refuse_secret(f"unknown key; allowed: {', '.join(GRANT_KEYS)}", str(key))
        return data


def _seat_tools(
    value: Any, name: str, servers: Mapping[str, McpServer], source: Optional[str]
) -> tuple[tuple[str, ...], dict[str, ToolGrant]]:
    """The names the seat is granted, in order, and the grants among them that map credentials, by server name."""
    if value is None:
        return (), {}
    allowed = ", ".join([*servers, *BUILTIN_TOOLS])
    if not isinstance(value, list):
        raise CompanyError(name, value, f"must be a list of tool grants ({allowed})", source)
    tools: list[str] = []
    grants: dict[str, ToolGrant] = {}
    for i, tool in enumerate(value):
        grant = _tool_grant(tool, f"{name}[{i}]", servers, source) if isinstance(tool, Mapping) else None
        if grant is not None:
            tool = grants.setdefault(grant.server, grant).server
        if not isinstance(tool, str) or (tool not in servers and tool not in BUILTIN_TOOLS):
            raise CompanyError(f"{name}[{i}]", tool, f"must be an mcp_servers name or a built-in tool ({allowed})", source)
        if tool in tools:
            raise CompanyError(f"{name}[{i}]", tool, "is granted twice", source)
        tools.append(tool)
    return tuple(tools), grants


def _tool_grant(body: Mapping[str, Any], name: str, servers: Mapping[str, McpServer], source: Optional[str]) -> ToolGrant:
    """``{server, env?, headers?}`` checked against what the server declares; header names match case-insensitively."""
    grant = read_section(GrantFile, body, name, source)
    server_name = grant.server
    if server_name in BUILTIN_TOOLS:
        raise CompanyError(
            f"{name}.server", server_name, "is a built-in tool: grant it by its name alone; it takes no env or headers",
            source,
        )
    server = servers.get(server_name) if isinstance(server_name, str) else None
    if server is None:
        known = ", ".join(servers) or "none"
        raise CompanyError(f"{name}.server", server_name, f"must be an mcp_servers name ({known})", source)
    declared = {"env": {v: v for v in server.env_from}, "headers": {h.lower(): h for h in server.headers_from}}
    mapped: dict[str, dict[str, str]] = {"env": {}, "headers": {}}
    for key, declared_in in _DECLARED_BY:
        for what, var in (getattr(grant, key) or {}).items():
            own = declared[key].get(str(what) if key == "env" else str(what).lower())
            if own is None:
                shown = REDACTED if _looks_secret(str(what)) else what
                names = ", ".join(declared[key].values()) or "none"
                raise CompanyError(
                    f"{name}.{key}", shown, f"must be one of what {server.name} declares in {declared_in} ({names})", source
                )
            if var is None:
                raise CompanyError(f"{name}.{key}.{own}", var, "must name a node environment variable", source)
            if not isinstance(var, str) or not _ENV.fullmatch(var):
                _refuse_inline_secret(
                    f"{name}.{key}.{own}",
                    "must name the node environment variable holding the seat's value (e.g. ADA_SLACK_BOT_TOKEN), "
                    "never the value itself",
                    source,
                )
            mapped[key][own] = var
    return ToolGrant(server=server.name, env=mapped["env"], headers=mapped["headers"])


__all__ = ["GRANT_KEYS"]
