"""The company file's model providers: ``providers`` (``llm``, ``reflection``) and a seat's own ``providers`` chain.

Each entry's ``kind`` picks the model of its other keys: the demo model's
(:class:`EchoOptions`: a delay, a failure, a script of rounds) or a vendor
SDK's (:class:`ModelOptions`: the model, where it is served, the variable
holding its key, limits and retry). pydantic checks them; a key named like a
credential is refused first, unechoed (a secret is never written in the
file). A script's tool arguments are free-form (any value the tool takes),
so pydantic does not type them; :func:`~crewlet.company.fields._refuse_non_finite`
walks them for the NaN or infinity no JSON call can carry, naming its path.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Mapping, Optional

from pydantic import model_validator

from crewlet.base.logfmt import is_secret_name
from crewlet.company.fields import _ENV, CompanyError, _mapping, _refuse_inline_secret, _refuse_non_finite
from crewlet.company.org import PROVIDER_KINDS, Provider
from crewlet.company.provider_retry import RetryFile
from crewlet.company.reflection import REFLECTION_KEY
from crewlet.company.refusal import Check
from crewlet.company.shape import ENV_NAME, FileModel, absent, Text, read_section, refuse, secretless, text, words

#: A model provider's ``timeout_s`` and the echo model's ``delay_s``, in seconds.
PROVIDER_TIMEOUT_RANGE_S = (0.1, 3600.0)
ECHO_DELAY_RANGE_S = (0.0, 3600.0)
MAX_TOKENS_RANGE = (1, 1_000_000)
SCRIPT_RULE = "must be a list of steps ({tool, arguments}, {calls}, {answer})"
_URL = re.compile(r"^https?://")
_Url = Annotated[
    str, text(), secretless("carries a credential: name its variable in api_key_env"),
    Check(lambda v: None if _URL.match(v) else "must be an http:// or https:// URL"),
]
_KeyEnv = Annotated[str, secretless("must name the environment variable holding the key, not the key"), text(_ENV, ENV_NAME)]


class EchoCall(FileModel):
    """One tool call of a script step."""

    tool: Text
    arguments: Optional[dict[Any, Any]] = words(None, "must be a mapping")


class EchoStep(FileModel):
    """A script step: ``{tool, arguments}``, ``{calls: [...]}``, or ``{answer}`` alone."""

    tool: Text = absent()
    arguments: Optional[dict[Any, Any]] = words(None, "must be a mapping")
    calls: Optional[list[EchoCall]] = None
    answer: Optional[str] = None

    @model_validator(mode="before")
    @classmethod
    def _one_form(cls, data: Any) -> Any:
        """Which form the step is, read before its keys are (a refusal names the step and shows it whole)."""
        if not isinstance(data, Mapping) or any(key not in cls.model_fields for key in data):
            return data  # not a mapping, or a key no step has: pydantic's own refusal
        if "answer" in data:
            if len(data) != 1 or not isinstance(data["answer"], str):
                raise refuse("an answer step is {answer: <text>} alone")
            return data
        calls = data.get("calls", [data] if "tool" in data else None)
        if not isinstance(calls, list) or not calls:
            raise refuse("must name a tool, a list of calls, or an answer")
        return data


class EchoOptions(FileModel):
    """The demo model's keys: ``delay_s``, ``fail``, and a ``script`` of rounds (``repeat`` loops it, ``match`` confines it)."""

    delay_s: float = absent(ge=ECHO_DELAY_RANGE_S[0], le=ECHO_DELAY_RANGE_S[1])
    fail: bool = absent()
    script: list[EchoStep] = words([], SCRIPT_RULE)
    repeat: bool = absent()
    match: Text = absent()


