"""The company file's ``mcp_servers``: each server's name, and its keys as a pydantic model.

A server runs a ``command`` (stdio) or is reached at a ``url`` (streamable
HTTP), never both; ``env`` gives a command server plain variables,
``env_from`` names the node variables it is handed, ``headers_from`` names
the variable each header of a url server is read from. No credential is ever
written in the file: a key named like one, a value shaped like one, or a
header's variable that is not a name, is refused without being quoted.
``{builtin: slack}`` is a shipped server, read by :mod:`crewlet.company.builtin_servers`.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Mapping, Optional

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from crewlet.base.logfmt import is_secret_name
from crewlet.company.builtin_servers import BUILTIN_KEY, BuiltinServerError, builtin_mcp_server
from crewlet.company.fields import _ENV, CompanyError, _looks_secret, _mapping, _string
from crewlet.company.org import BUILTIN_TOOLS, McpServer, Surface
from crewlet.company.refusal import Check
from crewlet.company.shape import ENV_NAME, NON_EMPTY, EnvName, FileModel, read_section, refuse, refuse_secret, secretless, text, where, words

#: An MCP server's name is the prefix of every tool the model sees from it (``<server>__<tool>``), so it
#: stays short and within the vendors' tool-name alphabet, and never holds the ``__`` separator itself.
_MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,31}")
_NAME_RULE = "a server name must be 1-32 letters, digits, '-' or '_' (never '__'), starting with a letter or digit"
_URL = re.compile(r"^https?://")
TRANSPORT_RULE = "must have exactly one of command: [program, args...] (stdio) or url: http(s)://... (streamable HTTP)"


def _number_as_text(value: Any) -> Any:
    """YAML reads ``--port 8080``'s ``8080`` as a number; a command's word or a variable's value is its text."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


_CommandWord = Annotated[
    str, BeforeValidator(_number_as_text), text(), secretless("looks like a credential: pass it through env_from: [ENV_VAR]"),
]
_Url = Annotated[
    str, text(), secretless("carries a credential: give it through headers_from: {Header: ENV_VAR}"),
    Check(lambda v: None if _URL.match(v) else "must be an http:// or https:// URL"),
]


class McpServerFile(FileModel):
    """One server of ``mcp_servers`` (not a builtin one)."""

    command: Optional[Annotated[list[_CommandWord], Field(min_length=1)]] = words(None, "must be a non-empty list: [program, args...]")
    env: Optional[dict[Any, Any]] = None
    env_from: Optional[list[EnvName]] = words(None, "must be a list of environment variable names")
    url: Optional[_Url] = None
    headers_from: Optional[dict[Any, Any]] = None

    @model_validator(mode="before")
    @classmethod
    def _one_transport(cls, data: Any) -> Any:
        """A key that would hold a credential first (unquoted), then exactly one of ``command`` and ``url``."""
        if not isinstance(data, Mapping):
            return data
        for key in data:
            if key not in cls.model_fields and (key == "headers" or is_secret_name(str(key))):
                raise refuse_secret(
                    "is not allowed: give a header through headers_from: {Header: ENV_VAR}, a secret variable through env_from: [ENV_VAR]",
                    str(key),
                )
        if any(key not in cls.model_fields for key in data):
            return data  # pydantic's own refusal names the unknown key
        has_command, has_url = data.get("command") is not None, data.get("url") is not None
        if has_command == has_url:
            raise refuse(TRANSPORT_RULE, shown="both command and url" if has_command else "neither command nor url")
        return data

    @field_validator("env")
    @classmethod
    def _plain_env(cls, env: Optional[dict[Any, Any]]) -> dict[str, str]:
        """Plain variables only: a name, and a value that is text and no credential (a secret goes through ``env_from``)."""
        out: dict[str, str] = {}
        for key, value in (env or {}).items():
            if not isinstance(key, str) or not key.strip():
                raise refuse(NON_EMPTY, shown=key)
            if not _ENV.fullmatch(key):
                raise refuse(ENV_NAME, shown=key)
            text_value = _number_as_text(value)
            if is_secret_name(key) or (isinstance(text_value, str) and _looks_secret(text_value)):
                raise refuse_secret(
                    f"a secret is never inline: name the variable in env_from: [{key}] and set it in the node's environment", key,
                )
            if not isinstance(text_value, str):
                raise refuse("must be a string", key=key, shown=value)
            out[key] = text_value
        return out

    @field_validator("headers_from")
    @classmethod
    def _header_variables(cls, headers: Optional[dict[Any, Any]]) -> dict[str, str]:
        """Each header's variable: a name, never the value (a value is refused unquoted)."""
        out: dict[str, str] = {}
        for header, var in (headers or {}).items():
            if isinstance(var, str) and (_looks_secret(var) or (not _ENV.fullmatch(var) and is_secret_name(str(header)))):
                raise refuse_secret("must name the environment variable holding the value, not the value", str(header))
            if not isinstance(var, str) or not _ENV.fullmatch(var):
                raise refuse(ENV_NAME, key=str(header), shown=var)
            out[str(header)] = var
        return out

    @model_validator(mode="after")
    def _transport_keys(self, info: ValidationInfo) -> McpServerFile:
        name, source = where(info)
        if self.command is not None and self.headers_from:
            raise CompanyError(f"{name}.headers_from", dict(self.headers_from), "applies only to a url server", source)
        if self.url is not None and (self.env or self.env_from):
            raise CompanyError(f"{name}.env", "env/env_from", "applies only to a command server", source)
        return self


