"""Which model providers cannot authenticate for want of their key variable: said once at start, by name.

A vendor provider reads its key at call time from the variable its entry
names in ``api_key_env`` (:mod:`seats.provider_sdk`); left unset, every call
is an ``auth`` failure and the chain moves on, so the first message would be
the first to find out. The seat runtime says so at start instead, one
``provider_key_missing`` warning per entry naming the entry, the provider and
the VARIABLE — never a value. An entry that names no variable is keyless
(a local OpenAI-compatible server at its ``base_url``) except an
``anthropic`` entry on the vendor's own API, which always needs a key.
Echo needs none.

:func:`unset_provider_keys` checks any iterable of provider entries (the
company's chain, a seat's own); :func:`provider_chains` lists the chains a
company has, each under the field it is written at.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Mapping

from crewlet.company.org import Organization, Provider

log = logging.getLogger("crewlet.seats.providers")

#: The provider kinds that call no vendor and so need no key.
KEYLESS_KINDS = ("echo",)
#: The kinds whose default server (no ``base_url``) is the vendor's own API, where a key is always needed.
VENDOR_DEFAULT_SERVER_KINDS = ("anthropic",)


@dataclass(frozen=True)
class UnsetKey:
    """One provider entry whose key is missing: where it is written, which provider, which variable ("" = none named)."""

    entry: str
    provider: str
    variable: str

    @property
    def hint(self) -> str:
        if self.variable:
            return f"every call to {self.provider} fails as auth and the chain moves on until {self.variable} is set in this process's environment"
        return f"{self.provider} is the vendor's own API, which needs a key: name its variable with {self.entry}.api_key_env"


def unset_provider_keys(providers: Iterable[Provider], environ: Mapping[str, str], *, entry: str = "providers.llm") -> list[UnsetKey]:
    """The entries of one chain (written at ``entry``) whose key variable is unset or empty in ``environ``."""
    missing = []
    for i, provider in enumerate(providers):
        if provider.kind in KEYLESS_KINDS:
            continue
        variable = str(provider.options.get("api_key_env", "") or "")
        if variable and not environ.get(variable, ""):
            missing.append(UnsetKey(f"{entry}[{i}]", provider.key, variable))
        elif not variable and provider.kind in VENDOR_DEFAULT_SERVER_KINDS and not provider.options.get("base_url"):
            missing.append(UnsetKey(f"{entry}[{i}]", provider.key, ""))
    return missing


def provider_chains(org: Organization) -> list[tuple[str, tuple[Provider, ...]]]:
    """Every model chain of the company, each with the field it is written at: the company's, then each seat's own."""
    own = [(f"seats.{seat.handle}.providers", seat.providers) for seat in org.agent_seats() if seat.providers]
    return [("providers.llm", org.providers), *own]


def warn_unset_provider_keys(org: Organization, environ: Mapping[str, str]) -> list[UnsetKey]:
    """One ``provider_key_missing`` warning per entry of any chain whose key is missing; returns them."""
    missing = [m for entry, chain in provider_chains(org) for m in unset_provider_keys(chain, environ, entry=entry)]
    for m in missing:
        log.warning("provider_key_missing", extra={"entry": m.entry, "provider": m.provider, "variable": m.variable, "hint": m.hint})
    return missing


__all__ = ["KEYLESS_KINDS", "UnsetKey", "provider_chains", "unset_provider_keys", "warn_unset_provider_keys"]
