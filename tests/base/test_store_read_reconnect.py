"""A thread that keeps its connections (the fleet reader's): one the database dropped is replaced, and the read asked once more."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connections, transaction

from crewlet.base.db import read_again_if_dropped

pytestmark = pytest.mark.django_db(transaction=True)


class Dropped:
    """A read whose first ``failures`` calls meet a connection the server closed."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, answer: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise OperationalError("server closed the connection unexpectedly")
        return answer


def test_a_read_that_meets_a_dropped_connection_is_answered_on_a_new_one() -> None:
    connections["default"].ensure_connection()
    read = Dropped(failures=1)
    assert read_again_if_dropped(read, "page") == "page"
    assert read.calls == 2
    assert connections["default"].connection is None  # closed; the next use connects afresh


def test_a_database_still_away_on_the_second_try_is_the_reads_failure() -> None:
    read = Dropped(failures=2)
    with pytest.raises(OperationalError):
        read_again_if_dropped(read, "page")
    assert read.calls == 2


def test_inside_a_transaction_the_failure_stands_at_once_and_the_connection_is_left_alone() -> None:
    read = Dropped(failures=1)
    with transaction.atomic():
        with pytest.raises(OperationalError):
            read_again_if_dropped(read, "page")
        assert connections["default"].connection is not None
    assert read.calls == 1


def test_any_other_error_is_not_retried() -> None:
    calls: list[Any] = []

    def refused() -> None:
        calls.append(1)
        raise ValueError("not a connection problem")

    with pytest.raises(ValueError):
        read_again_if_dropped(refused)
    assert len(calls) == 1
