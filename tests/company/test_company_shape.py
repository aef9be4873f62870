"""The company file's sections are pydantic models, and a refusal of one still reads as the file's one line.

pydantic's first error is translated (:func:`crewlet.company.shape.refusal`):
the dotted key path into lists and mappings, the value as written (a
credential never), what is allowed — never pydantic's own words.
"""
from __future__ import annotations

from typing import Any

import pytest

from crewlet.company.fields import CompanyError
from crewlet.company.parse import parse_company, parse_company_text
from crewlet.company.sections import CompanyFile, SeatFile

BASE: dict[str, Any] = {"org": "acme", "seats": [{"handle": "ada"}]}
ECHO = {"kind": "echo"}
PYDANTIC_WORDS = ("validation error", "input_value", "input_type", "errors.pydantic.dev", "Input should", "Field required")


def refused(**overrides: Any) -> str:
    with pytest.raises(CompanyError) as info:
        parse_company({**BASE, **overrides}, source="acme.yaml")
    return str(info.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"thread_block": {"max_messages": True}}, "thread_block.max_messages=True: must be a whole number between 1 and 200"),
        ({"episodes": {"recent": 21}}, "episodes.recent=21: must be between 0 and 20"),
        ({"budget": {"tokens_per_day": 2.5}}, "budget.tokens_per_day=2.5: must be a whole number of tokens from 0 (no ceiling) to 1_000_000_000_000"),
        ({"node": {"max_concurrent": "4"}}, "node.max_concurrent='4': must be a whole number between 1 and 64"),
        ({"notification_rate_limit": float("nan")}, "notification_rate_limit=nan: must be 0 (off) or a number of wakes per second between 0.0001 and 1000"),
        ({"seats": [{"handle": "ada", "placement": {"labels": ["gpu", "a b"]}}]},
         "seats[0].placement.labels[1]='a b': must be 1 to 63 letters, digits, '-' or '_', starting with a letter or digit"),
        ({"providers": {"llm": [{**ECHO, "script": [{"calls": [{"tool": "t", "x": 1}]}]}]}},
         "providers.llm[0].script[0].calls[0].x=1: unknown key; allowed: tool, arguments"),
        ({"providers": {"llm": [{**ECHO, "script": [{"answer": "a", "tool": "t"}]}]}},
         "providers.llm[0].script[0]={'answer': 'a', 'tool': 't'}: an answer step is {answer: <text>} alone"),
        ({"providers": {"llm": [{"kind": "anthropic", "model": "m", "retry": {"attempts": 11}}]}},
         "providers.llm[0].retry.attempts=11: must be between 0 and 10"),
        ({"schedules": [{"name": "s", "seat": "ada", "task": "t", "every": "30s"}]},
         "schedules[0].every='30s': must be a duration like 90s, 15m, 24h or 7d, between 1m and 365d"),
        ({"mcp_servers": {"fs": {"command": ["npx", "fs", ""]}}}, "mcp_servers.fs.command[2]='': must be a non-empty string"),
        ({"mcp_servers": {"fs": {"url": "http://x", "headers_from": {"X-Id": "a b"}}}},
         "mcp_servers.fs.headers_from.X-Id='a b': must be an environment variable name"),
        ({"mcp_servers": {"s": {"builtin": "slack", "token": "T"}}},
         "mcp_servers.s.token='T': a builtin server takes no other key (its token and URL are the engine's)"),
        ({"seats": [{"handle": "ada", "slack": {"app_id": "A1", "signing_secret_env": "S"}}]},
         "seats[0].slack.bot_token_env=None: is required: the environment variable holding it (must be an environment variable name)"),
    ],
)
def test_a_bad_value_in_any_section_is_refused_in_one_line_with_its_dotted_key_path(overrides: dict[str, Any], message: str) -> None:
    text = refused(**overrides)
    assert text == f"{message} (in acme.yaml)"
    assert "\n" not in text and not any(words in text for words in PYDANTIC_WORDS)


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        ({"mcp_servers": {"fs": {"command": ["npx"], "env_from": ["ghp_abcdefghijklmnop"]}}},
         "mcp_servers.fs.env_from[0]", "must be an environment variable name, not the secret itself"),
        ({"mcp_servers": {"fs": {"command": ["npx"], "env": {"A": "xoxb-1-2-abcdef"}}}},
         "mcp_servers.fs.env.A", "a secret is never inline: name the variable in env_from: [A] and set it in the node's environment"),
        ({"providers": {"llm": [{"kind": "anthropic", "model": "m", "api_key_env": "sk-ant-abcdefgh"}]}},
         "providers.llm[0].api_key_env", "must name the environment variable holding the key, not the key"),
        ({"seats": [{"handle": "ada", "slack": {"app_id": "A1", "signing_secret_env": "0123456789abcdef0123456789abcdef", "bot_token_env": "B"}}]},
         "seats[0].slack.signing_secret_env", "must name the environment variable holding the value, never the value"),
        ({"seats": [{"handle": "ada", "mattermost": {"token": "abcdefgh"}}]},
         "seats[0].mattermost.token", "is not allowed: name the variable holding it with one of bot_token_env"),
    ],
)
def test_a_credential_is_refused_by_its_model_without_being_quoted(overrides: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(CompanyError) as info:
        parse_company({**BASE, **overrides})
    assert (info.value.field, info.value.value, info.value.allowed) == (field, "[redacted]", allowed)
    secret = [v for v in str(overrides).split("'") if v.startswith(("ghp_", "xoxb-", "sk-", "0123", "abcdefgh"))]
    assert secret and not any(s in str(info.value) for s in secret)


def test_a_surface_server_given_as_null_is_no_server_rather_than_a_crash() -> None:
    org = parse_company_text("org: acme\nsurfaces:\n  mattermost:\n    server:\n")
    assert org.surfaces["mattermost"].configured and org.surfaces["mattermost"].server == ""


def test_every_top_level_and_seat_key_is_a_field_of_its_model_in_the_order_a_refusal_lists_them() -> None:
    unknown = refused(bogus=1)
    assert unknown.startswith("bogus=1: unknown key; allowed: " + ", ".join(CompanyFile.model_fields))
    seat = refused(seats=[{"handle": "ada", "bogus": 1}])
    assert seat.startswith("seats[0].bogus=1: unknown key; allowed: " + ", ".join(SeatFile.model_fields))
