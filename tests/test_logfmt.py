"""Structured logging: both formatters render a record's extra fields (crewlet.logfmt)."""
from __future__ import annotations

import json
import logging
from typing import Any

from crewlet.logfmt import JsonFormatter, KeyValueFormatter


def _record(**extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("crewlet.engine", logging.INFO, __file__, 1, "engine_started", (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_key_value_formatter_renders_extra_fields() -> None:
    line = KeyValueFormatter().format(_record(node="n1", broker_url="nats://127.0.0.1:4222", note="two words", n=3))
    assert " level=info logger=crewlet.engine event=engine_started node=n1 " in line
    assert 'broker_url=nats://127.0.0.1:4222 note="two words" n=3' in line
    assert "\n" not in line


def test_json_formatter_renders_extra_fields() -> None:
    data = json.loads(JsonFormatter().format(_record(node="n1", services=2)))
    assert data["event"] == "engine_started" and data["node"] == "n1" and data["services"] == 2
