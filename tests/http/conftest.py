"""The fixture every test of tests/http that runs ``up`` starts it with (a file may define its own)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from web_support import Up


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    """Start ``up`` with ``env`` as often as a test asks; each is stopped after the test."""
    started: list[Up] = []

    def start(**env: str) -> Up:
        up = Up(tmp_path / f"up{len(started)}", **env)
        up.tmp.mkdir()
        started.append(up)
        return up.start()

    yield start
    for up in started:
        up.stop()
