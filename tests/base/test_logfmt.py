"""Structured logging: both formatters render a record's extra fields (crewlet.base.logfmt)."""
from __future__ import annotations

import json
import logging
from typing import Any

from crewlet.base.logfmt import JsonFormatter, KeyValueFormatter


def _record(**extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("crewlet.engine.core", logging.INFO, __file__, 1, "engine_started", (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_key_value_formatter_renders_extra_fields() -> None:
    line = KeyValueFormatter().format(_record(node="n1", broker_url="nats://127.0.0.1:4222", note="two words", n=3))
    assert " level=info logger=crewlet.engine.core event=engine_started node=n1 " in line
    assert 'broker_url=nats://127.0.0.1:4222 note="two words" n=3' in line
    assert "\n" not in line


def test_json_formatter_renders_extra_fields() -> None:
    data = json.loads(JsonFormatter().format(_record(node="n1", services=2)))
    assert data["event"] == "engine_started" and data["node"] == "n1" and data["services"] == 2


def test_a_record_emitted_inside_a_span_carries_its_trace_and_span_id_in_both_formats_redaction_kept() -> None:
    from crewlet.base.logfmt import RedactSecrets, TraceContext
    from crewlet.events.tracing import start_span

    outside = _record()
    assert TraceContext().filter(outside) and not hasattr(outside, "trace_id")
    with start_span("logged") as span:
        context = span.get_span_context()
        trace_id, span_id = format(context.trace_id, "032x"), format(context.span_id, "016x")
        records = [_record(api_token="s3cret-value-123"), _record(api_token="s3cret-value-123")]
        for record in records:
            assert TraceContext().filter(record) and RedactSecrets().filter(record)
    line = KeyValueFormatter().format(records[0])
    assert f"trace_id={trace_id} span_id={span_id}" in line and "s3cret" not in line
    data = json.loads(JsonFormatter().format(records[1]))
    assert (data["trace_id"], data["span_id"], data["api_token"]) == (trace_id, span_id, "[redacted]")


def test_a_record_naming_another_trace_keeps_it_and_gets_no_span_id_of_the_current_one() -> None:
    from crewlet.base.logfmt import TraceContext
    from crewlet.events.tracing import start_span

    with start_span("logged"):
        record = _record(trace_id="0af7651916cd43dd8448eb211c80319c")
        TraceContext().filter(record)
    assert record.trace_id == "0af7651916cd43dd8448eb211c80319c" and not hasattr(record, "span_id")