class BuiltinServerFile(FileModel):
    """``{builtin: slack}``: a shipped chat server, alone (the engine makes its command and environment).

    Which kinds there are, and whether the surface a kind calls is set up,
    is :func:`~crewlet.company.builtin_servers.builtin_mcp_server`'s (it reads ``surfaces``).
    """

    builtin: Any = None

    @model_validator(mode="before")
    @classmethod
    def _alone(cls, data: Any) -> Any:
        for key, value in data.items() if isinstance(data, Mapping) else ():
            if key != BUILTIN_KEY:
                raise refuse("a builtin server takes no other key (its token and URL are the engine's)", key=str(key), shown=value)
        return data


def _builtin_server(sname: str, body: Mapping[str, Any], surfaces: Mapping[str, Surface], source: Optional[str]) -> McpServer:
    shape = read_section(BuiltinServerFile, body, f"mcp_servers.{sname}", source)
    try:
        return builtin_mcp_server(sname, shape.builtin, surfaces)
    except BuiltinServerError as exc:
        raise CompanyError(exc.field, exc.value, exc.allowed, source) from None


def parse_mcp_servers(value: Any, surfaces: Mapping[str, Surface], source: Optional[str]) -> dict[str, McpServer]:
    """``mcp_servers``: each server by its name (checked, and no built-in tool's), shipped or the company's own."""
    servers: dict[str, McpServer] = {}
    for sname, body in _mapping(value, "mcp_servers", source).items():
        sname = _string(sname, "mcp_servers", source, _MCP_SERVER_NAME, _NAME_RULE)
        if sname in BUILTIN_TOOLS:
            raise CompanyError(f"mcp_servers.{sname}", sname, "is the name of a built-in tool; choose another", source)
        body = _mapping(body, f"mcp_servers.{sname}", source)
        if BUILTIN_KEY in body:
            servers[sname] = _builtin_server(sname, body, surfaces, source)
            continue
        server = read_section(McpServerFile, body, f"mcp_servers.{sname}", source)
        servers[sname] = McpServer(
            name=sname, command=tuple(server.command or ()), env=server.env or {}, env_from=tuple(server.env_from or ()),
            url=server.url or "", headers_from=server.headers_from or {},
        )
    return servers


__all__ = ["McpServerFile", "parse_mcp_servers"]
