"""What a webhook source is: the request the edge hands it, and the three things it answers.

A source (one vendor, one module beside this one) says how a delivery
proves it is authentic (``verify``), what its headers and query say that the
body does not (``meta``), and what the body means (its
:class:`~notifications.parsers.Parser`). The edge, the router and the urls
read sources only through the registry in :mod:`notifications.sources`, so
nothing outside a vendor's module branches on the vendor's name.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from notifications.parsers import DeliveryMeta, Parser


@dataclass(frozen=True)
class InboundRequest:
    """One HTTP delivery as the edge needs it; header names lower-case."""

    source: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    route: str = ""

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "") or ""

    @property
    def content_type(self) -> str:
        return self.header("content-type")


@dataclass(frozen=True)
class Handshake:
    """A delivery the vendor sends to check the endpoint, answered at the edge and never published.

    ``answer`` is the 200 body; ``refusal`` (when set) is why the handshake
    is malformed, which the edge answers with 400.
    """

    answer: Mapping[str, Any] = field(default_factory=dict)
    refusal: str = ""


#: ``verify(secret, request, now)``: None when the request is authentic, else why not.
Verifier = Callable[[str, InboundRequest, float], Optional[str]]
#: ``meta(request)``: the labels the headers and the query give a delivery.
MetaReader = Callable[[InboundRequest], DeliveryMeta]
#: ``handshake(payload)``: the endpoint check this payload is, or None for a real delivery.
HandshakeReader = Callable[[Mapping[str, Any]], Optional[Handshake]]


def query_meta(req: InboundRequest) -> DeliveryMeta:
    """The meta of a vendor whose body names the event and the delivery: only the query."""
    return DeliveryMeta(query=dict(req.query))


def no_handshake(payload: Mapping[str, Any]) -> Optional[Handshake]:
    """A vendor that never checks the endpoint with a special delivery."""
    return None


def hmac_sha256_hex(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    """Constant-time string equality, so a signature check leaks nothing through its timing."""
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


@dataclass(frozen=True)
class Source:
    """One vendor as the edge, the router and the urls see it.

    ``headers``: the vendor's delivery headers kept on the ``raw_webhook``
    (never a signature or a token). ``filtered_event``: the debug event a chat
    vendor's own filtering is logged under.
    """

    parser: Parser
    verify: Verifier
    meta: MetaReader = query_meta
    headers: tuple[str, ...] = ()
    handshake: HandshakeReader = no_handshake
    filtered_event: str = ""

    @property
    def name(self) -> str:
        """The route, the company file's surface kind and every event's ``source``."""
        return self.parser.source

    @property
    def filtered_log(self) -> str:
        return self.filtered_event or default_filtered_event(self.name)


def default_filtered_event(name: str) -> str:
    """The debug event a source's filtering is logged under when it names none."""
    return f"{name}_event_skipped"


__all__ = [
    "Handshake",
    "HandshakeReader",
    "InboundRequest",
    "MetaReader",
    "Source",
    "Verifier",
    "default_filtered_event",
    "hmac_sha256_hex",
    "no_handshake",
    "query_meta",
    "same",
]
