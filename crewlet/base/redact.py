"""Credential redaction: the one place that decides what looks like a secret, for logs, spans and stored errors.

A house rule: no secret, token or signature ever reaches a log line, a span
exported to a collector, or an error kept in an event. Callers cannot be
trusted to keep credentials out of what they log — a library logs what it was
given (Django's ``django.request`` puts the whole request on a 4xx record), a
vendor's error quotes the key it refused, a tool server prints its own config —
so every sink runs its text through :func:`redact` as a last line of defence.
Defining the rules once means a log line, a span and a stored provider error
can never disagree about what a credential is.

:func:`redact` replaces with :data:`REDACTED`:

* the value of a credential header quoted as text (``Authorization: …``,
  ``Cookie: …``, ``X-…-Signature: …``, ``X-…-Token: …``);
* the value of a credential ``name=value`` pair — a query parameter, a form
  field, a cookie or free text (``?secret=``, ``&access_token=``,
  ``password=``, ``api_key=``, ``sig=``, ``key=``), and a quoted key of a
  JSON or Python mapping (``"password": "…"``);
* a bearer token in free text (``Bearer …``, ``Token …``);
* a token whose shape gives it away wherever it stands: ``sk-…`` (OpenAI,
  Anthropic), ``sk_live_…``/``rk_live_…`` (Stripe), ``xoxb-…``/``xapp-…``
  (Slack), ``ghp_…``/``github_pat_…`` (GitHub), ``glpat-…`` (GitLab),
  ``AKIA…`` (AWS), ``AIza…`` (Google), a JWT, a PEM private key;
* the password of a URL (``scheme://user:password@host``).

It is idempotent (a redacted text is returned unchanged) and keeps everything
else, so a line stays useful: ``page=2`` and a token's *name*
(``env:CREWLET_OPERATOR_TOKEN``) are not secrets.

Pure Python, no Django: the bottom layer the core and every app may import.
"""
from __future__ import annotations

import re
from typing import Callable, Union
from urllib.parse import unquote_plus

#: What a credential's value is replaced with.
REDACTED = "[redacted]"

_CREDENTIAL_WORDS = r"(?:secret|token|signature|sig|password|passwd|pwd|api[_-]?key|authorization|cookie|sessionid|csrftoken|credentials?)"
#: A field (or dict key) named like a credential: the word ends the name (``access_token``, ``x-hub-signature-256``).
_SECRET_NAME = re.compile(rf"(?i)(?:^|[_.\-]){_CREDENTIAL_WORDS}(?:[_-]?256)?$|^{_CREDENTIAL_WORDS}$")
#: The name of a credential parameter (query, form, cookie, ``name=value`` in text): a credential word, or
#: ``key`` on its own or after a separator (``key``, ``api_key``, ``access-key``; not ``monkey``), ending the name.
_PARAM_NAME = rf"[\w.\-]*?(?:{_CREDENTIAL_WORDS}|(?<![A-Za-z0-9])key)"
_SECRET_PARAM = re.compile(rf"(?i){_PARAM_NAME}")
#: Not at a value already redacted (with the quote or ``b'`` that may open it), so redaction is idempotent.
_NOT_YET = r"(?!\s*(?:b?['\"])?\[redacted\])"
#: Tokens recognisable by their shape alone; group 1 (the vendor's prefix) is kept, so a line still says what leaked.
_TOKEN_SHAPES = (
    r"(?<![\w-])(sk-)[A-Za-z0-9_\-]{16,}",
    r"(?<![\w-])([sr]k_(?:live|test)_)[A-Za-z0-9]{10,}",
    r"(?<![\w-])(xox[abposre]-|xapp-)[A-Za-z0-9\-]{8,}",
    r"(?<![\w-])(gh[pousr]_)[A-Za-z0-9]{20,}",
    r"(?<![\w-])(github_pat_)[A-Za-z0-9_]{20,}",
    r"(?<![\w-])(glpat-)[A-Za-z0-9_\-]{20,}",
    r"(?<![A-Za-z0-9])(AKIA)[0-9A-Z]{16}(?![A-Za-z0-9])",
    r"(?<![\w-])(AIza)[0-9A-Za-z_\-]{35}",
    r"(?<![\w-])(eyJ)[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+",
)


def _shape(match: re.Match[str]) -> str:
    """A shaped token's replacement: its vendor prefix (whichever alternative matched), then :data:`REDACTED`."""
    prefix = next((group for group in match.groups() if group), "")
    return prefix + REDACTED


