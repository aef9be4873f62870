"""The one YAML loader of the settings file and the company file, and the limits it holds both to.

A file past :data:`YAML_MAX_BYTES` or not UTF-8 is refused before it is
parsed (:func:`read_yaml_text`), and a document nesting deeper than
:data:`YAML_MAX_DEPTH`, holding more than :data:`YAML_MAX_VALUES` values once
its aliases are expanded, or giving one key twice in a mapping is refused
while it is composed, before anything is built from it (:func:`load_yaml`).
Each refusal is raised as the caller's own :class:`~crewlet.company.refusal.FieldValueError`
(a settings error, a company error), so it reads like a bad value of that file.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from crewlet.company.refusal import FieldValueError

#: The most bytes a settings or company file may hold; a larger one is refused before it is parsed.
YAML_MAX_BYTES = 1024 * 1024
#: How deep a settings or company file may nest (a mapping's value or a list's item is one level down).
#: PyYAML composes a document recursively, so a deeper one would exhaust the interpreter's stack.
YAML_MAX_DEPTH = 64
#: How many values (scalars, lists and mappings) a settings or company file may hold once every alias
#: is expanded: an alias costs what it names, so nine levels of nine aliases count as 9**9, not 81.
YAML_MAX_VALUES = 100_000

#: The tag PyYAML gives a merge key (``<<: *defaults``), whose overrides are not duplicate keys.
_YAML_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLRefused(yaml.YAMLError):
    """What :class:`GuardedLoader` will not build: the dotted ``field`` ("" for the whole document), its value and why."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        super().__init__(allowed)
        self.field = field
        self.value = value
        self.allowed = allowed


class _Elided(str):
    """A value shown as itself rather than quoted (``{…}`` for a mapping a refusal does not spell out)."""

    def __repr__(self) -> str:
        return str(self)


_YAMLPath = list[Union[str, int, None]]


