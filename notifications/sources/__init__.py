"""The webhook sources: one module per vendor, and the one registry everything else reads.

Each vendor's module (``slack``, ``github``, ``jira``, ``confluence``,
``mattermost``; ``atlassian`` holds what Jira and Confluence share) defines
its ``verify`` (signature or token scheme), its ``meta`` (the labels its
headers and query give a delivery), its parser, and one
:class:`~notifications.sources.base.Source` built from them. :data:`REGISTRY`
below lists those sources, and drives:

* the routes — ``/webhooks/<name>`` exists for exactly the registered names
  (``notifications.urls``);
* the edge — verification, labels, the kept headers and the endpoint
  handshake, looked up by name (``notifications.edge``);
* routing — the parser and the filtering's log event (``notifications.service``).

The company file's surface kinds are ``crewlet.company.org.SURFACES``: the core
validates a company without importing an app. The registry refuses to load
unless its company surfaces are exactly those kinds, so a vendor cannot be
routable and unconfigurable, or configurable and unroutable. The one source
that is no company surface, ``generic`` (``POST /webhooks/generic/<seat>``,
a per-seat token from ``manage.py source_token``), authenticates itself.

Adding a vendor: write ``notifications/sources/<vendor>.py`` with its
``verify``, ``meta``, parser and ``SOURCE``; add ``<vendor>.SOURCE`` to
:data:`REGISTRY`; name the surface kind and its secret's key in
``crewlet.company.org.SURFACE_SECRET_KEYS``.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping, Optional

from crewlet.company.org import SURFACES
from notifications.parsers import Parser
from notifications.sources import confluence, generic, github, jira, mattermost, slack
from notifications.sources.base import InboundRequest, Source


class SourceRegistryError(RuntimeError):
    """The registered sources and the company file's surface kinds disagree, or a name is registered twice."""


def registry_of(sources: Iterable[Source], surface_kinds: Iterable[str]) -> Mapping[str, Source]:
    """The sources by name, refusing a duplicate name or any difference between the company surfaces and ``surface_kinds``."""
    by_name: dict[str, Source] = {}
    for source in sources:
        if source.name in by_name:
            raise SourceRegistryError(f"the source {source.name!r} is registered twice")
        by_name[source.name] = source
    kinds = tuple(surface_kinds)
    unconfigurable = [name for name, source in by_name.items() if source.company_surface and name not in kinds]
    unroutable = [kind for kind in kinds if kind not in by_name]
    if unconfigurable or unroutable:
        raise SourceRegistryError(
            "the webhook sources must match the company file's surface kinds (crewlet.company.org.SURFACES): "
            f"registered without a surface kind: {unconfigurable or 'none'}; a surface kind without a source: {unroutable or 'none'}"
        )
    return MappingProxyType(by_name)


REGISTRY: Mapping[str, Source] = registry_of(
    (slack.SOURCE, github.SOURCE, jira.SOURCE, confluence.SOURCE, mattermost.SOURCE, generic.SOURCE),
    SURFACES,
)
#: The registered names, in registry order: the routes and the 404's list.
NAMES: tuple[str, ...] = tuple(REGISTRY)
PARSERS: Mapping[str, Parser] = MappingProxyType({name: source.parser for name, source in REGISTRY.items()})
#: Every vendor's kept headers, each once, in registry order.
VENDOR_HEADERS: tuple[str, ...] = tuple(dict.fromkeys(h for source in REGISTRY.values() for h in source.headers))


def source_for(name: str) -> Optional[Source]:
    return REGISTRY.get(name)


def parser_for(name: str) -> Optional[Parser]:
    source = REGISTRY.get(name)
    return source.parser if source is not None else None


__all__ = [
    "InboundRequest",
    "NAMES",
    "PARSERS",
    "REGISTRY",
    "Source",
    "SourceRegistryError",
    "VENDOR_HEADERS",
    "parser_for",
    "registry_of",
    "source_for",
]
