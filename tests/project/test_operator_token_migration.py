"""Operator tokens moved from the seats app to the core in the migration state only: a database keeps its tokens."""
from __future__ import annotations

import hashlib
from typing import Any, Iterator

import pytest
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from crewlet.base.tokens import OperatorToken, VerifiedTokens

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

#: The migration state of a database migrated while the seats app owned the tokens.
BEFORE_THE_MOVE = [("seats", "0001_squashed_0002_delivery"), ("crewlet", "0001_initial")]
TOKEN = "crw_a-token-minted-before-the-move-0123456789"


def _executor() -> MigrationExecutor:
    return MigrationExecutor(connections["default"])


def _migrate_to_the_end() -> None:
    executor = _executor()
    executor.migrate(executor.loader.graph.leaf_nodes())
    ContentType.objects.clear_cache()


@pytest.fixture
def before_the_move() -> Iterator[Any]:
    """The ``default`` database as it was migrated before the move; the old state's apps. Migrated to the end after."""
    executor = _executor()
    executor.migrate(BEFORE_THE_MOVE)
    ContentType.objects.clear_cache()
    try:
        yield _executor().loader.project_state(BEFORE_THE_MOVE).apps
    finally:
        _migrate_to_the_end()


def test_a_token_stored_while_the_seats_app_owned_it_still_verifies_once_migrated_forward(before_the_move: Any) -> None:
    old_token = before_the_move.get_model("seats", "OperatorToken")
    old_token.objects.create(name="laptop", token_hash=hashlib.sha256(TOKEN.encode()).hexdigest())

    _migrate_to_the_end()

    row = OperatorToken.verify(TOKEN, VerifiedTokens())
    assert row is not None and row.name == "laptop"
    assert OperatorToken._meta.db_table == "seats_operator_token"
    assert OperatorToken.objects.filter(name="laptop").count() == 1


def test_a_staff_user_allowed_to_revoke_tokens_before_the_move_still_may_after_it(before_the_move: Any) -> None:
    from django.contrib.auth.models import Permission

    old_type = ContentType.objects.get(app_label="seats", model="operatortoken")
    user = get_user_model().objects.create_user("ops", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(content_type=old_type, codename="delete_operatortoken"))

    _migrate_to_the_end()

    assert get_user_model().objects.get(pk=user.pk).has_perm("crewlet.delete_operatortoken")
    assert not ContentType.objects.filter(app_label="seats", model="operatortoken").exists()