class ModelOptions(FileModel):
    """A vendor SDK's keys: the model, where it is served, the variable holding its key, and limits.

    A key left out is left out of the options (the SDK's default); a key given
    as null is refused like any other wrong value (defaults are never validated).
    """

    base_url: _Url = absent()
    model: Text
    api_key_env: _KeyEnv = absent()
    timeout_s: float = absent(ge=PROVIDER_TIMEOUT_RANGE_S[0], le=PROVIDER_TIMEOUT_RANGE_S[1])
    max_tokens: int = absent(ge=MAX_TOKENS_RANGE[0], le=MAX_TOKENS_RANGE[1])
    retry: Optional[RetryFile] = None


class OpenAIOptions(ModelOptions):
    """An OpenAI-compatible server has no default: ``base_url`` is required."""

    base_url: _Url


def _script(steps: list[EchoStep], name: str, source: Optional[str]) -> list[dict[str, Any]]:
    """Each step in one form, ``{answer}`` or ``{calls}``; every call's arguments walked for NaN and infinity."""
    out: list[dict[str, Any]] = []
    for j, step in enumerate(steps):
        where_ = f"{name}.script[{j}]"
        if step.answer is not None:
            out.append({"answer": step.answer})
            continue
        calls = step.calls if step.calls is not None else [EchoCall.model_construct(tool=step.tool, arguments=step.arguments)]
        checked: list[dict[str, Any]] = []
        for k, call in enumerate(calls):
            cwhere = where_ if step.calls is None else f"{where_}.calls[{k}]"
            arguments = dict(call.arguments or {})
            _refuse_non_finite(arguments, f"{cwhere}.arguments", source)
            checked.append({"tool": call.tool, "arguments": arguments})
        out.append({"calls": checked})
    return out


def _options(kind: str, options: dict[str, Any], name: str, source: Optional[str]) -> dict[str, Any]:
    """The entry's keys but ``kind``, checked by its kind's model; numbers as the model made them, a script in one form."""
    model = EchoOptions if kind == "echo" else OpenAIOptions if kind == "openai" else ModelOptions
    checked = read_section(model, options, name, source)
    out = {key: getattr(checked, key) for key in options}
    if isinstance(checked, EchoOptions) and checked.script:
        out["script"] = _script(checked.script, name, source)
    if "retry" in out:
        out["retry"] = (out["retry"] or RetryFile()).model_dump()
    return out


def provider_entries(llm: list[Any], prefix: str, source: Optional[str]) -> list[Provider]:
    """A model chain's entries (``providers.llm``, a seat's ``providers``), each kind's keys checked and no secret inline."""
    providers = []
    for i, entry in enumerate(llm):
        name = f"{prefix}[{i}]"
        entry = _mapping(entry, name, source)
        kind = entry.get("kind")
        if kind not in PROVIDER_KINDS:
            raise CompanyError(f"{name}.kind", kind, f"must be one of {', '.join(PROVIDER_KINDS)}", source)
        options = {k: v for k, v in entry.items() if k != "kind"}
        for key in options:
            if is_secret_name(str(key)):
                _refuse_inline_secret(
                    f"{name}.{key}",
                    "a secret is never written in the company file: name the environment variable "
                    "that holds it in api_key_env",
                    source,
                )
        providers.append(Provider(kind=kind, options=_options(kind, options, name, source)))
    return providers


class ProvidersFile(FileModel):
    """``providers``: the company's chain (``llm``) and the chain reflections call (``reflection``)."""

    llm: Optional[list[Any]] = words(None, "must be a list (empty = a company with no model provider)")
    reflection: Optional[list[Any]] = words(None, "must be a list (empty = each seat's own chain)")


def parse_providers(value: Any, source: Optional[str]) -> tuple[list[Provider], list[Provider]]:
    """``providers.llm`` in fallback order and ``providers.reflection``, each entry checked."""
    body = read_section(ProvidersFile, value, "providers", source)
    return (
        provider_entries(body.llm or [], "providers.llm", source),
        provider_entries(body.reflection or [], f"providers.{REFLECTION_KEY}", source),
    )


__all__ = [
    "ECHO_DELAY_RANGE_S", "EchoOptions", "ModelOptions", "PROVIDER_TIMEOUT_RANGE_S", "parse_providers", "provider_entries",
]
