"""The company file: validated at load, seats found by id, handle, role or identity."""
from __future__ import annotations

import uuid

import pytest

from crewlet.company.fields import CompanyError
from crewlet.company.org import AGENT_ID_NAMESPACE, CompanyHolder, agent_id_for
from crewlet.company.parse import EXAMPLE_COMPANY, load_company, parse_company, parse_company_text

BASE = {"org": "acme", "seats": [{"handle": "ada", "kind": "agent", "role": "engineer"}]}


def company(**overrides):
    return parse_company({**BASE, **overrides})


def refused(**overrides) -> str:
    with pytest.raises(CompanyError) as info:
        company(**overrides)
    return str(info.value)


def test_the_example_company_loads_and_is_what_up_runs_by_default():
    org = load_company(EXAMPLE_COMPANY)
    assert org.org == "acme"
    assert [s.handle for s in org.agent_seats()] == ["ada", "linus"]
    assert org.has_provider and org.providers[0].kind == "echo"
    assert org.seat_by_handle("grace").kind == "human"


def test_an_agent_id_is_a_uuid5_over_the_org_and_the_handle_so_every_node_agrees():
    assert agent_id_for("acme", "ada") == str(uuid.uuid5(AGENT_ID_NAMESPACE, "acme/ada"))
    assert agent_id_for("acme", "ada") != agent_id_for("other", "ada")
    org = company()
    assert org.seat_by_id(agent_id_for("acme", "ada")).handle == "ada"


def test_seats_are_found_by_handle_id_role_and_surface_identity_with_no_database():
    org = load_company()
    ada = org.seat_by_handle("ada")
    assert org.resolve("engineer") is ada
    assert org.resolve(ada.agent_id) is ada
    assert org.seat_by_identity("slack", "U0ADA") is ada
    assert org.seat_by_identity("jira", "5b10ac8d82e05b22cc7d4ef5") is ada
    assert org.seat_by_identity("slack", "U0NOBODY") is None


def test_an_empty_provider_list_is_a_valid_company_with_no_model_provider():
    org = company(providers={"llm": []})
    assert not org.has_provider


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"notification_coalesce_window_seconds": 61}, "notification_coalesce_window_seconds=61: must be between 0 and 60"),
        ({"notification_coalesce_window_seconds": -1}, "notification_coalesce_window_seconds=-1: must be between 0 and 60"),
        ({"notification_coalesce_max_batch": 0}, "notification_coalesce_max_batch=0: must be between 1 and 100"),
        ({"notification_coalesce_max_batch": 101}, "notification_coalesce_max_batch=101: must be between 1 and 100"),
        ({"notification_coalesce_max_batch": 2.5}, "notification_coalesce_max_batch=2.5: must be a whole number between 1 and 100"),
        ({"notification_rate_limit": -1}, "notification_rate_limit=-1: must be 0 (off) or a number of wakes per second between 0.0001 and 1000"),
        ({"node": {"max_concurrent": 0}}, "node.max_concurrent=0: must be between 1 and 64"),
        ({"providers": {"llm": [{"kind": "magic"}]}}, "providers.llm[0].kind='magic': must be one of echo, openai"),
        ({"providers": {"llm": [{"kind": "openai", "model": "m"}]}}, "providers.llm[0].base_url=None: must be a non-empty string"),
        ({"surfaces": {"irc": {}}}, "surfaces.irc={}: unknown key"),
        ({"surfaces": {"slack": {"verify": "no"}}}, "surfaces.slack.verify='no': must be true or false"),
        ({"seats": [{"handle": "Ada!"}]}, "seats[0].handle='Ada!': must be 1-63 lowercase"),
        ({"seats": [{"handle": "ada", "kind": "robot"}]}, "seats[0].kind='robot': must be one of agent, human"),
        ({"seats": [{"handle": "ada"}, {"handle": "ada"}]}, "seats[1].handle='ada': must be unique"),
        ({"schedules": [{"name": "s", "seat": "nobody", "every": "1h", "task": "t"}]}, "schedules[0].seat='nobody': must be an agent seat"),
        ({"schedules": [{"name": "s", "seat": "ada", "every": "often", "task": "t"}]}, "schedules[0].every='often': must be a duration like 90s, 15m, 24h or 7d, between 1m and 365d"),
        ({"colour": "blue"}, "colour='blue': unknown key"),
    ],
)
def test_a_bad_company_is_refused_naming_the_field_the_value_and_what_is_allowed(overrides, message):
    assert refused(**overrides).startswith(message)


def test_two_seats_cannot_share_one_surface_identity():
    msg = refused(seats=[{"handle": "a", "identities": {"slack": "U1"}}, {"handle": "b", "identities": {"slack": "U1"}}])
    assert "already belongs to seat a" in msg


def test_a_file_that_is_not_yaml_is_refused_with_its_name():
    with pytest.raises(CompanyError) as info:
        parse_company_text("org: [", source="bad.yaml")
    assert "bad.yaml" in str(info.value)


def test_producers_read_the_company_current_when_they_ask():
    holder = CompanyHolder(company())
    before = holder.current()
    holder.swap(company(seats=[{"handle": "ada"}, {"handle": "bob"}]))
    assert holder.current().seat_by_handle("bob") is not None
    assert before.seat_by_handle("bob") is None
    assert holder.epoch == 2
