"""A seat's instructions: written inline, or read from a file beside the company file whose content travels with the revision.

``seats[].instructions`` is text; ``seats[].instructions_file`` is a path
relative to the company file. A revision is the whole company, so a revision
stores the content of every file its company includes beside its YAML text
(``ConfigRevision.included_files``: path -> content), and a revision is parsed
from that mapping, never from a disk: every node of a fleet serves the same
instructions whatever its working directory holds. The company file, read by
``up`` or ``runconsumers``, reads its included files from the disk
(:class:`FilesOnDisk`); a stored revision from what it stored
(:class:`StoredFiles`). Both refuse the same way, in one line naming the
field and the path: a file missing, unreadable, not UTF-8 text, empty, or
larger than :data:`INSTRUCTIONS_MAX_BYTES`.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Mapping, Optional, Protocol

import yaml
from pydantic import PlainValidator
from pydantic_core import PydanticCustomError

from crewlet.company.fields import CompanyError
from crewlet.company.shape import refuse
from crewlet.company.yamlfile import load_yaml

#: The most bytes (UTF-8) a seat's instructions may hold, inline or from its file: 32 KiB. They are
#: re-sent to the model on every round of every turn, so they are bounded like the digest is.
INSTRUCTIONS_MAX_BYTES = 32 * 1024
#: The longest ``instructions_file`` path.
INSTRUCTIONS_PATH_MAX = 255
#: The two keys of a seat that give its instructions (exactly one, or neither).
INSTRUCTIONS_KEY = "instructions"
INSTRUCTIONS_FILE_KEY = "instructions_file"
#: The name a revision's included files go by in a refusal (the admin form's field).
INCLUDED_FILES = "included_files"

_TOO_LARGE = (
    f"is larger than {INSTRUCTIONS_MAX_BYTES} bytes ({INSTRUCTIONS_MAX_BYTES // 1024} KiB), the most a seat's instructions may be"
)
_PATH_RULE = "must be a relative path inside the company file's directory (no leading '/', no '..')"


class IncludedFiles(Protocol):
    """Where a company's included files are read from; ``files`` is what was read, by path."""

    files: dict[str, str]

    def read(self, field: str, path: str, source: Optional[str]) -> str:
        """The content of ``path`` (already normalised), or a :class:`CompanyError` naming ``field`` and the path."""


def _checked_text(field: str, path: str, text: str, source: Optional[str]) -> str:
    """An included file's content as instructions: within the bound, not empty, no NUL; line ends as LF."""
    if len(text.encode("utf-8", "surrogatepass")) > INSTRUCTIONS_MAX_BYTES:
        raise CompanyError(field, path, _TOO_LARGE, source)
    if "\x00" in text:
        raise CompanyError(field, path, "is not text (it holds a NUL character)", source)
    if not text.strip():
        raise CompanyError(field, path, "is empty; give the seat instructions, or leave the key out", source)
    return text.replace("\r\n", "\n").replace("\r", "\n")


class FilesOnDisk:
    """The company file's own directory: each included file read once, bounded, as UTF-8 text."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, str] = {}

    def read(self, field: str, path: str, source: Optional[str]) -> str:
        if path in self.files:
            return self.files[path]
        full = self.directory / path
        try:
            with open(full, "rb") as handle:
                raw = handle.read(INSTRUCTIONS_MAX_BYTES + 1)
        except OSError as exc:
            raise CompanyError(field, path, f"cannot be read ({exc.strerror or exc}: {full})", source) from None
        if len(raw) > INSTRUCTIONS_MAX_BYTES:
            raise CompanyError(field, path, _TOO_LARGE, source)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CompanyError(
                field, path, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8", source
            ) from None
        self.files[path] = _checked_text(field, path, text, source)
        return self.files[path]


class StoredFiles:
    """A revision's included files (``ConfigRevision.included_files``): a path it does not hold is refused."""

    def __init__(self, stored: Optional[Mapping[str, Any]] = None) -> None:
        self.stored = dict(stored or {})
        self.files: dict[str, str] = {}

    def read(self, field: str, path: str, source: Optional[str]) -> str:
        if path not in self.stored:
            held = ", ".join(sorted(self.stored)) or "none"
            raise CompanyError(field, path, f"is not among the revision's included files ({held})", source)
        text = self.stored[path]
        if not isinstance(text, str):
            raise CompanyError(f"{INCLUDED_FILES}.{path}", text, "must be the file's text", source)
        self.files[path] = _checked_text(field, path, text, source)
        return self.files[path]


