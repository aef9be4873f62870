"""One record is one line in both log formats, whatever its fields hold, and neither format lets a credential through.

A provider's error is text the engine did not write: ``"overloaded\\nts=… level=critical …"``
must stay data inside its record's ``error`` field, never become a record of its own.
"""
from __future__ import annotations

import json
import logging
import sys
from typing import Any

import pytest

from crewlet.base.logfmt import JsonFormatter, KeyValueFormatter, RedactSecrets, kv_value

FORGED = "ts=2026-01-01T00:00:00.000+00:00 level=critical logger=crewlet.engine.core event=engine_compromised node=n1"
#: A provider error as the SDK hands it over: newlines, a NUL, a carriage return, a quote, and a key.
PROVIDER_ERROR = f'HTTP 500 from the OpenAI API: overloaded\n{FORGED}\r\n{FORGED}\x00 "quoted" sk-proj-Xf3aB9cD2eF7gH1iJ5kL8mN0p'
#: Characters that end or split a line for some reader: LF, CR, VT, FF, FS, GS, RS, NEL, LINE/PARAGRAPH SEPARATOR.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def _record(exc_info: Any = None, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("crewlet.seats.inbox", logging.WARNING, __file__, 1, "seat_delivery_failed", None, exc_info)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def _formats() -> list[logging.Formatter]:
    return [KeyValueFormatter(), JsonFormatter()]


@pytest.mark.parametrize("formatter", _formats(), ids=["kv", "json"])
def test_an_error_field_holding_newlines_and_a_nul_is_one_line_that_forges_no_record(formatter: logging.Formatter) -> None:
    line = formatter.format(_record(seat="ada", error=PROVIDER_ERROR))
    assert not any(c in line for c in LINE_BREAKS) and "\x00" not in line
    assert "sk-proj-Xf3aB9cD2eF7gH1iJ5kL8mN0p" not in line and "sk-[redacted]" in line
    if isinstance(formatter, JsonFormatter):
        data = json.loads(line)
        assert data["error"].startswith("HTTP 500") and "\nts=2026" in data["error"] and "\x00" in data["error"]
    else:
        assert line.startswith("ts=") and " level=warning " in line
        assert '\\nts=2026-01-01T00:00:00.000+00:00 level=critical' in line and "\\u0000" in line
        # The escaped value decodes back to the error, redacted: nothing was lost but the key.
        value = line.split(" error=", 1)[1]
        assert json.loads(value) == PROVIDER_ERROR.replace("sk-proj-Xf3aB9cD2eF7gH1iJ5kL8mN0p", "sk-[redacted]")


@pytest.mark.parametrize("formatter", _formats(), ids=["kv", "json"])
def test_a_traceback_is_an_escaped_field_of_its_record_and_a_records_own_error_is_kept_beside_it(
    formatter: logging.Formatter,
) -> None:
    try:
        raise RuntimeError(f"provider crashed:\n{FORGED}\nwith key xoxb-123456789012-1234567890123-AbCdEfGhIj")
    except RuntimeError:
        exc_info = sys.exc_info()
    line = formatter.format(_record(exc_info, error="RuntimeError: provider crashed"))
    assert not any(c in line for c in LINE_BREAKS)
    assert "xoxb-123456789012" not in line and "Traceback (most recent call last):" in line
    if isinstance(formatter, JsonFormatter):
        data = json.loads(line)
        assert data["error"] == "RuntimeError: provider crashed"
        assert data["traceback"].startswith("Traceback") and FORGED in data["traceback"]
    else:
        assert ' error="RuntimeError: provider crashed" traceback="Traceback (most recent call last):\\n' in line


def test_every_key_value_field_is_escaped_controls_separators_quotes_and_all_and_a_key_cannot_break_the_line() -> None:
    hostile = "a\x00b\x1bc\x7fd\x85e\u2028f\u202eg\ud800h \"i\" \\j=k"
    record = _record(**{"note": hostile, "bad key\n=x": 1, "plain": "café"})
    record.msg = "event\nwith a newline"
    line = KeyValueFormatter().format(record)
    assert not any(c in line for c in LINE_BREAKS + "\x00\x1b\x7f\u202e\ud800")
    assert ' event="event\\nwith a newline" ' in line
    assert ' note="a\\u0000b\\u001bc\\u007fd\\u0085e\\u2028f\\u202eg\\ud800h \\"i\\" \\\\j=k"' in line
    assert " bad_key__x=1 " in line and line.endswith('plain="café"')
    line.encode("utf-8")  # a lone surrogate would make the handler fail on the way out
    assert kv_value("") == '""' and kv_value("n1") == "n1" and kv_value(3) == "3" and kv_value(None) == "null"


def test_a_json_record_is_one_line_of_ascii_json_whatever_its_fields_hold() -> None:
    line = JsonFormatter().format(_record(note="a\x00b\u2028c\ud800d é", error=PROVIDER_ERROR))
    assert line.isascii() and "\n" not in line
    assert json.loads(line)["note"] == "a\x00b\u2028c\ud800d é"


@pytest.mark.parametrize("formatter", _formats(), ids=["kv", "json"])
def test_both_formats_redact_vendor_keys_and_credential_pairs_in_the_message_fields_and_traceback_without_the_filter(
    formatter: logging.Formatter,
) -> None:
    try:
        raise ValueError("refused password=hunter2-hunter2 for sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv")
    except ValueError:
        exc_info = sys.exc_info()
    record = _record(exc_info, reason="token=tok-5c1e9a2b rejected", settings={"slack": "xoxb-123456789012-1234567890123-AbCdEfGhIj"})
    record.msg = "model said Bearer opaque-bearer-value-51d2e8aa"
    line = formatter.format(record)  # no RedactSecrets on this path: the formatter is the last line of defence
    for secret in ("hunter2-hunter2", "AbCdEfGhIjKlMnOpQrStUv", "tok-5c1e9a2b", "xoxb-123456789012", "opaque-bearer-value"):
        assert secret not in line
    assert RedactSecrets().filter(record) and formatter.format(record) == line  # the filter first changes nothing
