"""Who may read /api/: an operator token or a signed-in staff session; anything else is 401."""
from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from eventstore.auth import MIN_TOKEN_LENGTH, SEEDED_TOKEN_NAME, seed_operator_token_from_env
from seats.models import OperatorToken
from eventstore_support import AT, client, make_event, operator, scope, store  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(databases=["default", "events"])]

ROUTES = [
    "/api/events",
    "/api/events/some-id",
    "/api/events/series",
    "/api/traces/0123",
    "/api/turns",
    "/api/turns/turn-1",
    "/api/schema/",
]


def _mint(name: str, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("operator_token", name, *args, stdout=out, stderr=err)
    return out.getvalue().strip()


@pytest.mark.parametrize("route", ROUTES)
def test_every_api_route_refuses_a_request_with_no_credential_with_401_and_a_bearer_challenge(route: str, scope: Any) -> None:
    response = APIClient().get(route)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    [
        "Bearer crw_not-a-token-anybody-minted",
        "Bearer",
        "Bearer two parts",
        "Basic dXNlcjpwYXNz",
        "Token abc",
    ],
)
def test_a_wrong_or_malformed_authorization_header_is_401(header: str, scope: Any, operator: str) -> None:
    response = APIClient().get("/api/events", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401


def test_a_minted_token_opens_the_api_and_is_stored_only_as_its_hash(scope: Any) -> None:
    token = _mint("ci")
    row = OperatorToken.objects.get(name="ci")
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in {row.name, row.token_hash}

    response = APIClient().get("/api/events", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None


def test_the_token_is_printed_once_alone_on_stdout() -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("operator_token", "laptop", stdout=out, stderr=err)
    assert out.getvalue().count("\n") == 1 and out.getvalue().startswith("crw_")
    assert "shown once" in err.getvalue()


def test_a_name_is_minted_once_rotation_replaces_it_and_revocation_removes_it(scope: Any) -> None:
    first = _mint("ops")
    with pytest.raises(CommandError, match="--rotate"):
        _mint("ops")
    second = _mint("ops", "--rotate")
    api = APIClient()
    assert api.get("/api/events", HTTP_AUTHORIZATION=f"Bearer {first}").status_code == 401
    assert api.get("/api/events", HTTP_AUTHORIZATION=f"Bearer {second}").status_code == 200
    call_command("operator_token", "ops", "--revoke", stdout=io.StringIO())
    assert api.get("/api/events", HTTP_AUTHORIZATION=f"Bearer {second}").status_code == 401
    with pytest.raises(CommandError):
        call_command("operator_token", "ops", "--revoke", stdout=io.StringIO())


def test_a_signed_in_staff_session_may_read(scope: Any) -> None:
    user = get_user_model().objects.create_user("ada", is_staff=True)
    api = APIClient()
    api.force_login(user)
    assert api.get("/api/events").status_code == 200


@pytest.mark.parametrize("flags", [{"is_staff": False}, {"is_staff": True, "is_active": False}])
def test_a_session_that_is_not_active_staff_is_401_like_no_credential(scope: Any, flags: dict[str, bool]) -> None:
    user = get_user_model().objects.create_user("bob", **flags)
    api = APIClient()
    api.force_login(user)
    response = api.get("/api/events")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_crewlet_operator_token_seeds_a_token_and_a_changed_value_replaces_it(scope: Any) -> None:
    first = "seeded-token-0123456789"
    assert seed_operator_token_from_env({"CREWLET_OPERATOR_TOKEN": first}) is True
    assert seed_operator_token_from_env({"CREWLET_OPERATOR_TOKEN": first}) is True  # idempotent
    assert OperatorToken.objects.filter(name=SEEDED_TOKEN_NAME).count() == 1
    api = APIClient()
    assert api.get("/api/events", HTTP_AUTHORIZATION=f"Bearer {first}").status_code == 200

    second = "seeded-token-rotated-9876"
    seed_operator_token_from_env({"CREWLET_OPERATOR_TOKEN": second})
    assert api.get("/api/events", HTTP_AUTHORIZATION=f"Bearer {first}").status_code == 401
    assert api.get("/api/events", HTTP_AUTHORIZATION=f"Bearer {second}").status_code == 200


def test_no_crewlet_operator_token_seeds_nothing_and_a_guessable_one_is_refused() -> None:
    assert seed_operator_token_from_env({}) is False
    assert seed_operator_token_from_env({"CREWLET_OPERATOR_TOKEN": "  "}) is False
    with pytest.raises(ValueError, match=str(MIN_TOKEN_LENGTH)):
        seed_operator_token_from_env({"CREWLET_OPERATOR_TOKEN": "short"})
    assert not OperatorToken.objects.exists()


def test_runconsumers_seeds_the_token_from_its_environment_before_the_engine_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management import load_command_class

    monkeypatch.setenv("CREWLET_OPERATOR_TOKEN", "from-the-environment-42")
    load_command_class("crewlet", "runconsumers").seed_operator_token()
    assert OperatorToken.lookup("from-the-environment-42") is not None

    monkeypatch.setenv("CREWLET_OPERATOR_TOKEN", "short")
    with pytest.raises(CommandError):
        load_command_class("crewlet", "up").seed_operator_token()


def test_the_openapi_schema_describes_every_read(client: Any) -> None:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    text = response.content.decode()
    for path in ("/api/events", "/api/events/{event_id}", "/api/events/series", "/api/traces/{trace_id}", "/api/turns", "/api/turns/{turn_id}"):
        assert path in text
    assert "bearer" in text
