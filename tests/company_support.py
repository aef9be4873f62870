"""Helpers the company-file tests share: what a refused company file says."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from crewlet.company.fields import CompanyError


def one_line_refusal(read: Callable[[Any], Any], source: Any) -> str:
    """The message ``read(source)`` refuses the company file with: a :class:`CompanyError`, always one line."""
    with pytest.raises(CompanyError) as caught:
        read(source)
    text = str(caught.value)
    assert "\n" not in text
    return text