#: (pattern, replacement) in the order they run; a replacement is a template or a function of the match.
_TEXT_RULES: tuple[tuple[re.Pattern[str], Union[str, Callable[[re.Match[str]], str]]], ...] = (
    # A PEM private key, whole.
    (
        re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.DOTALL),
        rf"-----BEGIN \1PRIVATE KEY-----{REDACTED}-----END \1PRIVATE KEY-----",
    ),
    # A header rendered as text, a dict item or an ASGI (name, value) pair: Authorization: …, (b'cookie', b'…').
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization|(?:set-)?cookie|x-[\w-]*?(?:signature|token|secret)(?:-256)?)"
            rf"(\s*['\"]?\s*[:=,]\s*(?:b?['\"])?){_NOT_YET}[^'\"\r\n]+"
        ),
        rf"\1\2{REDACTED}",
    ),
    # A quoted credential key of a mapping rendered as text: {"password": "…"}, {'api_key': '…'}.
    (
        re.compile(rf"(?i)(['\"]{_PARAM_NAME}['\"]\s*:\s*b?)(['\"]){_NOT_YET}(?:(?!\2)[^\\\r\n]|\\.)+\2"),
        rf"\1\2{REDACTED}\2",
    ),
    # A credential name=value: a query parameter, a form field, a cookie, free text (?secret=…, password=…, sessionid=…).
    (
        re.compile(rf"(?i)((?<![\w.\-]){_PARAM_NAME}=){_NOT_YET}[^&#\s'\"<>;,]+"),
        rf"\1{REDACTED}",
    ),
    # A percent-encoded credential name=value in free text (a logged request line): %73ecret=… spells secret=….
    (
        re.compile(rf"(?<![\w.\-%])([\w.\-%]*%[0-9A-Fa-f]{{2}}[\w.\-%]*=){_NOT_YET}([^&#\s'\"<>;,]+)"),
        lambda m: f"{m.group(1)}{REDACTED}" if is_secret_param(unquote_plus(m.group(1)[:-1]).strip()) else m.group(0),
    ),
    # A bearer token in free text.
    (re.compile(rf"\b((?i:bearer)|Token)(\s+){_NOT_YET}[A-Za-z0-9._~+/=\-]{{12,}}"), rf"\1\2{REDACTED}"),
    # A token known by its shape.
    (re.compile("|".join(f"(?:{shape})" for shape in _TOKEN_SHAPES)), _shape),
    # The password of a URL: scheme://user:password@host (one already masked as *** stays so).
    (re.compile(rf"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@'\"]*:)(?!\[redacted\]@|\*+@)[^@\s/'\"]+@"), rf"\1{REDACTED}@"),
)


def is_secret_name(name: str) -> bool:
    """Whether a field, parameter or header called ``name`` holds a credential (``access_token``, ``x-hub-signature``)."""
    return bool(_SECRET_NAME.search(name))


def is_secret_param(name: str) -> bool:
    """Whether a query, form or cookie parameter called ``name`` (already decoded) holds a credential.

    Wider than :func:`is_secret_name`: a parameter named ``key`` (or ``…_key``)
    is an API key often enough that its value is never worth showing.
    """
    return bool(_SECRET_PARAM.fullmatch(name))


def redact(text: str) -> str:
    """``text`` with every credential it quotes replaced by :data:`REDACTED`; everything else kept, idempotent.

    The one redaction function of the code base: log formatters, span
    attributes, tool-server output and provider errors stored in events all
    pass through it, so they agree on what a credential is.
    """
    for pattern, replacement in _TEXT_RULES:
        text = pattern.sub(replacement, text)
    return text


def redact_query(query: str) -> str:
    """A URL query string (``a=1&secret=x``, no ``?``) with each credential parameter's value replaced, then :func:`redact`.

    Parameters are judged by their *decoded* name, so ``%73ecret=`` is the
    ``secret`` it spells; each value is replaced whole, so a value holding an
    encoded ``&`` cannot leave its tail behind. Other parameters keep their
    text as sent.
    """
    if not query:
        return query
    parts = []
    for part in re.split(r"([&;])", query):
        name, sep, _value = part.partition("=")
        if sep and is_secret_param(unquote_plus(name).strip()):
            part = f"{name}={REDACTED}"
        parts.append(part)
    return redact("".join(parts))


__all__ = ["REDACTED", "is_secret_name", "is_secret_param", "redact", "redact_query"]
