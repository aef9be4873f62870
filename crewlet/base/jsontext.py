"""JSON text that no decoder overflows on and no store refuses: the one place those checks live.

Two hazards follow untrusted JSON from the wire into the stores, and every
reader of such JSON (the API's request bodies, the webhook edge and its
router, a seat's inbox) meets them the same way:

* **Nesting.** The standard decoder recurses once per array or object, so a
  body nested a few thousand levels deep overflows the interpreter's stack (a
  500, not a refusal). :func:`nesting_depth` measures the depth of the raw
  text with C-level iterators and no recursion, and :func:`load_json` refuses
  a document past a caller's limit (:class:`JSONTooDeep`) before decoding it.
  Each caller keeps its own limit: an API body is small, a webhook is not.
* **Characters no store can hold.** PostgreSQL refuses a NUL in text and
  jsonb, and no driver encodes a lone UTF-16 surrogate as UTF-8; JSON lets
  both through as ``\\u0000`` / ``\\ud800`` escapes. :func:`find_unstorable`
  names the first key or string holding one (walked with an explicit stack,
  so depth costs no call stack) and each caller words its own refusal;
  :func:`storable` and :func:`storable_value` instead write each such
  character as its ``\\uXXXX`` escape, for values that must be kept rather
  than refused, and :func:`storable_text` does the same for quoting a sender's
  words in a reason or a log line.

Pure Python, no Django: the bottom layer every app may import.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from itertools import accumulate, count
from operator import sub
from typing import Any, Callable, Optional, Union

#: How much of a sender's text :func:`storable_text` quotes by default.
QUOTE_LIMIT = 200

#: A JSON string (escapes included, so a bracket inside one is not nesting), or a stray escape.
#: A string that never ends is not cut, so its brackets count: that can only call a malformed
#: document too deep, and both are refused.
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"|\\.'
_STRING_TEXT = re.compile(_STRING, re.DOTALL)
_STRING_BYTES = re.compile(_STRING.encode("ascii"), re.DOTALL)
#: Everything but the structural brackets, once strings are gone.
_NOT_BRACKET_TEXT = re.compile(r"[^\[\]{}]+")
_NOT_BRACKET_BYTES = re.compile(rb"[^\[\]{}]+")
#: Each opener a step of 2, each closer of 0 (see :func:`nesting_depth`).
_STEPS_TEXT = str.maketrans({"[": "\x02", "{": "\x02", "]": "\x00", "}": "\x00"})
_STEPS_BYTES = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
#: What a stored string may not contain.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: Where, in UTF-8 JSON bytes, such a character can come from.
_UNSTORABLE_HINT = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})|\x00|\xed[\xa0-\xbf]")
_NUL = "\x00"
_NUL_ESCAPE = "\\u0000"

JSONText = Union[str, bytes, bytearray]
#: What a walk for strings passes over without a look.
_SCALARS = (int, float, type(None))
#: A place in a value being walked: (the parent's link, the key or index), None at the root.
_Link = Optional[tuple[Any, Union[str, int]]]


class JSONTooDeep(ValueError):
    """A JSON document nests deeper than its reader's limit."""


# ---------------------------------------------------------------------------
# nesting


def nesting_depth(text: JSONText, stop_above: Optional[int] = None) -> int:
    """How deep the arrays and objects of the JSON ``text`` (str or bytes) nest, found without recursion.

    Strings (and any stray escape) are cut out first, so a bracket inside a
    string never counts; what is left is folded into running depths by
    C-level iterators, linear in the text. With ``stop_above`` a depth past it
    is reported as ``stop_above + 1`` (the first depth that passes it).
    """
    if isinstance(text, str):
        brackets = _NOT_BRACKET_TEXT.sub("", _STRING_TEXT.sub("", text))
        steps = brackets.translate(_STEPS_TEXT).encode("latin-1")
    else:
        steps = _NOT_BRACKET_BYTES.sub(b"", _STRING_BYTES.sub(b"", bytes(text))).translate(_STEPS_BYTES)
    # Each opener adds 2 and each bracket costs 1: the running total minus the
    # brackets seen is the depth after each one.
    deepest = max(map(sub, accumulate(steps), count(1)), default=0)
    return deepest if stop_above is None or deepest <= stop_above else stop_above + 1


def depth_exceeds(text: JSONText, max_depth: int) -> bool:
    """True when ``text`` opens more than ``max_depth`` arrays or objects inside each other."""
    if isinstance(text, str):
        openers = text.count("[") + text.count("{")
    else:
        openers = text.count(b"[") + text.count(b"{")
    if openers <= max_depth:
        return False
    return nesting_depth(text, stop_above=max_depth) > max_depth


