"""A seat's own instructions (inline or from a file beside the company file) and its own model chain: read, bounded,
refused in one line."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crewlet.company.fields import CompanyError
from crewlet.company.instructions import INSTRUCTIONS_MAX_BYTES, files_as_yaml, files_from_yaml
from crewlet.company.parse import load_company, parse_company, parse_company_text
from seats.turns import system_prompt
from company_support import one_line_refusal

ADA: dict[str, Any] = {"handle": "ada", "kind": "agent", "role": "engineer"}
COMPANY = """\
org: acme
providers:
  llm: [{kind: echo}]
seats:
  - {handle: ada, kind: agent, role: engineer, instructions_file: prompts/ada.md}
  - {handle: linus, kind: agent, role: reviewer, instructions: "Review every diff twice."}
  - {handle: grace, kind: human, role: lead}
"""


def company(**ada: Any) -> Any:
    return parse_company({"org": "acme", "providers": {"llm": [{"kind": "echo"}]}, "seats": [{**ADA, **ada}]})


def refused(**ada: Any) -> str:
    with pytest.raises(CompanyError) as info:
        company(**ada)
    return str(info.value)


def on_disk(tmp_path: Path, ada_md: bytes | None = b"You own the deploy pipeline.\n", text: str = COMPANY) -> Path:
    (tmp_path / "prompts").mkdir(exist_ok=True)
    if ada_md is not None:
        (tmp_path / "prompts" / "ada.md").write_bytes(ada_md)
    path = tmp_path / "acme.yaml"
    path.write_text(text)
    return path


def load_refused(path: Path) -> str:
    return one_line_refusal(load_company, path)


def test_instructions_written_inline_follow_the_engines_framing_in_the_system_prompt() -> None:
    org = company(instructions="Triage every Jira ticket.\nAsk before deploying.")
    ada = org.seat_by_handle("ada")
    prompt = system_prompt(org, ada, (), "")
    framing = "You are Ada, the engineer at acme. Answer the message below."
    assert prompt == f"{framing}\n\nTriage every Jira ticket.\nAsk before deploying."
    assert system_prompt(company(), company().seat_by_handle("ada")) == framing  # none: the framing alone


def test_an_instructions_file_is_read_beside_the_company_file_and_kept_as_the_companys_included_content(tmp_path: Path) -> None:
    org = load_company(on_disk(tmp_path, b"You own the deploy pipeline.\r\n"))
    ada, linus = org.seat_by_handle("ada"), org.seat_by_handle("linus")
    assert (ada.instructions, ada.instructions_file) == ("You own the deploy pipeline.\n", "prompts/ada.md")
    assert (linus.instructions, linus.instructions_file) == ("Review every diff twice.", "")
    assert org.source_files == {"prompts/ada.md": "You own the deploy pipeline.\n"}
    # A revision is parsed from what it stores, never from a disk.
    again = parse_company_text(COMPANY, files=org.source_files)
    assert again.seat_by_handle("ada").instructions == ada.instructions


def test_a_revision_without_the_included_file_is_refused_naming_the_field_and_the_path() -> None:
    with pytest.raises(CompanyError) as info:
        parse_company_text(COMPANY, files={"prompts/other.md": "x"})
    assert str(info.value) == (
        "seats[0].instructions_file='prompts/ada.md': is not among the revision's included files (prompts/other.md)"
    )


@pytest.mark.parametrize(
    "content,allowed",
    [
        (None, "cannot be read (No such file or directory: "),
        (b"caf\xe9 au lait", "is not UTF-8 text (byte 0xe9 at offset 3); save it as UTF-8"),
        (b"x" * (INSTRUCTIONS_MAX_BYTES + 1), f"is larger than {INSTRUCTIONS_MAX_BYTES} bytes (32 KiB)"),
        (b"  \n", "is empty"),
        (b"a\x00b", "is not text (it holds a NUL character)"),
    ],
)
def test_an_instructions_file_that_cannot_serve_is_refused_in_one_line_naming_the_field_and_the_path(
    tmp_path: Path, content: bytes | None, allowed: str
) -> None:
    message = load_refused(on_disk(tmp_path, content))
    assert message.startswith(f"seats[0].instructions_file='prompts/ada.md': {allowed}")
    assert message.endswith(f"(in {tmp_path / 'acme.yaml'})")


def test_a_file_at_the_bound_is_taken_and_one_byte_past_it_is_not(tmp_path: Path) -> None:
    at_bound = load_company(on_disk(tmp_path, b"x" * INSTRUCTIONS_MAX_BYTES)).seat_by_handle("ada")
    assert len(at_bound.instructions) == INSTRUCTIONS_MAX_BYTES
    assert "32 KiB" in load_refused(on_disk(tmp_path, b"x" * (INSTRUCTIONS_MAX_BYTES + 1)))


@pytest.mark.parametrize(
    "ada,field,allowed",
    [
        ({"instructions": "a", "instructions_file": "a.md"}, "seats[0].instructions_file='a.md'",
         "either instructions (text) or instructions_file"),
        ({"instructions": "é" * (INSTRUCTIONS_MAX_BYTES // 2 + 1)}, "seats[0].instructions=", "is larger than 32768 bytes"),
        ({"instructions": "   "}, "seats[0].instructions='   '", "must be non-empty text"),
        ({"instructions": 7}, "seats[0].instructions=7", "must be non-empty text"),
        ({"instructions_file": "/etc/passwd"}, "seats[0].instructions_file='/etc/passwd'", "must be a relative path inside"),
        ({"instructions_file": "../secrets.md"}, "seats[0].instructions_file='../secrets.md'", "no '..'"),
        ({"instructions_file": ""}, "seats[0].instructions_file=''", "must be a path to a text file"),
        ({"kind": "human", "instructions": "x"}, "seats[0].instructions='x'", "applies only to an agent seat"),
        ({"providers": []}, "seats[0].providers=[]", "must be a non-empty list of providers.llm entries"),
        ({"providers": {"llm": [{"kind": "echo"}]}}, "seats[0].providers=", "must be a non-empty list"),
        ({"providers": [{"kind": "gpt"}]}, "seats[0].providers[0].kind='gpt'", "must be one of echo, openai, anthropic"),
        ({"providers": [{"kind": "openai", "model": "m"}]}, "seats[0].providers[0]", "base_url"),
        ({"providers": [{"kind": "anthropic", "model": "m", "api_key": "sk-live"}]},
         "seats[0].providers[0].api_key='[redacted]'", "name the environment variable"),
        ({"kind": "human", "providers": [{"kind": "echo"}]}, "seats[0].providers=", "applies only to an agent seat"),
    ],
)
def test_a_bad_instructions_or_providers_key_is_refused_naming_the_field(ada: dict[str, Any], field: str, allowed: str) -> None:
    message = refused(**ada)
    assert message.startswith(field), message
    assert allowed in message, message
    assert "sk-live" not in message and "\n" not in message


def test_a_seat_with_its_own_providers_calls_them_and_the_others_call_the_companys() -> None:
    org = parse_company(
        {
            "org": "acme",
            "providers": {"llm": [{"kind": "echo"}]},
            "seats": [
                {**ADA, "providers": [{"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "ada-model"},
                                      {"kind": "echo", "fail": True}]},
                {"handle": "linus", "kind": "agent"},
            ],
        }
    )
    ada, linus = org.seat_by_handle("ada"), org.seat_by_handle("linus")
    assert [p.key for p in org.providers_of(ada)] == ["openai:ada-model", "echo"]
    assert [p.key for p in org.providers_of(linus)] == ["echo"]
    none = parse_company({"org": "acme", "seats": [{**ADA, "providers": [{"kind": "echo"}]}, {"handle": "linus"}]})
    assert none.has_provider_for("ada") and not none.has_provider_for("linus")


def test_the_admins_included_files_round_trip_through_yaml_as_readable_blocks() -> None:
    files = {"prompts/ada.md": "You own the deploy.\nAsk before Friday.\n", "b.md": "one line"}
    shown = files_as_yaml(files)
    assert "prompts/ada.md: |\n  You own the deploy.\n  Ask before Friday.\n" in shown
    assert files_from_yaml(shown) == files
    with pytest.raises(CompanyError) as info:
        files_from_yaml("../x.md: text")
    assert str(info.value).startswith("included_files.../x.md='../x.md': must be a relative path")