def _dotted(path: _YAMLPath) -> str:
    """``seats[0].handle`` from the parts of a path (None, a mapping key being composed, is left out)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part is not None:
            out += f".{part}" if out else part
    return out


class GuardedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what the safe loader takes silently or cannot survive.

    The checks run while the document is composed into nodes, before any
    Python value is built, so a refused document costs no more than its text:

    * depth — past :data:`YAML_MAX_DEPTH` levels (the composer recurses once
      per level, and 20,000 levels were a ``RecursionError``);
    * aliases — an alias counts as every value it names, so a document whose
      expansion passes :data:`YAML_MAX_VALUES` is refused however few
      characters it is (nine levels of nine aliases are 387 million values),
      and an alias inside the value it names (a value containing itself) is
      refused outright;
    * duplicate keys — the safe loader keeps the last of two equal keys without
      a word; here the second is refused, naming its path and both lines (a
      merge key's overrides, ``<<: *defaults``, are not duplicates);
    * unreadable scalars — a date like ``2024-13-45`` or a decimal integer past
      Python's digit limit is a ``ValueError`` inside PyYAML, refused here as
      invalid YAML at its line.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: _YAMLPath = []
        self._values = 0
        #: id(anchored node) -> how many values it expands to, known once it is composed.
        self._expanded: dict[int, int] = {}

    def _spend(self, values: int, mark: Any) -> None:
        self._values += values
        if self._values > YAML_MAX_VALUES:
            raise YAMLRefused(
                "", None, f"holds more than {YAML_MAX_VALUES} values once its aliases are expanded (line {mark.line + 1})"
            )

    @staticmethod
    def _part(parent: Optional[yaml.Node], index: Any) -> Union[str, int, None]:
        if isinstance(index, int):
            return index
        if isinstance(index, yaml.ScalarNode):
            return str(index.value)
        if isinstance(index, yaml.Node):
            return "?"  # a mapping key that is itself a collection
        return None

    def compose_node(self, parent: Optional[yaml.Node], index: Any) -> Optional[yaml.Node]:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is PyYAML's own error
                expanded = self._expanded.get(id(target))
                if expanded is None:
                    raise YAMLRefused(
                        _dotted([*self._path, self._part(parent, index)]), _Elided(f"*{event.anchor}"),
                        f"is an alias inside the value it names (line {event.start_mark.line + 1}); a value cannot contain itself",
                    )
                self._spend(expanded, event.start_mark)
            return super().compose_node(parent, index)
        event = self.peek_event()
        if len(self._path) >= YAML_MAX_DEPTH:
            raise YAMLRefused("", None, f"nests deeper than {YAML_MAX_DEPTH} levels (line {event.start_mark.line + 1})")
        self._path.append(self._part(parent, index))
        before = self._values
        self._spend(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._path.pop()
        if event.anchor is not None and node is not None:
            self._expanded[id(node)] = self._values - before
        return node

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == _YAML_MERGE_TAG:
                continue
            line, same = key.start_mark.line + 1, (key.tag, key.value)
            if same not in first:
                first[same] = line
                continue
            if isinstance(value, yaml.ScalarNode):
                shown: Any = value.value
            else:
                shown = _Elided("[…]" if isinstance(value, yaml.SequenceNode) else "{…}")
            raise YAMLRefused(
                _dotted([*self._path, str(key.value)]), shown,
                f"is given twice, on line {first[same]} and again on line {line}; a key may appear once in a mapping",
            )
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(None, None, f"cannot read this value ({exc})", node.start_mark) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for PyYAML's own error: what it found and where (its str is several lines, with snippets)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [
            f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(what)
            for what, mark in ((exc.context, exc.context_mark), (exc.problem, exc.problem_mark))
            if what
        ]
        return "; ".join(parts) or type(exc).__name__
    if isinstance(exc, yaml.reader.ReaderError):
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return f"{exc.reason}: character {char} at position {exc.position}"
    return str(exc) or type(exc).__name__


#: The text :func:`load_yaml` last read and what it built: a start reads the same company file three times
#: (imported as a revision, adopted, served), which at thousands of seats was seconds of PyYAML each.
#: Callers get a copy, so what one of them changes is never what the next one reads.
_last_loaded: Optional[tuple[str, Any]] = None


def load_yaml(
    text: str, *, document: str, name: Optional[str], error: type[FieldValueError], where: Optional[str] = None
) -> Any:
    """The one YAML document in ``text``, read by :class:`GuardedLoader`; anything refused raises ``error``.

    A refusal about the whole document (too large, too deep, not YAML) names
    ``document`` and the file (``name``, or "text"); a refusal about one key (a
    duplicate) names its dotted path and says the file was ``where`` (default
    ``name``), the way a bad value of that key would.
    """
    shown = name or "text"
    if len(text) > YAML_MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > YAML_MAX_BYTES:
        raise error(document, shown, f"is larger than {YAML_MAX_BYTES} bytes, the most a YAML file here may be")
    global _last_loaded
    last = _last_loaded
    if last is not None and last[0] == text:
        return copy.deepcopy(last[1])
    loader: Optional[GuardedLoader] = None
    try:
        loader = GuardedLoader(text)  # its reader refuses a character YAML does not allow here already
        data = loader.get_single_data()
        _last_loaded = (text, data)
        return copy.deepcopy(data)
    except YAMLRefused as exc:
        if exc.field:
            raise error(exc.field, exc.value, exc.allowed, where if where is not None else name) from None
        raise error(document, shown, exc.allowed) from None
    except yaml.YAMLError as exc:
        raise error(document, shown, f"is not valid YAML: {_yaml_problem(exc)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml_text(path: Union[str, Path], *, document: str, error: type[FieldValueError]) -> str:
    """A YAML file's text: refused (``error`` naming ``document`` and the path) when unreadable, too large or not UTF-8.

    At most one byte past :data:`YAML_MAX_BYTES` is read, so a huge file is
    refused without being read into memory. Line ends come back as LF, as a
    file opened in text mode reads them, so the text stored as a revision is
    the same whichever line ends the file was saved with.
    """
    shown = str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(YAML_MAX_BYTES + 1)
    except OSError as exc:
        raise error(document, shown, f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > YAML_MAX_BYTES:
        raise error(document, shown, f"is larger than {YAML_MAX_BYTES} bytes, the most a YAML file here may be")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            document, shown, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")