def load_json(raw: JSONText, *, max_depth: int, parse_constant: Optional[Callable[[str], Any]] = None) -> Any:
    """``json.loads``, refusing a document nested past ``max_depth`` (:class:`JSONTooDeep`) before decoding it.

    Bytes are decoded in the encoding JSON detects, a lone surrogate kept (so
    :func:`find_unstorable` can name it rather than the decode failing on it).
    ``parse_constant`` is ``json.loads``'s hook for ``NaN`` and ``Infinity``.
    """
    text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, (bytes, bytearray)) else raw
    if depth_exceeds(text, max_depth):
        raise JSONTooDeep(f"the JSON nests deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=parse_constant)
    except RecursionError as exc:  # a caller already deep in its own stack
        raise JSONTooDeep(f"the JSON nests too deep to decode here: {exc}") from exc


# ---------------------------------------------------------------------------
# characters no store can hold


def may_hold_unstorable(raw: bytes) -> bool:
    """False when UTF-8 JSON bytes cannot decode to a NUL or a lone surrogate, so no walk is needed.

    In UTF-8 JSON those characters arrive only as a ``\\u0000`` or
    ``\\uD800``-``\\uDFFF`` escape (also inside a JSON document carried as a
    string, where the escape is itself escaped) or as raw bytes the decoder
    lets through. Conservative: a surrogate pair (an emoji escaped) also says
    True, and the walk then finds nothing.
    """
    if json.detect_encoding(raw) not in ("utf-8", "utf-8-sig"):
        return True
    return _UNSTORABLE_HINT.search(raw) is not None


def escape(char: str) -> str:
    """One character as its ``\\uXXXX`` escape (how a reason names a NUL or a surrogate)."""
    return f"\\u{ord(char):04x}"


@dataclass(frozen=True)
class Unstorable:
    """Where a JSON-shaped value holds a character no store can keep.

    ``parts`` is the path to the string or key, from the root: keys and list
    indices. ``in_key`` says the character is in the last key of ``parts``
    rather than in a string value. ``char`` is the first such character.
    """

    parts: tuple[Union[str, int], ...]
    char: str
    in_key: bool

    @property
    def is_nul(self) -> bool:
        return self.char == _NUL


def dotted(parts: tuple[Union[str, int], ...], start: str = "", key: Callable[[str], str] = str) -> str:
    """A path as ``start.key[0].inner``, each key spelled by ``key`` (no dot before the first key)."""
    out = [start]
    begun = bool(start)
    for part in parts:
        step = f"[{part}]" if isinstance(part, int) else (f".{key(part)}" if begun else key(part))
        out.append(step)
        begun = begun or bool(step)
    return "".join(out)


def find_unstorable(value: Any) -> Optional[Unstorable]:
    """The first key or string in ``value`` that holds a NUL or a lone surrogate; None when there is none.

    Walks mappings, lists, tuples and dataclass instances with an explicit
    stack, so a value nested as deep as the decoder allowed costs no call
    stack. A mapping's keys are looked at before anything inside it; strings
    are found in document order. The path is kept as links to the parent's
    and spelled out only for the place found.
    """
    stack: list[tuple[Any, _Link]] = [(value, None)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            char = _first_unstorable(item)
            if char:
                return Unstorable(_parts(at), char, in_key=False)
        elif isinstance(item, (list, tuple)):
            for index in range(len(item) - 1, -1, -1):
                child = item[index]
                if not isinstance(child, _SCALARS):
                    stack.append((child, (at, index)))
        elif isinstance(item, (dict, Mapping)):
            for key, child in reversed(list(item.items())):
                name = key if isinstance(key, str) else str(key)
                char = _first_unstorable(name)
                if char:
                    return Unstorable(_parts((at, name)), char, in_key=True)
                if not isinstance(child, _SCALARS):
                    stack.append((child, (at, name)))
        elif is_dataclass(item) and not isinstance(item, type):
            stack.append(({f.name: getattr(item, f.name) for f in fields(item)}, at))
    return None


def _first_unstorable(text: str) -> str:
    """The first NUL or lone surrogate in ``text``, else ""."""
    if _NUL not in text and text.isascii():
        return ""
    bad = _UNSTORABLE.search(text)
    return "" if bad is None else bad.group()


def _parts(at: _Link) -> tuple[Union[str, int], ...]:
    out: list[Union[str, int]] = []
    while at is not None:
        at, part = at
        out.append(part)
    return tuple(reversed(out))


def holds_unstorable(value: Any) -> bool:
    """Whether any key or string in a JSON-shaped value holds a NUL or a lone surrogate."""
    return find_unstorable(value) is not None


def _is_storable(text: str) -> bool:
    if _NUL in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(text: str) -> str:
    """``text`` with every NUL and lone surrogate written as its ``\\uXXXX`` escape; ``text`` itself otherwise.

    The same escape for the same value, so an identity made of it stays stable.
    """
    if _is_storable(text):
        return text
    text = text.replace(_NUL, _NUL_ESCAPE)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def storable_text(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` made :func:`storable` and clipped to ``limit`` characters, for quoting it in a reason or a log line."""
    return storable(text if len(text) <= limit else text[: limit - 1] + "…")


def storable_value(value: Any) -> Any:
    """A JSON-shaped value with every string (keys included) made :func:`storable`; ``value`` itself when none needed it.

    Walked with an explicit stack: a value nested as deep as the JSON decoder
    allowed must not overflow the interpreter's stack here.
    """
    if not holds_unstorable(value):
        return value
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        item = parent[key]
        if isinstance(item, str):
            parent[key] = storable(item)
        elif isinstance(item, dict):
            rebuilt: dict[Any, Any] = {}
            for k, v in item.items():
                nk = storable(k) if isinstance(k, str) else k
                rebuilt[nk] = v
                stack.append((rebuilt, nk))
            parent[key] = rebuilt
        elif isinstance(item, (list, tuple)):
            items = list(item)
            parent[key] = items
            stack.extend((items, i) for i in range(len(items)))
    return root[0]


__all__ = [
    "JSONText",
    "JSONTooDeep",
    "QUOTE_LIMIT",
    "Unstorable",
    "depth_exceeds",
    "dotted",
    "escape",
    "find_unstorable",
    "holds_unstorable",
    "load_json",
    "may_hold_unstorable",
    "nesting_depth",
    "storable",
    "storable_text",
    "storable_value",
]
