"""The one module for JSON text safety: depth without recursion, and the characters no store can hold."""
from __future__ import annotations

import json

import pytest

from crewlet.base.jsontext import (
    JSONTooDeep,
    depth_exceeds,
    dotted,
    find_unstorable,
    load_json,
    nesting_depth,
    storable,
    storable_text,
)


@pytest.mark.parametrize(
    "text, depth",
    [
        ('{"a": [1, {"b": "[[[{{{"}], "c": "\\"]]]"}', 3),
        ("[]", 1),
        ("1", 0),
        ('{"k": "\\\\"}', 1),
        ("[" * 600 + "]" * 600, 600),
    ],
)
def test_the_depth_scan_reads_text_and_utf8_bytes_alike(text: str, depth: int) -> None:
    assert nesting_depth(text) == nesting_depth(text.encode()) == depth
    assert depth_exceeds(text, depth - 1) and not depth_exceeds(text, depth)
    assert depth_exceeds(text.encode(), depth - 1) and not depth_exceeds(text.encode(), depth)


def test_a_document_past_the_callers_limit_is_refused_before_it_is_decoded() -> None:
    deep = "[" * 100_000 + "]" * 100_000  # the recursive decoder would overflow on this
    with pytest.raises(JSONTooDeep, match="deeper than 64 levels"):
        load_json(deep, max_depth=64)
    with pytest.raises(JSONTooDeep):
        load_json(deep.encode("utf-16"), max_depth=64)
    assert load_json(b'{"a": [1]}', max_depth=2) == {"a": [1]}


def test_the_finder_names_the_first_unstorable_place_in_document_order_with_its_path() -> None:
    value = json.loads('{"ok": "x", "a": [{"b": "\\ud800"}, "\\u0000"], "z": "\\u0000"}')
    found = find_unstorable(value)
    assert found is not None and found.parts == ("a", 0, "b") and found.char == "\ud800" and not found.in_key
    assert dotted(found.parts) == "a[0].b" and dotted(found.parts, "header") == "header.a[0].b"
    key = find_unstorable({"outer": {"fine": 1, "k\x00": 2}, "later": "\x00"})
    assert key is not None and key.parts == ("outer", "k\x00") and key.in_key and key.is_nul
    assert find_unstorable({"emoji": "\U0001f600", "n": [1, 2.5, None, True]}) is None


def test_storable_text_escapes_and_clips_what_it_quotes() -> None:
    assert storable_text("a\x00b\udc00") == "a\\u0000b\\udc00"
    assert storable_text("x" * 300, 10) == "x" * 9 + "…"
    plain = "ünïcode"
    assert storable(plain) is plain
