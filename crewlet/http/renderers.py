"""The API's JSON renderer (every app's routes): orjson, with DRF's encoder for what orjson would spell differently.

A page of ``/api/events`` is ~50 KB of JSON; the stdlib encoder spent ~0.7 ms
on it, orjson a tenth of that. The JSON *values* are DRF's: datetimes, dates
and times go through DRF's encoder (orjson's native forms differ: ``+00:00``
vs ``Z``), as do Decimals, lazy strings, querysets and the rest, via orjson's
``default=``. What differs is only spelling: non-ASCII text is written as
UTF-8 rather than ``\\u`` escapes (U+2028/U+2029 are still escaped, as DRF
does). Anything orjson refuses outright (an int beyond 64 bits, a non-string
key) and any indented rendering (``Accept: application/json; indent=4``) is
rendered by DRF's own renderer, unchanged. One value is spelled differently
on purpose: a NaN or infinite float becomes ``null`` (DRF's strict renderer
raised on it); no read returns one.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

import orjson
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

log = logging.getLogger("crewlet.http.renderers")

#: Datetimes and dataclasses are left to DRF's encoder, so their JSON is what it always was.
OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_default = JSONEncoder().default
_LINE_SEPARATOR = "\u2028".encode()
_PARAGRAPH_SEPARATOR = "\u2029".encode()
_SEPARATOR_LEAD = _LINE_SEPARATOR[:2]  # both start with E2 80


class OrjsonRenderer(JSONRenderer):
    """``application/json`` through orjson; DRF's ``JSONRenderer`` where orjson cannot say the same thing."""

    def render(
        self,
        data: Any,
        accepted_media_type: Optional[str] = None,
        renderer_context: Optional[Mapping[str, Any]] = None,
    ) -> bytes:
        if data is None:
            return b""
        if self.get_indent(accepted_media_type, renderer_context or {}) is not None:
            return super().render(data, accepted_media_type, renderer_context)
        try:
            out = orjson.dumps(data, default=_default, option=OPTIONS)
        except orjson.JSONEncodeError as exc:
            # Let DRF's renderer answer (or raise) exactly as it did before orjson.
            log.debug("orjson_fallback", extra={"reason": str(exc)})
            return super().render(data, accepted_media_type, renderer_context)
        # A strict JavaScript subset, as DRF's renderer guarantees. isascii() first:
        # it is ~10x cheaper than searching a 50 KB page for the two separators.
        if not out.isascii() and _SEPARATOR_LEAD in out:
            out = out.replace(_LINE_SEPARATOR, b"\\u2028").replace(_PARAGRAPH_SEPARATOR, b"\\u2029")
        return out


class _NoFormatOverride:
    """The one setting DefaultContentNegotiation reads, with the ``?format=`` override off."""

    URL_FORMAT_OVERRIDE = None


class AcceptOnlyNegotiation(DefaultContentNegotiation):
    """Chooses the renderer by ``Accept`` alone.

    The reads check every query parameter themselves, and ``format`` is not one
    of theirs: DRF's override would answer an unknown format with a bare 404
    before the view runs, where the reads answer 400 naming the parameter.
    """

    settings = _NoFormatOverride
