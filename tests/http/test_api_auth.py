"""Who may read /api/: an operator token or a signed-in staff session; anything else is 401."""
from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from crewlet.http.auth import MIN_TOKEN_LENGTH, SEEDED_TOKEN_NAME, seed_operator_token_from_env
from crewlet.base.tokens import OperatorToken
from waiting_support import ManualClock

pytestmark = [pytest.mark.django_db(databases=["default", "events"])]

#: Every authenticated route of every app, with the method it answers.
ROUTES = [
    ("get", "/api/events"),
    ("get", "/api/events/some-id"),
    ("get", "/api/events/series"),
    ("get", "/api/traces/0123"),
    ("get", "/api/turns"),
    ("get", "/api/turns/turn-1"),
    ("get", "/api/schema/"),
    ("get", "/api/seats/"),
    ("post", "/api/seats/ada/pause"),
    ("post", "/api/seats/ada/resume"),
    ("post", "/api/a2a/ask"),
    ("get", "/api/a2a/channels"),
    ("get", "/api/a2a/channels/0b7f6c2e-0000-4000-8000-000000000000"),
]


def _mint(name: str, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("operator_token", name, *args, stdout=out, stderr=err)
    return out.getvalue().strip()


@pytest.mark.parametrize("method,route", ROUTES)
def test_every_api_route_refuses_a_request_with_no_credential_with_401_and_a_bearer_challenge(
    method: str, route: str, scope: Any
) -> None:
    response = getattr(APIClient(), method)(route)
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


def test_the_openapi_schema_describes_every_read(api_client: Any) -> None:
    response = api_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    text = response.content.decode()
    for path in ("/api/events", "/api/events/{event_id}", "/api/events/series", "/api/traces/{trace_id}", "/api/turns", "/api/turns/{turn_id}"):
        assert path in text
    assert "bearer" in text


# -- the in-process cache of verified tokens ---------------------------------------------


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process's verified-token cache, fresh and on a hand-moved clock."""
    from crewlet.base import tokens as token_module

    cache = token_module.VerifiedTokens(ttl_s=token_module.TOKEN_CACHE_TTL_S, max_size=4, clock=ManualClock())
    monkeypatch.setattr(token_module, "VERIFIED_TOKENS", cache)
    return cache


def _delete_behind_the_apps_back(name: str) -> None:
    """Delete a token row as another process would: no signal reaches this one."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM seats_operator_token WHERE name = %s", [name])


def _get(token: str) -> int:
    return APIClient().get("/api/events", HTTP_AUTHORIZATION=f"Bearer {token}").status_code


def test_a_verified_token_is_cached_by_its_hash_never_by_the_token(scope: Any, tokens: Any) -> None:
    token = _mint("cached")
    assert _get(token) == 200
    assert hashlib.sha256(token.encode()).hexdigest() in tokens
    assert token not in tokens and len(tokens) == 1


def test_a_revoked_token_is_refused_at_once_in_the_process_that_revoked_it(scope: Any, tokens: Any) -> None:
    token = _mint("ops")
    assert _get(token) == 200 and len(tokens) == 1  # cached now
    call_command("operator_token", "ops", "--revoke", stdout=io.StringIO())
    assert len(tokens) == 0
    assert _get(token) == 401


def test_a_token_deleted_in_the_admin_is_refused_at_once(scope: Any, tokens: Any) -> None:
    from django.test import Client

    token = _mint("laptop")
    assert _get(token) == 200 and len(tokens) == 1
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root-admin", password="pw"))
    pk = OperatorToken.objects.get(name="laptop").pk
    assert admin.post(f"/admin/crewlet/operatortoken/{pk}/delete/", {"post": "yes"}).status_code == 302
    assert _get(token) == 401


def test_a_rotated_token_is_refused_at_once_and_its_successor_accepted(scope: Any, tokens: Any) -> None:
    first = _mint("ci")
    assert _get(first) == 200
    second = _mint("ci", "--rotate")
    assert _get(first) == 401
    assert _get(second) == 200


def test_a_cached_token_never_opens_the_door_to_a_different_token(scope: Any, tokens: Any) -> None:
    mine = _mint("mine")
    assert _get(mine) == 200
    # A neighbour of the cached token (one character off) is its own hash: looked up, refused.
    assert _get(mine[:-1] + ("A" if mine[-1] != "A" else "B")) == 401
    assert _get("crw_" + "x" * 43) == 401
    assert len(tokens) == 1  # a refused token is never remembered

    theirs = _mint("theirs")
    assert OperatorToken.verify(theirs).name == "theirs"
    assert OperatorToken.verify(mine).name == "mine"


def test_the_cache_forgets_a_token_after_its_ttl(scope: Any, tokens: Any) -> None:
    from crewlet.base.tokens import TOKEN_CACHE_TTL_S

    token = _mint("elsewhere")
    assert _get(token) == 200
    _delete_behind_the_apps_back("elsewhere")  # revoked by another process: no signal here
    tokens.clock.now += TOKEN_CACHE_TTL_S - 0.001
    assert _get(token) == 200  # still believed, within the TTL the docstring promises
    tokens.clock.now += 0.001
    assert _get(token) == 401
    assert len(tokens) == 0


def test_the_cache_is_bounded_oldest_first(scope: Any, tokens: Any) -> None:
    minted = [_mint(f"t{i}") for i in range(tokens.max_size + 2)]
    for token in minted:
        assert _get(token) == 200
    assert len(tokens) == tokens.max_size
    assert hashlib.sha256(minted[0].encode()).hexdigest() not in tokens
    assert hashlib.sha256(minted[-1].encode()).hexdigest() in tokens


def test_last_used_is_written_at_most_once_a_minute_not_per_request(scope: Any, tokens: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    token = _mint("busy")
    assert _get(token) == 200  # first use: looked up and touched
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert _get(token) == 200
    assert not [q for q in queries.captured_queries if "seats_operator_token" in q["sql"]]
    assert OperatorToken.objects.get(name="busy").last_used_at is not None
