"""A provider whose key variable is unset is named at start, by the variable, never its value; keyless ones are not."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import pytest

from crewlet.company.org import Provider
from seats.provider_keys import UnsetKey, unset_provider_keys, warn_unset_provider_keys
from seats_support import company

KEY_VALUE = "sk-provider-keys-test-0123456789"


@contextlib.contextmanager
def heard(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """``caplog`` hears the providers' logger directly, whatever another test did to propagation."""
    logger = logging.getLogger("crewlet.seats.providers")
    propagate = logger.propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def openai(**options: Any) -> dict[str, Any]:
    return {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "gpt-test", **options}


def test_each_entry_whose_named_key_variable_is_unset_or_empty_is_listed_with_its_place_in_the_chain() -> None:
    chain = [
        Provider("echo"),
        Provider("openai", {"model": "gpt-test", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "SET_KEY"}),
        Provider("openai", {"model": "gpt-other", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "UNSET_KEY"}),
        Provider("anthropic", {"model": "claude-x", "api_key_env": "EMPTY_KEY"}),
        Provider("openai", {"model": "local-7b", "base_url": "http://127.0.0.1:11434/v1"}),  # keyless local server
        Provider("anthropic", {"model": "claude-y"}),  # the vendor's own API with no key named
        Provider("anthropic", {"model": "claude-z", "base_url": "http://127.0.0.1:9"}),  # a keyless proxy
    ]
    environ = {"SET_KEY": KEY_VALUE, "EMPTY_KEY": ""}
    assert unset_provider_keys(chain, environ, entry="seats.ada.providers") == [
        UnsetKey("seats.ada.providers[2]", "openai:gpt-other", "UNSET_KEY"),
        UnsetKey("seats.ada.providers[3]", "anthropic:claude-x", "EMPTY_KEY"),
        UnsetKey("seats.ada.providers[5]", "anthropic:claude-y", ""),
    ]
    assert unset_provider_keys(chain[:2], environ) == []


def test_start_up_warns_once_per_entry_naming_the_variable_and_never_a_value(caplog: pytest.LogCaptureFixture) -> None:
    org = company(providers=[openai(api_key_env="HLIFE_UNSET_KEY"), openai(api_key_env="HLIFE_SET_KEY"), {"kind": "echo"}])
    with heard(caplog):
        missing = warn_unset_provider_keys(org, {"HLIFE_SET_KEY": KEY_VALUE})
    warned = [r for r in caplog.records if r.getMessage() == "provider_key_missing"]
    assert [(r.entry, r.provider, r.variable, r.levelno) for r in warned] == [
        ("providers.llm[0]", "openai:gpt-test", "HLIFE_UNSET_KEY", logging.WARNING)
    ]
    assert len(missing) == 1 and "until HLIFE_UNSET_KEY is set" in warned[0].hint
    assert KEY_VALUE not in caplog.text + "".join(str(vars(r)) for r in caplog.records)


def test_an_echo_company_and_one_whose_keys_are_set_warn_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with heard(caplog):
        assert warn_unset_provider_keys(company(), {}) == []
        assert warn_unset_provider_keys(company(providers=[openai(api_key_env="K")]), {"K": KEY_VALUE}) == []
    assert not [r for r in caplog.records if r.getMessage() == "provider_key_missing"]


def test_a_seats_own_chain_is_checked_too_and_named_by_the_seat(caplog: pytest.LogCaptureFixture) -> None:
    org = company(
        seats=[
            {"handle": "ada", "kind": "agent", "role": "engineer", "providers": [openai(api_key_env="HLIFE_ADA_KEY")]},
            {"handle": "linus", "kind": "agent", "role": "reviewer"},
        ]
    )
    with heard(caplog):
        missing = warn_unset_provider_keys(org, {})
    assert [(m.entry, m.variable) for m in missing] == [("seats.ada.providers[0]", "HLIFE_ADA_KEY")]