def _relative_path(value: Any) -> str:
    """``instructions_file``, normalised (``./a/b.md`` is ``a/b.md``): relative, inside the company's directory."""
    if not isinstance(value, str) or not value.strip():
        raise refuse("must be a path to a text file, relative to the company file")
    if len(value) > INSTRUCTIONS_PATH_MAX or "\x00" in value:
        raise refuse(f"must be at most {INSTRUCTIONS_PATH_MAX} characters, without NUL")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or value.startswith("~"):
        raise refuse(_PATH_RULE)
    return str(path)


def _inline(value: Any) -> str:
    """``instructions``: non-empty text within :data:`INSTRUCTIONS_MAX_BYTES`."""
    if not isinstance(value, str) or not value.strip():
        raise refuse("must be non-empty text (leave the key out for none)")
    if len(value.encode("utf-8", "surrogatepass")) > INSTRUCTIONS_MAX_BYTES:
        raise refuse(_TOO_LARGE)
    return value


#: The types of a seat's two instruction keys (:class:`~crewlet.company.sections.SeatFile`).
InlineInstructions = Annotated[str, PlainValidator(_inline)]
InstructionsPath = Annotated[str, PlainValidator(_relative_path)]


def seat_instructions(
    inline: Optional[str], from_file: Optional[str], name: str, included: IncludedFiles, source: Optional[str]
) -> tuple[str, str]:
    """A seat's ``(instructions, instructions_file)`` from its entry ``name`` (``seats[0]``), both keys' values checked
    already: ``("", "")`` when it gives none. Exactly one of the two keys; a file's text read and bounded like inline text.
    """
    if inline is not None and from_file is not None:
        raise CompanyError(
            f"{name}.{INSTRUCTIONS_FILE_KEY}", from_file,
            f"give a seat's instructions once: either {INSTRUCTIONS_KEY} (text) or {INSTRUCTIONS_FILE_KEY} (a file), not both",
            source,
        )
    if from_file is not None:
        return included.read(f"{name}.{INSTRUCTIONS_FILE_KEY}", from_file, source), from_file
    return inline or "", ""


# -- a revision's included files as the admin edits them ------------------------------------


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line text as a ``|`` block, so a file's content reads in the form as it reads in the file."""


def _text(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value and not any(c in value for c in "\t\r") and value == value.rstrip(" ") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _text)


def files_as_yaml(files: Mapping[str, str]) -> str:
    """A revision's included files as the admin's form shows them: a YAML mapping of path to text."""
    if not files:
        return ""
    return yaml.dump(dict(sorted(files.items())), Dumper=_LiteralDumper, sort_keys=False, allow_unicode=True, width=10_000)


def files_from_yaml(text: str) -> dict[str, str]:
    """The admin form's included files back as a mapping; anything but ``path: text`` pairs is refused."""
    data = load_yaml(text or "", document=INCLUDED_FILES, name=None, error=CompanyError) if (text or "").strip() else {}
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise CompanyError(INCLUDED_FILES, data, "must be a mapping of path: text", None)
    files: dict[str, str] = {}
    for path, content in data.items():
        if not isinstance(path, str) or not isinstance(content, str):
            raise CompanyError(f"{INCLUDED_FILES}.{path}", content, "must be path: text (the file's content)", None)
        try:
            files[_relative_path(path)] = content
        except PydanticCustomError as exc:  # the same rule as instructions_file's, refused under the form's field
            raise CompanyError(f"{INCLUDED_FILES}.{path}", path, str((exc.context or {})["allowed"]), None) from None
    return files


__all__ = [
    "INCLUDED_FILES",
    "INSTRUCTIONS_FILE_KEY",
    "INSTRUCTIONS_KEY",
    "INSTRUCTIONS_MAX_BYTES",
    "FilesOnDisk",
    "IncludedFiles",
    "StoredFiles",
    "files_as_yaml",
    "files_from_yaml",
    "seat_instructions",
]
