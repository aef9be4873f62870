"""What a webhook source is: the request the edge hands it, and the three things it answers.

A source (one vendor, one module beside this one) says how a delivery
proves it is authentic (``verify`` with the company's secret, or
``authenticate`` against the coordination store), what its headers and query
say that the body does not (``meta``), how a form-encoded body carries its
JSON (``form``), what the vendor must be answered beyond ``202``
(``acknowledge``), and what the body means (its
:class:`~notifications.parsers.Parser`). The edge, the router and the urls
read sources only through the registry in :mod:`notifications.sources`, so
nothing outside a vendor's module branches on the vendor's name.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Optional, Union

from crewlet.company.org import Organization, Seat
from notifications.parsers import DeliveryMeta, FormReader, Parser, Recipient, body_digest_id


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


@dataclass(frozen=True)
class Acknowledgement:
    """What an accepted delivery is answered with when its vendor expects more than ``202``: ``200`` and ``body``.

    ``body`` None is an empty body (Slack's acknowledgement of an interaction).
    """

    body: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class Credential:
    """One secret a delivery may be verified with, by name: the variable holding it and what it belongs to.

    ``owner`` says whose secret it is in a refusal ("the Slack app A0ADA of
    seat ada"); ``key`` is the company-file key naming the variable, for the
    hint when it is unset. Never the value.
    """

    env: str
    owner: str
    key: str


#: ``credentials(request, org)``: which secrets verify this delivery (one passing is enough), a refusal's
#: reason, or None for the surface's own secret (``surfaces.<kind>``), as every vendor's is by default.
CredentialPicker = Callable[[InboundRequest, Organization], Union[tuple[Credential, ...], str, None]]
#: ``verify(secret, request, now)``: None when the request is authentic, else why not.
Verifier = Callable[[str, InboundRequest, float], Optional[str]]
#: ``meta(request)``: the labels the headers and the query give a delivery.
MetaReader = Callable[[InboundRequest], DeliveryMeta]
#: ``handshake(payload)``: the endpoint check this payload is, or None for a real delivery.
HandshakeReader = Callable[[Mapping[str, Any]], Optional[Handshake]]
#: ``acknowledge(payload, org)``: the answer an accepted delivery gets, or None for ``202``.
Acknowledger = Callable[[Mapping[str, Any], Organization], Optional[Acknowledgement]]
#: ``authenticate(request, org)``: None when the request may pass, else (status, reason); for a source with no company secret.
Authenticator = Callable[[InboundRequest, Organization], Awaitable[Optional[tuple[int, str]]]]
#: ``anonymous_id(body)``: the delivery id of a delivery that names none.
AnonymousId = Callable[[bytes], str]
#: ``validate(payload, meta)``: why a decoded body is refused (400), or None.
Validator = Callable[[Mapping[str, Any], DeliveryMeta], Optional[str]]


def query_meta(req: InboundRequest) -> DeliveryMeta:
    """The meta of a vendor whose body names the event and the delivery: only the query."""
    return DeliveryMeta(query=dict(req.query))


def no_handshake(payload: Mapping[str, Any]) -> Optional[Handshake]:
    """A vendor that never checks the endpoint with a special delivery."""
    return None


def seat_for(org: Organization, parser: Parser, identity: str, aliases: tuple[str, ...] = ()) -> Optional[Seat]:
    """The seat that ``identity`` or one of ``aliases`` is on ``parser``'s surface (compared as the surface compares).

    A seat is its identity there and, on Slack, its own app too
    (:meth:`~crewlet.company.org.Seat.own_ids`): a post by its bot names the app.
    """
    wanted = {parser.normalize(i) for i in (identity, *aliases) if i}
    if not wanted:
        return None
    for seat in org.seats:
        if any(parser.normalize(ident) in wanted for ident in seat.own_ids(parser.source)):
            return seat
    return None


def seat_of_recipient(org: Organization, parser: Parser, recipient: Recipient) -> Optional[Seat]:
    """The seat a recipient names: by handle when it was addressed by one (else by its aliases), else by its surface identity."""
    if recipient.by_handle:
        return org.seat_by_handle(recipient.identity) or seat_for(org, parser, "", recipient.aliases)
    return seat_for(org, parser, recipient.identity, recipient.aliases)


def hmac_sha256_hex(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    """Constant-time string equality, so a signature check leaks nothing through its timing.

    Either side may be a sender's text with a lone surrogate (a JSON
    ``\\ud800``), which has no UTF-8: it is compared by its escape, so such a
    token is simply a token that does not match, never a crash.
    """
    return hmac.compare_digest(a.encode("utf-8", "backslashreplace"), b.encode("utf-8", "backslashreplace"))


@dataclass(frozen=True)
class Source:
    """One vendor as the edge, the router and the urls see it.

    ``headers``: the vendor's delivery headers kept on the ``raw_webhook``
    (never a signature or a token). ``filtered_event``: the debug event a chat
    vendor's own filtering is logged under. ``form``: how a form-encoded body
    carries the delivery (None: JSON only). ``authenticate``: set for a
    source that is no company surface (``company_surface`` False), whose
    credential lives in the coordination store instead of a secret variable.
    ``path``: what the route adds after ``/webhooks/<name>/`` (a Django path
    pattern, e.g. ``<str:seat>``). ``anonymous_id``: the id of a delivery
    that names none — a digest of its bytes, since a vendor's retry repeats
    them; a source whose callers send the same bytes on purpose mints a fresh one.
    """

    parser: Parser
    verify: Verifier
    meta: MetaReader = query_meta
    headers: tuple[str, ...] = ()
    handshake: HandshakeReader = no_handshake
    filtered_event: str = ""
    form: Optional[FormReader] = None
    acknowledge: Optional[Acknowledger] = None
    validate: Optional[Validator] = None
    authenticate: Optional[Authenticator] = None
    #: Which of the company's secrets verify a delivery when the surface has several (Slack: one per app).
    credentials: Optional[CredentialPicker] = None
    path: str = ""
    anonymous_id: AnonymousId = body_digest_id

    @property
    def company_surface(self) -> bool:
        """A kind in the company file's ``surfaces:`` (verified with its secret), unless the source authenticates itself."""
        return self.authenticate is None

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
    "Acknowledgement",
    "Acknowledger",
    "AnonymousId",
    "Authenticator",
    "Credential",
    "CredentialPicker",
    "Handshake",
    "HandshakeReader",
    "InboundRequest",
    "MetaReader",
    "Source",
    "Validator",
    "Verifier",
    "default_filtered_event",
    "hmac_sha256_hex",
    "no_handshake",
    "query_meta",
    "same",
    "seat_for",
    "seat_of_recipient",
]
